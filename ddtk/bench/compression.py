"""``ddtk bench compression``: bytes on the wire against accuracy, per gradient compressor.

    ddtk bench compression                          # 2 ranks, 600 steps, MLP on digits (about a minute)
    ddtk bench compression -n 3 --steps 500 --compressors none,ef+topk:0.01,powersgd:2 \\
        --json build/bench/compression.json --plot build/bench/compression.png

Every compressor (a spec string of :func:`ddtk.compression.get_compressor`) trains
the same model from the same weights on the same batches with
:class:`~ddtk.parallel.data_parallel.DataParallel` (``compression=``), for the same
number of steps. The trainers run in the same processes, interleaved step by step,
so machine noise hits them alike. For each it reports:

* payload bytes per step (``Payload.nbytes`` summed over buckets, one rank) and the
  compression ratio: dense bytes / payload bytes;
* bytes the rank's transport really sent per step: an all-gather ring sends
  ``(n - 1)`` payloads, a ring all-reduce about ``2 (n - 1) / n`` of the message;
* accuracy on a held-out 20 % of digits, and its difference to ``none`` (dense) in
  percentage points;
* time per step (forward, backward with aggregation, SGD update): the median over
  steps of the slowest rank, and its ratio to dense.

Each rank uses one thread; world size and core count are recorded with the results.
On one machine the wire is memory, so fewer bytes rarely means a faster step here;
the byte counts are what carries over to a real network.
"""

from __future__ import annotations

import argparse
import functools
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ddtk.bench.report import save_figure, write_json

DEFAULT_COMPRESSORS = (
    "none,topk:0.01,ef+topk:0.01,randomk:0.1,qsgd:16,int8,ef+sign,powersgd:2,ef+powersgd:2"
)


def _shards(ctx: Any, seed: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """This rank's (x, y) of the digits training split and of the held-out split."""
    from ddtk.data import DataPartitioner, load_dataset, train_test_split

    train, test = train_test_split(load_dataset("digits"), test_fraction=0.2, seed=seed)
    parts = [
        ds.subset(DataPartitioner(len(ds), ctx.world_size, "shuffled", seed).get_indices(ctx.rank))
        for ds in (train, test)
    ]
    return parts[0], parts[1]


def _endless_batches(
    x: torch.Tensor, y: torch.Tensor, batch: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Full mini-batches, epoch after epoch, each epoch in a fresh seeded order."""
    from ddtk.parallel.trainer import batches

    if len(y) < batch:
        raise ValueError(f"a rank has {len(y)} training samples, fewer than one batch of {batch}")
    for epoch in itertools.count():
        yield from batches(x, y, batch, seed=seed + epoch, drop_last=True)


def _rank_bench(
    ctx: Any, specs: Sequence[str], steps: int, batch: int, lr: float, model: str, seed: int
) -> list[dict]:
    """Runs in every rank: train one DataParallel per spec, interleaved, then evaluate each."""
    from ddtk.bench.timing import summarize, timed_across_ranks
    from ddtk.compression import get_compressor
    from ddtk.models import build_model
    from ddtk.parallel.data_parallel import DataParallel

    (x, y), (x_test, y_test) = _shards(ctx, seed)
    trainers = {
        spec: DataParallel(
            ctx,
            build_model(model, seed=seed),
            lr=lr,
            batch_size=batch,
            seed=seed,
            compression=get_compressor(spec),
        )
        for spec in specs
    }
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    for xb, yb in itertools.islice(_endless_batches(x, y, batch, seed), steps):
        for spec, dp in trainers.items():
            times[spec].append(timed_across_ranks(functools.partial(dp.train_step, xb, yb)))
    rows = []
    for spec, dp in trainers.items():
        stats, ev = dp.compression.stats, dp.evaluate(x_test, y_test)
        dp.close()
        timing = summarize(times[spec])
        rows.append({
            "compressor": spec, "name": dp.compression.name, "world_size": ctx.world_size,
            "steps": steps, "accuracy": ev["accuracy"], "eval_loss": ev["loss"],
            "payload_bytes_per_step": stats.payload_bytes / steps,
            "dense_bytes_per_step": stats.dense_bytes / steps,
            "sent_bytes_per_step": stats.sent_bytes / steps, "ratio": stats.ratio,
            "step_ms": 1e3 * timing["time_median_s"], "step_p90_ms": 1e3 * timing["time_p90_s"],
        })  # fmt: skip
    return rows


def measure(
    compressors: Sequence[str] = tuple(DEFAULT_COMPRESSORS.split(",")),
    world_size: int = 2,
    steps: int = 600,
    batch: int = 32,
    lr: float = 0.1,
    model: str = "mlp",
    seed: int = 0,
    timeout: float = 1800.0,
) -> list[dict]:
    """One row per compressor spec; ``"none"`` (dense) is always measured, first, as the baseline."""
    import ddtk
    from ddtk.compression import get_compressor

    specs = ["none", *[s for s in compressors if s.strip().lower() != "none"]]
    for spec in specs:  # bad specs fail here, before any rank starts
        get_compressor(spec)
    if steps < 1 or batch < 1 or world_size < 1:
        raise ValueError("steps, batch and world_size must be >= 1")
    rows = ddtk.launch(
        _rank_bench, world_size, args=(specs, steps, batch, lr, model, seed),
        validate=False, timeout=timeout, echo=False,
    )[0]  # fmt: skip
    return add_baseline(rows)


def add_baseline(rows: list[dict]) -> list[dict]:
    """Add ``accuracy_delta_pp`` and ``time_vs_dense`` against the ``none`` row."""
    dense = next(r for r in rows if r["compressor"] == "none")
    for r in rows:
        r["accuracy_delta_pp"] = 100 * (r["accuracy"] - dense["accuracy"])
        r["time_vs_dense"] = r["step_ms"] / dense["step_ms"]
    return rows


def table(rows: list[dict], world_size: int, steps: int):
    """A rich table of the rows."""
    from rich.table import Table

    from ddtk.bench.timing import format_bytes

    t = Table(
        title=f"gradient compression, {world_size} ranks, {steps} steps (digits, held-out accuracy)"
    )
    for col in ("compressor", "payload/step", "ratio", "sent/step", "accuracy", "Δ vs dense",
                "step ms", "vs dense"):  # fmt: skip
        t.add_column(col, justify="left" if col == "compressor" else "right")
    for r in rows:
        d = r["accuracy_delta_pp"]
        style = "green" if d >= -1.0 else "yellow" if d >= -5.0 else "red"
        t.add_row(
            r["compressor"], format_bytes(r["payload_bytes_per_step"]), f"{r['ratio']:.1f}x",
            format_bytes(r["sent_bytes_per_step"]), f"{100 * r['accuracy']:.2f} %",
            f"[{style}]{d:+.2f} pp[/{style}]", f"{r['step_ms']:.2f}", f"{r['time_vs_dense']:.2f}x",
        )  # fmt: skip
    return t


def plot(rows: list[dict], path: str) -> None:
    """Held-out accuracy against compression ratio (log scale), one labelled point per compressor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in rows:
        ax.scatter(
            r["ratio"], 100 * r["accuracy"], color="black" if r["compressor"] == "none" else None
        )
        ax.annotate(r["compressor"], (r["ratio"], 100 * r["accuracy"]), fontsize=8,
                    xytext=(4, 3), textcoords="offset points")  # fmt: skip
    dense = next(r for r in rows if r["compressor"] == "none")
    ax.axhline(100 * dense["accuracy"], color="black", linestyle=":", label="dense")
    ax.axhline(100 * dense["accuracy"] - 1, color="grey", linestyle=":", label="dense - 1 pp")
    ax.set_xscale("log")
    ax.set(xlabel="compression ratio (dense bytes / payload bytes)", ylabel="held-out accuracy (%)",
           title=f"compression vs accuracy, {dense['world_size']} ranks, {dense['steps']} steps")  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench compression``."""
    p = subparsers.add_parser("compression", help="gradient compressors: bytes per step, accuracy and step time",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("-n", "--world-size", type=int, default=2, help="ranks (default 2)")
    p.add_argument(
        "--steps", type=int, default=600, help="training steps per compressor (default 600)"
    )
    p.add_argument("--compressors", default=DEFAULT_COMPRESSORS,
                   help=f"comma-separated specs, 'none' always included (default {DEFAULT_COMPRESSORS})")  # fmt: skip
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"), help="model (default mlp)")
    p.add_argument("--seed", type=int, default=0, help="weights, data split and order (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG of accuracy against compression ratio"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``ddtk bench compression`` command: measure, print, save."""
    from ddtk.bench.collectives import environment
    from ddtk.bench.report import console

    specs = [s.strip() for s in args.compressors.split(",") if s.strip()]
    env = environment()
    console.print(f"[bold]ddtk bench compression[/bold]  cores={env['cores']} backend={env['backend']} "
                  f"torch={env['torch']} ranks={args.world_size} model={args.model} "
                  f"batch/rank={args.batch} steps={args.steps} lr={args.lr}")  # fmt: skip
    try:
        with console.status(
            f"training {len(specs)} compressor(s) on {args.world_size} rank(s) ..."
        ):
            rows = measure(
                specs, args.world_size, args.steps, args.batch, args.lr, args.model, args.seed
            )
    except ValueError as exc:
        console.print(f"ddtk bench compression: {exc}")
        return 2
    console.print(table(rows, args.world_size, args.steps))
    for r in rows:
        if r["compressor"].startswith("ef+topk"):
            console.print(f"{r['compressor']}: {r['ratio']:.1f}x fewer bytes, accuracy "
                          f"{r['accuracy_delta_pp']:+.2f} pp vs dense (target: within 1 pp)")  # fmt: skip
    if args.json:
        write_json(args.json, env, args, rows)
    if args.plot:
        plot(rows, args.plot)
    return 0
