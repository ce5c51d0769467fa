"""Plausible wrong answers to lecture 01's judged exercise: each must fail its check.

Every mutant is the lecture's solution with some replacements in one answer cell:
``{exercise: {name: (cell id, [(old, new), ...])}}`` (see ``solutions/mutants/lab03.py``).
``ddtk course check --mutants`` and ``tests/test_judging_lectures.py`` prove that the
stub fails, the solution passes and every mutant fails, with the message saying why.
"""

CHOOSE = "70a5bfb7"

MUTANTS = {
    1: {
        "TP may cross nodes": (
            CHOOSE,
            [
                (
                    "tps = [t for t in range(1, gpus_per_node + 1)",
                    "tps = [t for t in range(1, gpus + 1)",
                )
            ],
        ),
        "pipeline stages tried before tensor parallelism": (
            CHOOSE,
            [
                (
                    "    for pp in pps:\n        for tp in tps:\n",
                    "    for tp in tps:\n        for pp in pps:\n",
                )
            ],
        ),
        "activations counted without recomputation": (
            CHOOSE,
            [("zero=zero, recompute=True)", "zero=zero, recompute=False)")],
        ),
    },
}
