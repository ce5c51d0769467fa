"""Print DESIGN.md's Numbers block, measured: one 2-rank check run plus the course's formulas.

    python design_numbers.py --mtbf-s 86400

Step time and checkpoint cost are the ranks' means from the run's metrics; the
intervals come from :mod:`ddtk.checkpoint.interval`, the memory from
:func:`ddtk.parallel.zero.zero_memory_per_param`, the speedups from scaling.json.
"""

from __future__ import annotations

import argparse
import json

from scaling import HERE, run_metrics

from ddtk.checkpoint.interval import daly_interval, young_interval
from ddtk.parallel.zero import zero_memory_per_param


def numbers(mtbf_s: float, ranks: int = 2) -> dict:
    """The Numbers block's values for a ``ranks``-rank run."""
    metrics = run_metrics(ranks)
    step = sum(m["step_seconds"] for m in metrics) / ranks
    ckpt = sum(m["checkpoint_seconds"] for m in metrics) / ranks
    params, stage = metrics[0]["parameters"], metrics[0]["zero_stage"]
    per_param = zero_memory_per_param(stage, ranks, mixed_precision=False)["total"]
    young, daly = young_interval(ckpt, mtbf_s), daly_interval(ckpt, mtbf_s)
    speedup = {
        e["ranks"]: e["speedup"] for e in json.loads((HERE / "scaling.json").read_text())["runs"]
    }
    return {
        "parameters": params, "world_size": ranks, "zero_stage": stage, "mixed_precision": False,
        "model_state_bytes_per_rank": int(params * per_param), "step_time_s": round(step, 5),
        "checkpoint_cost_s": round(ckpt, 5), "mtbf_s": mtbf_s, "young_interval_s": round(young, 2),
        "daly_interval_s": round(daly, 2), "checkpoint_every_steps": round(daly / step),
        "speedup_2": speedup[2], "speedup_4": speedup[4],
    }  # fmt: skip


def main() -> int:
    """Measure and print the block."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mtbf-s", type=float, default=86400.0)
    args = p.parse_args()
    for key, value in numbers(args.mtbf_s).items():
        print(f"{key}: {str(value).lower() if isinstance(value, bool) else value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
