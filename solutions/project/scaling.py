"""The scaling study and the thread-oversubscription profile, measured with the check configuration.

    python scaling.py                 # 1, 2 and 4 ranks -> scaling.json
    python scaling.py --threads-study # 2 ranks, 2 torch threads each vs 1 -> threads.json

Each point is the mean over ``--repeats`` runs of the ranks' mean throughput
(samples/s, the first step excluded), from ``torchrun --standalone`` runs of
train.py with project.yaml's check arguments. The machine's core count is saved
with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def run_metrics(ranks: int, extra: list[str] = ()) -> list[dict]:
    """Every rank's metrics from one check run on ``ranks`` ranks."""
    spec = yaml.safe_load((HERE / "project.yaml").read_text())
    steps = str(spec["check"]["steps"])
    with tempfile.TemporaryDirectory() as out:
        args = [a.replace("{out}", out).replace("{steps}", steps) for a in spec["check"]["args"]]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(ranks), spec["entry"], *args, *extra]  # fmt: skip
        subprocess.run(cmd, cwd=HERE, check=True, capture_output=True, timeout=300)
        return [
            json.loads((Path(out) / "metrics" / f"rank-{r}.json").read_text()) for r in range(ranks)
        ]


def measure(ranks: int, extra: list[str] = ()) -> float:
    """Mean throughput (samples/s) of the ranks of one check run on ``ranks`` ranks."""
    metrics = run_metrics(ranks, extra)
    return sum(m["throughput"] for m in metrics) / ranks


def mean_of(repeats: int, ranks: int, extra: list[str] = ()) -> float:
    """The mean of ``repeats`` measurements."""
    return sum(measure(ranks, extra) for _ in range(repeats)) / repeats


def scaling(repeats: int) -> dict:
    """Throughput, speedup and efficiency at 1, 2 and 4 ranks."""
    throughput = {n: mean_of(repeats, n) for n in (1, 2, 4)}
    runs = [
        {"ranks": n, "throughput": round(t, 2), "speedup": round(t / throughput[1], 4),
         "efficiency": round(t / throughput[1] / n, 4)}
        for n, t in throughput.items()
    ]  # fmt: skip
    return {"cpu_count": os.cpu_count(), "repeats": repeats, "unit": "samples/s", "runs": runs}


def threads(repeats: int) -> dict:
    """2 ranks with 2 torch threads each (oversubscribed on 2 cores) against 1 thread each."""
    out = {f"threads_{t}": round(mean_of(repeats, 2, ["--threads", str(t)]), 2) for t in (2, 1)}
    out["gain"] = round(out["threads_1"] / out["threads_2"], 3)
    return {"cpu_count": os.cpu_count(), "repeats": repeats, "ranks": 2, "unit": "samples/s", **out}


def main() -> int:
    """Run the study asked for and write its JSON next to this script."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads-study", action="store_true")
    args = p.parse_args()
    name, data = (
        ("threads.json", threads(args.repeats))
        if args.threads_study
        else ("scaling.json", scaling(args.repeats))
    )
    (HERE / name).write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
