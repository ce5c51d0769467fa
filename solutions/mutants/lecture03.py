"""Plausible wrong answers to lecture 03's judged exercise: each must fail its check.

Every mutant is the lecture's solution with some replacements in one answer cell:
``{exercise: {name: (cell id, [(old, new), ...])}}`` (see ``solutions/mutants/lab03.py``).
``ddtk course check --mutants`` and ``tests/test_judging_lectures.py`` prove that the
stub fails, the solution passes and every mutant fails, with the message saying why.
"""

CONFIG = "l03-ex1"

MUTANTS = {
    1: {
        "the notebook's micro-batch hard-coded": (
            CONFIG,
            [
                (
                    '"train_micro_batch_size_per_gpu": micro_batch,',
                    '"train_micro_batch_size_per_gpu": 4,',
                )
            ],
        ),
        "offloading with ZeRO stage 0": (
            CONFIG,
            [
                (
                    "for stage in (1, 2, 3) if offload else (0, 1, 2, 3):",
                    "for stage in (0, 1, 2, 3):",
                )
            ],
        ),
        "offloading never considered": (
            CONFIG,
            [("    for offload in (False, True):", "    for offload in (False,):")],
        ),
    },
}
