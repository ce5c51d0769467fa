"""``ddtk bench dp``: data-parallel training throughput, ddtk DataParallel against torch DDP.

    ddtk bench dp                          # world sizes 1 and 2, digits CNN, 64 samples per rank per step
    ddtk bench dp -n 1,2,4 --steps 40 --json build/bench/dp.json --plot build/bench/dp.png

In every rank the three contenders train the same model from the same weights
on the same batches, in the same processes, interleaved round by round so that
machine noise hits them alike:

* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on the launch's backend,
* ``ddtk``: :class:`ddtk.parallel.data_parallel.DataParallel`, buckets launched from
  backward hooks (overlap),
* ``ddtk-no-overlap``: the same, every bucket reduced after backward ends.

A step is forward, backward with gradient averaging, and an SGD update; a round
is ``--steps`` steps, timed from a barrier to the slowest rank's end.
Throughput is ``world_size * batch * steps / median round time`` (weak scaling:
the per-rank batch is fixed). Scaling efficiency is throughput at n ranks over
n times the same contender's 1-rank throughput, when 1 is among the world sizes.
The ratio column is ddtk's throughput over DDP's. Each rank uses one thread; on
a machine with fewer cores than ranks the ranks share cores and efficiency
drops for every contender alike.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddtk.bench.report import save_figure
from ddtk.bench.runner import Point, Sweep, run_sweep

VARIANTS = ("ddp", "ddtk", "ddtk-no-overlap")
TARGET_VS_DDP = 1.5
"""DataParallel over shared memory against DDP on gloo, 2 ranks: throughput ratio to reach."""
TARGET_EFFICIENCY = 0.85
"""The same run's weak-scaling efficiency to reach: throughput at 2 ranks over twice 1 rank's."""


def _contenders(
    ctx: Any, model_name: str, bucket_mb: float, algorithm: str, lr: float
) -> dict[str, Any]:
    """Build the three trainers from identical weights; each maps (x, y) to one training step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddtk.models import build_model
    from ddtk.parallel.data_parallel import DataParallel

    ddp = DDP(build_model(model_name, seed=0), bucket_cap_mb=bucket_mb)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=lr)

    def ddp_step(x: torch.Tensor, y: torch.Tensor) -> None:
        ddp_opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        ddp_opt.step()

    steps = {"ddp": ddp_step}
    for name, overlap in (("ddtk", True), ("ddtk-no-overlap", False)):
        dp = DataParallel(
            ctx,
            build_model(model_name, seed=0),
            lr=lr,
            bucket_mb=bucket_mb,
            algorithm=algorithm,
            overlap=overlap,
        )
        steps[name] = dp.train_step
    return steps


def _rank_bench(
    ctx: Any, model_name: str, batch: int, steps: int, rounds: int, bucket_mb: float, algorithm: str
) -> dict:
    """Runs in every rank: per contender, the seconds of each timed round (slowest rank)."""
    from ddtk.bench.timing import timed_across_ranks
    from ddtk.data import DataPartitioner, load_dataset

    ds = load_dataset("digits")
    x, y = ds.subset(DataPartitioner(len(ds), ctx.world_size, "shuffled").get_indices(ctx.rank))
    reps = -(
        -batch * steps // len(y)
    )  # repeat the shard if one round needs more samples than it has
    x, y = x.repeat(reps, 1, 1, 1)[: batch * steps], y.repeat(reps)[: batch * steps]
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, batch * steps, batch)]
    contenders = _contenders(ctx, model_name, bucket_mb, algorithm, lr=0.05)

    def run(step_fn) -> None:
        for xb, yb in batches:
            step_fn(xb, yb)

    for fn in contenders.values():  # warm-up: allocations, gloo connections, autograd caches
        for xb, yb in batches[:3]:
            fn(xb, yb)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders)[r % len(contenders) :] + list(contenders)[: r % len(contenders)]
        for name in order:
            times[name].append(timed_across_ranks(lambda fn=contenders[name]: run(fn)))
    return times


def measure(
    world_sizes: list[int],
    model_name: str = "cnn",
    batch: int = 64,
    steps: int = 20,
    rounds: int = 5,
    bucket_mb: float = 25.0,
    algorithm: str = "ring",
) -> list[dict]:
    """One row per (world size, contender): samples/s, efficiency, ratio to DDP."""
    import ddtk

    rows: list[dict] = []
    for n in world_sizes:
        times = ddtk.launch(
            _rank_bench,
            n,
            args=(model_name, batch, steps, rounds, bucket_mb, algorithm),
            validate=False,
            timeout=1800,
        )[0]
        for name in VARIANTS:
            median = statistics.median(times[name])
            rows.append({
                "world_size": n, "contender": name, "round_median_s": median,
                "step_ms": 1e3 * median / steps, "samples_per_s": n * batch * steps / median,
                "rounds_s": times[name],
            })  # fmt: skip
    return add_ratios(rows)


def add_ratios(rows: list[dict]) -> list[dict]:
    """Add ``vs_ddp`` (throughput over DDP's at the same world size) and ``efficiency`` (over n x 1-rank)."""
    by = {(r["world_size"], r["contender"]): r for r in rows}
    for r in rows:
        peer = by.get((r["world_size"], "ddp"))
        r["vs_ddp"] = r["samples_per_s"] / peer["samples_per_s"] if peer else None
        one = by.get((1, r["contender"]))
        r["efficiency"] = (
            r["samples_per_s"] / (r["world_size"] * one["samples_per_s"]) if one else None
        )
    return rows


def table(rows: list[dict]):
    """A rich table of the rows."""
    from rich.table import Table

    t = Table(title="data-parallel training throughput (digits, weak scaling)")
    for col in ("ranks", "contender", "step (ms)", "samples/s", "efficiency", "vs DDP"):
        t.add_column(col, justify="right")
    for r in rows:
        eff = "-" if r["efficiency"] is None else f"{r['efficiency']:.2f}"
        t.add_row(
            str(r["world_size"]),
            r["contender"],
            f"{r['step_ms']:.2f}",
            f"{r['samples_per_s']:.0f}",
            eff,
            f"{r['vs_ddp']:.2f}x",
        )
    return t


def plot(rows: list[dict], path: str) -> None:
    """Samples/s against world size for each contender, with the ideal line from DDP's 1-rank figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in VARIANTS:
        pts = sorted((r["world_size"], r["samples_per_s"]) for r in rows if r["contender"] == name)
        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    one = [r["samples_per_s"] for r in rows if r["contender"] == "ddp" and r["world_size"] == 1]
    if one:
        ns = sorted({r["world_size"] for r in rows})
        ax.plot(ns, [n * one[0] for n in ns], "k:", label="ideal (n x 1-rank DDP)")
    ax.set(xlabel="ranks", ylabel="samples / s", title="DataParallel vs DDP")
    ax.legend()
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench dp``."""
    p = subparsers.add_parser("dp", help="DataParallel vs torch DDP: samples/s and scaling efficiency",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "-n", "--world-sizes", default="1,2", help="comma-separated world sizes (default 1,2)"
    )
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp"), help="model (default cnn)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed round (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per contender (default 5)")
    p.add_argument(
        "--bucket-mb", type=float, default=25.0, help="bucket cap for both, MB (default 25, DDP's)"
    )
    p.add_argument("--algorithm", default="ring", help="ddtk all-reduce for buckets (default ring)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of samples/s against world size")
    p.set_defaults(func=_run)


def _plan(args: argparse.Namespace) -> list[int]:
    world_sizes = sorted({int(w) for w in args.world_sizes.split(",") if w.strip()})
    if not world_sizes or world_sizes[0] < 1:
        raise ValueError("--world-sizes needs positive integers")
    if min(args.batch, args.steps, args.rounds) < 1 or args.bucket_mb <= 0:
        raise ValueError("--batch, --steps, --rounds and --bucket-mb must be positive")
    return world_sizes


def _points(args: argparse.Namespace, world_sizes: list[int]) -> list[Point]:
    def at(n: int) -> Callable[[], list[dict]]:
        return lambda: measure([n], args.model, args.batch, args.steps, args.rounds,
                               args.bucket_mb, args.algorithm)  # fmt: skip

    return [Point(f"measuring {n} rank(s) ...", at(n)) for n in world_sizes]


def _summary(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if r["contender"] == "ddtk" and r["world_size"] > 1:
            efficiency = "n/a" if r.get("efficiency") is None else f"{r['efficiency']:.2f}"
            lines.append(
                f"ddtk / DDP throughput at {r['world_size']} ranks: {r['vs_ddp']:.2f}x (target "
                f">= {TARGET_VS_DDP:.2f}x on shared memory, 2 ranks); weak-scaling efficiency "
                f"{efficiency} (target >= {TARGET_EFFICIENCY:.2f})"
            )
    return lines


SWEEP = Sweep(
    name="dp", plan=_plan, points=_points, table=table, plot=plot, after_point=add_ratios,
    summary=_summary,
    header=lambda args, env, _plan: (
        f"cores={env['cores']} backend={env['backend']} torch={env['torch']} model={args.model} "
        f"batch/rank={args.batch} steps/round={args.steps} rounds={args.rounds}"
    ),
)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    return run_sweep(SWEEP, args)
