"""Plausible wrong answers to lecture 02's judged exercises: each must fail its check.

Every mutant is the lecture's solution with some replacements in one answer cell:
``{exercise: {name: (cell id, [(old, new), ...])}}`` (see ``solutions/mutants/lab03.py``).
``ddtk course check --mutants`` and ``tests/test_judging_lectures.py`` prove that the
stub fails, the solution passes and every mutant fails, with the message saying why.
"""

ASHA, PBT, CONCURRENCY = "code-ex_asha", "code-ex_pbt", "code-ex_concurrency"

MUTANTS = {
    1: {
        "the last rung stops short of max_t": (
            ASHA,
            [("    while t <= max_t:", "    while t < max_t:")],
        ),
        "the median instead of the best 1/eta": (
            ASHA,
            [("np.percentile(recorded, 100 / reduction_factor)", "np.percentile(recorded, 50)")],
        ),
        "a loss exactly at the cut is stopped": (
            ASHA,
            [("    return loss <= float(np.percentile(", "    return loss < float(np.percentile(")],
        ),
        "the first result at a rung is stopped": (
            ASHA,
            [
                (
                    "    if not recorded:  # the first trial at a rung has nobody to lose against\n        return True",
                    "    if not recorded:  # the first trial at a rung has nobody to lose against\n        return False",
                )
            ],
        ),
    },
    2: {
        "the best trials exploit": (
            PBT,
            [
                (
                    "    ranked = sorted(losses, key=losses.get)  # best first",
                    "    ranked = sorted(losses, key=losses.get, reverse=True)",
                )
            ],
        ),
        "every exploiter clones the best trial": (
            PBT,
            [("        donor = rng.choice(top)", "        donor = top[0]")],
        ),
        "the notebook's factors hard-coded": (
            PBT,
            [("lrs[donor] * rng.choice(factors)", "lrs[donor] * rng.choice((0.8, 1.2))")],
        ),
        "no cap at half the population": (
            PBT,
            [
                (
                    "    k = min(math.ceil(len(ranked) * quantile_fraction), len(ranked) // 2)",
                    "    k = math.ceil(len(ranked) * quantile_fraction)",
                )
            ],
        ),
    },
    3: {
        "the cluster's resources pooled as if one node": (
            CONCURRENCY,
            [
                (
                    "    for node in nodes:\n        total += min(\n"
                    "            math.floor(node.get(name, 0) / amount) for name, amount in bundle.items() if amount > 0\n"
                    "        )\n",
                    "    pooled = {}\n    for node in nodes:\n        for name, value in node.items():\n"
                    "            pooled[name] = pooled.get(name, 0) + value\n"
                    "    total = min(\n"
                    "        math.floor(pooled.get(name, 0) / amount) for name, amount in bundle.items() if amount > 0\n"
                    "    )\n",
                )
            ],
        ),
        "only CPUs counted": (
            CONCURRENCY,
            [
                (
                    "for name, amount in bundle.items() if amount > 0",
                    'for name, amount in bundle.items() if name == "CPU"',
                )
            ],
        ),
        "max_concurrent_trials ignored": (
            CONCURRENCY,
            [
                (
                    "    return total if max_concurrent_trials is None else min(total, max_concurrent_trials)",
                    "    return total",
                )
            ],
        ),
    },
}
