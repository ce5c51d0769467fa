"""Plausible wrong answers to lab 04's judged exercises: each must fail its check.

Every mutant is the solution with some replacements in one answer cell: ``{exercise:
{name: (cell id, [(old, new), ...])}}``. An ``old`` text that is no longer in the
solution makes the mutant matrix fail, so the mutants follow the solution when it
changes. ``ddtk course check --mutants`` (and ``tests/test_judging_lab04.py``) prove
that the stub fails, the solution passes and every mutant fails, with the message
saying why.
"""

PROFILE, STEPS, EVIDENCE, NAMES, FIX, OPTIMISE = (
    "75451cf2", "4a51ad7b", "1f2ce6b5", "98d73259", "65d95908", "d0705fc0",
)  # fmt: skip

MUTANTS = {
    1: {
        "no record_shapes: the all-reduces carry no message size": (
            PROFILE,
            [("        record_shapes=True,\n", "")],
        ),
        "only rank 0 writes its trace": (
            PROFILE,
            [
                (
                    '        prof.export_chrome_trace(str(Path(trace_dir) / f"rank{ctx.rank}.json"))\n',
                    "        if ctx.rank == 0:\n"
                    '            prof.export_chrome_trace(str(Path(trace_dir) / f"rank{ctx.rank}.json"))\n',
                ),
            ],
        ),
        "no warm-up step in the schedule": (
            PROFILE,
            [
                (
                    "schedule(wait=1, warmup=1, active=3, repeat=1)",
                    "schedule(wait=1, warmup=0, active=3, repeat=1)",
                )
            ],
        ),
        "the model without its DDP wrapper: no all-reduce": (
            PROFILE,
            [
                (
                    "F.cross_entropy(model(x), y).backward()",
                    "F.cross_entropy(model.module(x), y).backward()",
                )
            ],
        ),
    },
    2: {
        "all time in flight counted as communication": (
            STEPS,
            [("    exposed = subtract(comm, useful)\n", "    exposed = comm\n")],
        ),
        "data outside the step is counted": (
            STEPS,
            [("    data = clip(ln.data, lo, hi)\n", "    data = list(ln.data)\n")],
        ),
        "compute keeps the optimizer's time": (
            STEPS,
            [
                (
                    "    compute = subtract(clip(ln.compute, lo, hi), union(data + optimizer))\n",
                    "    compute = subtract(clip(ln.compute, lo, hi), data)\n",
                ),
            ],
        ),
        "overlap as a fraction of the step": (
            STEPS,
            [
                (
                    '"overlap": length(intersect(comm, useful)) / in_flight if in_flight else 0.0',
                    '"overlap": length(intersect(comm, useful)) / (hi - lo) if in_flight else 0.0',
                ),
            ],
        ),
    },
    3: {
        "mean busy time instead of the median": (
            EVIDENCE,
            [
                (
                    "busy = {r: statistics.median(row.busy_ms for row in bd.of_rank(r)) for r in bd.ranks}",
                    "busy = {r: statistics.fmean(row.busy_ms for row in bd.of_rank(r)) for r in bd.ranks}",
                ),
            ],
        ),
        "ratio against the mean of the others": (
            EVIDENCE,
            [
                (
                    "others = statistics.median(v for r, v in busy.items() if r != slowest)",
                    "others = statistics.fmean(v for r, v in busy.items() if r != slowest)",
                ),
            ],
        ),
        "input share as the mean of each step's share": (
            EVIDENCE,
            [
                (
                    '"input": {"share": sum(r.data_ms for r in rows) / sum(r.step_ms for r in rows)}',
                    '"input": {"share": statistics.fmean(r.data_ms / r.step_ms for r in rows)}',
                ),
            ],
        ),
        "bytes per step instead of per collective": (
            EVIDENCE,
            [
                (
                    '"bytes": sum(r.comm_bytes for r in rows) / collectives if collectives else 0.0',
                    '"bytes": sum(r.comm_bytes for r in rows) / len(rows)',
                ),
            ],
        ),
    },
    4: {
        "strictly above the thresholds": (
            NAMES,
            [
                (
                    'if e["straggler"]["ratio"] >= RULES["straggler_ratio"]:',
                    'if e["straggler"]["ratio"] > RULES["straggler_ratio"]:',
                ),
                (
                    'if e["input"]["share"] >= RULES["input_share"]:',
                    'if e["input"]["share"] > RULES["input_share"]:',
                ),
                (
                    'if e["precision"]["fp32_share"] >= RULES["fp32_share"]:',
                    'if e["precision"]["fp32_share"] > RULES["fp32_share"]:',
                ),
            ],
        ),
        "only the first bottleneck found": (
            NAMES,
            [("    return found\n", "    return dict(list(found.items())[:1])\n")],
        ),
        "the lab's thresholds written into the code": (
            NAMES,
            [
                ('RULES["straggler_ratio"]:', "1.25:"),
                ('RULES["input_share"]:', "0.15:"),
                (
                    'RULES["min_messages"] and 0 < m["bytes"] < RULES["small_bytes"]:',
                    '6 and 0 < m["bytes"] < 1 << 20:',
                ),
                ('RULES["fp32_share"]:', "0.5:"),
            ],
        ),
        "a sentence without its number": (
            NAMES,
            [
                (
                    "found[\"input\"] = f\"data loading is {e['input']['share']:.0%} of the step\"",
                    'found["input"] = "data loading is a large share of the step"',
                ),
            ],
        ),
    },
    5: {
        "two workers whatever the job": (
            FIX,
            [
                (
                    '"input": {"num_workers": workers, "prefetch_factor": 2}',
                    '"input": {"num_workers": 2, "prefetch_factor": 2}',
                )
            ],
        ),
        "workers for 100 ms steps whatever step_ms says": (
            FIX,
            [
                (
                    "workers = math.ceil(cfg.data_ms / step_ms) + 1",
                    "workers = math.ceil(cfg.data_ms / 100.0) + 1",
                )
            ],
        ),
        "sixteen workers, to be safe": (
            FIX,
            [
                (
                    '"input": {"num_workers": workers, "prefetch_factor": 2}',
                    '"input": {"num_workers": 16, "prefetch_factor": 2}',
                )
            ],
        ),
        "accumulation dropped instead of no_sync": (
            FIX,
            [
                (
                    '"sync-per-microbatch": {"no_sync": True}',
                    '"sync-per-microbatch": {"micro_batches": 1}',
                )
            ],
        ),
        "an unknown kind changes nothing": (
            FIX,
            [
                (
                    "    if kind not in changes:\n",
                    "    if kind not in changes:\n        return cfg\n",
                ),
            ],
        ),
    },
    6: {
        "compared with the previous measurement, not the best": (
            OPTIMISE,
            [
                (
                    '        if row["kept"]:\n            current, best = fix(current, kind), row\n',
                    '        if row["kept"]:\n            current = fix(current, kind)\n        best = row\n',
                ),
            ],
        ),
        "any gain is kept (no noise floor)": (
            OPTIMISE,
            [
                (
                    'row["samples_per_s"] > best["samples_per_s"] * (1 + min_gain)',
                    'row["samples_per_s"] > best["samples_per_s"]',
                ),
            ],
        ),
        "a noise floor of 5 % written into the code": (
            OPTIMISE,
            [("* (1 + min_gain)", "* (1 + 0.05)")],
        ),
        "each fix tried on the start, not on the kept ones": (
            OPTIMISE,
            [("row = measure(fix(current, kind), kind)", "row = measure(fix(start, kind), kind)")],
        ),
    },
}
