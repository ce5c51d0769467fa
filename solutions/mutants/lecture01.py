"""Plausible wrong answers to lecture 01's judged exercises: each must fail its check.

Every mutant is the lecture's solution with some replacements in one answer cell:
``{exercise: {name: (cell id, [(old, new), ...])}}`` (see ``solutions/mutants/lab03.py``).
``ddtk course check --mutants`` and ``tests/test_judging_lectures.py`` prove that the
stub fails, the solution passes and every mutant fails, with the message saying why.
"""

CHOOSE = "70a5bfb7"
SIZE = "l01-size"

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
    2: {
        "2·N·D, the forward pass only": (
            SIZE,
            [("flops = 6 * params * tokens", "flops = 2 * params * tokens")],
        ),
        "MFU multiplies the time instead of dividing it": (
            SIZE,
            [
                (
                    "flops / (peak_tflops * 1e12 * mfu) / 3600",
                    "flops * mfu / (peak_tflops * 1e12) / 3600",
                )
            ],
        ),
        "GPU-seconds taken for GPU-hours": (
            SIZE,
            [("flops / (peak_tflops * 1e12 * mfu) / 3600", "flops / (peak_tflops * 1e12 * mfu)")],
        ),
        "days not spread over the GPUs": (SIZE, [("gpu_hours / gpus / 24", "gpu_hours / 24")]),
        "an MFU of 40 taken for 40%": (SIZE, [("not 0 < mfu <= 1", "not 0 < mfu <= 100")]),
    },
}
