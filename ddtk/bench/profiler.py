"""``ddtk bench profiler``: what profiling costs, measured on the example jobs.

For each job (:mod:`ddtk.profiling.jobs`) and round:

* **torch.profiler**: one run profiles a window of steps, then keeps training with
  the profiler stopped; the ratio is the median profiled step over the unprofiled
  step time *of the same processes*. With ``record_shapes`` on (what ddtk uses, for
  message sizes and dtypes) and off.
* **py-spy**: the same job run plainly and under ``py-spy record --subprocesses``
  (sampling every rank from outside, 100 Hz); the ratio is the plain run's
  samples/s over the sampled run's.

A ratio of 1.30 means steps take 30% longer while being profiled. Many small
operators cost more than few large ones (the profiler pays per event), so the
``slow`` job, with its small buckets and micro-batches, is the expensive case.

    ddtk bench profiler --jobs baseline,slow -n 2 --rounds 2 --json build/bench/profiler.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench profiler``."""
    p = subparsers.add_parser("profiler", help="torch.profiler and py-spy overhead on the example jobs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--jobs", default="baseline,slow", help="comma-separated job names (default baseline,slow)"
    )
    p.add_argument("-n", "--world-size", type=int, default=2, help="ranks (default 2)")
    p.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds; the median counts (default 2)"
    )
    p.add_argument("--no-py-spy", action="store_true", help="skip the py-spy rows")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG bar chart of the overhead ratios")
    p.set_defaults(func=_run)


def _torch_profiler(job: str, world: int, shapes: bool) -> float:
    from ddtk.profiling.jobs import job_config, run_job

    cfg = job_config(job).replace(record_shapes=shapes, timed_steps=8)
    with tempfile.TemporaryDirectory() as d:
        r = run_job(cfg, world, d)
    return r.profiled_step_ms / r.step_ms


def _samples_per_s(cmd: list[str]) -> float:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ)
    for line in done.stdout.splitlines():
        if "samples/s" in line:
            return float(line.split(":")[1].split()[0])
    raise RuntimeError(f"no samples/s in the job's output:\n{(done.stdout + done.stderr)[-1500:]}")


def _py_spy(job: str, world: int) -> float:
    from ddtk.profiling.pyspy import _py_spy

    cmd = [sys.executable, "-m", "ddtk.profiling.jobs", job, "-n", str(world)]
    plain = _samples_per_s(cmd)
    with tempfile.TemporaryDirectory() as d:
        spy = [
            _py_spy(),
            "record",
            "--subprocesses",
            "-r",
            "100",
            "-o",
            f"{d}/p.txt",
            "-f",
            "raw",
            "--",
        ]
        sampled = _samples_per_s(spy + cmd)
    return plain / sampled


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ddtk.bench.collectives import environment
    from ddtk.profiling.jobs import JOBS

    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = [j for j in jobs if j not in JOBS]
    if bad or not jobs or args.world_size < 1 or args.rounds < 1:
        print(f"ddtk bench profiler: jobs must be among {', '.join(JOBS)} (got {args.jobs!r}), "
              "--world-size and --rounds >= 1")  # fmt: skip
        return 2
    tools = {"torch.profiler, shapes": lambda j: _torch_profiler(j, args.world_size, True),
             "torch.profiler, no shapes": lambda j: _torch_profiler(j, args.world_size, False)}  # fmt: skip
    if not args.no_py_spy:
        tools["py-spy --subprocesses 100 Hz"] = lambda j: _py_spy(j, args.world_size)
    samples: dict[tuple[str, str], list[float]] = {(j, t): [] for j in jobs for t in tools}
    console = Console()
    t0 = time.monotonic()
    for r in range(args.rounds):
        for j in jobs:
            for t, fn in tools.items():
                console.print(f"round {r + 1}/{args.rounds}: {j}, {t} ...", style="dim")
                samples[(j, t)].append(fn(j))
    rows = [{"job": j, "tool": t, "overhead_ratio": statistics.median(v), "samples": v}
            for (j, t), v in samples.items()]  # fmt: skip
    table = Table(
        title=f"profiler overhead, {args.world_size} ranks (step time profiled / unprofiled)"
    )
    for c in ("job", "tool", "ratio", "rounds"):
        table.add_column(c, justify="left" if c in ("job", "tool") else "right")
    for row in rows:
        table.add_row(row["job"], row["tool"], f"{row['overhead_ratio']:.2f}",
                      " ".join(f"{v:.2f}" for v in row["samples"]))  # fmt: skip
    console.print(table)
    console.print(f"{time.monotonic() - t0:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        env = {**environment(), "world_size": args.world_size, "cores": os.cpu_count()}
        Path(args.json).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [f"{r['job']}\n{r['tool']}" for r in rows]
    ax.barh(labels, [r["overhead_ratio"] for r in rows], color="#4C72B0")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("step time profiled / unprofiled")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
