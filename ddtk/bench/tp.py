"""``ddtk bench tp``: a tensor-parallel MLP block against the same MLP in one process.

    ddtk bench tp                              # 1 and 2 ranks, hidden 512 -> 2048 -> 512, 256 tokens
    ddtk bench tp -n 1,2,4 --hidden 1024 --tokens 512 --json build/bench/tp.json --plot build/bench/tp.png

Every rank builds the same single-process MLP (:func:`ddtk.parallel.tensor.dense_mlp`)
and its :class:`~ddtk.parallel.tensor.TensorParallelMLP` shard. A step is one
forward and one backward of a ``tokens x hidden`` batch whose input requires a
gradient, as for a block inside a network (so the input gradient is all-reduced).
Per world size the table shows:

* the median step time of the TP block (slowest rank) and of the dense MLP run by
  rank 0 alone, in the same processes, interleaved round by round; speedup is
  dense / TP,
* the bytes one rank sent in one step, from ``ctx.stats``, against
  :func:`~ddtk.parallel.tensor.tp_mlp_comm_bytes` (two ring all-reduces of
  ``tokens x hidden``); the ratio is 1.00 when ``tokens * hidden`` divides by
  the world size,
* the parameter bytes one rank holds against the unsharded MLP's.

The TP output is checked against the dense MLP outside the timed region. Each rank
uses one thread (gloo on CPU by default); on a machine with fewer cores than ranks
the ranks share cores and the speedup drops.
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


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _rank_bench(ctx: Any, hidden: int, ffn: int, tokens: int, steps: int, rounds: int) -> dict:
    """Runs in every rank: round times of both contenders, bytes per step, parameter bytes."""
    from ddtk.bench.timing import timed_across_ranks
    from ddtk.parallel.tensor import TensorParallelMLP, dense_mlp

    dense = dense_mlp(hidden, ffn, seed=0).to(ctx.device)
    tp = TensorParallelMLP.from_mlp(ctx, dense[0], dense[2])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=gen).to(ctx.device).requires_grad_(True)
    g = torch.randn(tokens, hidden, generator=gen).to(ctx.device)
    with torch.no_grad():
        max_err = float((tp(x) - dense(x)).abs().max())

    def step(model: nn.Module) -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        (model(x) * g).sum().backward()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    def run(model: nn.Module | None) -> None:
        for _ in range(steps):
            if model is not None:
                step(model)

    contenders = {"tp": tp, "dense": dense if ctx.rank == 0 else None}
    for model in contenders.values():  # warm-up: allocations, connections, autograd caches
        if model is not None:
            for _ in range(3):
                step(model)
    sent0 = ctx.stats.bytes_sent
    step(tp)
    sent = ctx.stats.bytes_sent - sent0
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders)[r % 2 :] + list(contenders)[: r % 2]
        for name in order:
            times[name].append(timed_across_ranks(lambda m=contenders[name]: run(m)))
    return {"times": times, "bytes_sent": sent, "param_bytes": _param_bytes(tp),
            "dense_param_bytes": _param_bytes(dense), "max_abs_err": max_err}  # fmt: skip


def measure(
    world_sizes: list[int],
    hidden: int = 512,
    ffn_hidden: int | None = None,
    tokens: int = 256,
    steps: int = 10,
    rounds: int = 5,
    backend: str = "gloo",
) -> list[dict]:
    """One row per world size: step times (TP and dense), bytes vs formula, parameter bytes."""
    import ddtk
    from ddtk.parallel.tensor import tp_mlp_comm_bytes

    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    rows: list[dict] = []
    for n in world_sizes:
        if ffn % n:
            raise ValueError(f"ffn_hidden={ffn} must be divisible by every world size, not by {n}")
        out = ddtk.launch(_rank_bench, n, args=(hidden, ffn, tokens, steps, rounds),
                          backend=backend, validate=False, timeout=1800, echo=False)  # fmt: skip
        first = out[0]
        tp_s, dense_s = (statistics.median(first["times"][k]) for k in ("tp", "dense"))
        sent = max(o["bytes_sent"] for o in out)
        formula = tp_mlp_comm_bytes(tokens, hidden, n, 4)
        rows.append({
            "world_size": n, "hidden": hidden, "ffn_hidden": ffn, "tokens": tokens,
            "tp_step_ms": 1e3 * tp_s / steps, "dense_step_ms": 1e3 * dense_s / steps,
            "speedup": dense_s / tp_s,
            "bytes_sent_per_step": sent, "bytes_sent_min": min(o["bytes_sent"] for o in out),
            "formula_bytes": formula, "bytes_ratio": sent / formula if formula else None,
            "param_bytes_per_rank": max(o["param_bytes"] for o in out),
            "dense_param_bytes": first["dense_param_bytes"],
            "param_ratio": max(o["param_bytes"] for o in out) / first["dense_param_bytes"],
            "max_abs_err": max(o["max_abs_err"] for o in out),
            "tp_rounds_s": first["times"]["tp"], "dense_rounds_s": first["times"]["dense"],
        })  # fmt: skip
    return rows


def table(rows: list[dict]):
    """A rich table of the rows."""
    from rich.table import Table

    from ddtk.bench.timing import format_bytes

    r0 = rows[0]
    t = Table(title=f"tensor-parallel MLP {r0['hidden']} -> {r0['ffn_hidden']} -> {r0['hidden']}, "
                    f"{r0['tokens']} tokens, forward + backward")  # fmt: skip
    cols = ("ranks", "TP step (ms)", "dense step (ms)", "speedup", "sent/rank/step", "formula",
            "ratio", "params/rank", "dense params", "ratio ", "max |err|")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        ratio = "-" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:.3f}"
        t.add_row(
            str(r["world_size"]), f"{r['tp_step_ms']:.2f}", f"{r['dense_step_ms']:.2f}",
            f"{r['speedup']:.2f}x", format_bytes(r["bytes_sent_per_step"]),
            format_bytes(r["formula_bytes"]), ratio, format_bytes(r["param_bytes_per_rank"]),
            format_bytes(r["dense_param_bytes"]), f"{r['param_ratio']:.3f}", f"{r['max_abs_err']:.1e}",
        )  # fmt: skip
    return t


def plot(rows: list[dict], path: str) -> None:
    """Step time against world size (TP and dense), and bytes sent per rank against the formula."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["world_size"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ns, [r["tp_step_ms"] for r in rows], marker="o", label="tensor parallel")
    a.plot(ns, [r["dense_step_ms"] for r in rows], "k:", marker="s", label="dense, one process")
    a.set(xlabel="ranks", ylabel="forward + backward (ms)", title="step time", xticks=ns)
    a.legend()
    b.plot(ns, [r["bytes_sent_per_step"] / 2**20 for r in rows], marker="o", label="measured")
    b.plot(
        ns,
        [r["formula_bytes"] / 2**20 for r in rows],
        "k:",
        label="4 (n-1)/n x tokens x hidden x 4 B",
    )
    b.set(xlabel="ranks", ylabel="MiB sent per rank per step", title="communication", xticks=ns)
    b.legend()
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench tp``."""
    p = subparsers.add_parser("tp", help="tensor-parallel MLP vs one process: step time, bytes, memory",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "-n", "--world-sizes", default="1,2", help="comma-separated world sizes (default 1,2)"
    )
    p.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    p.add_argument(
        "--ffn-hidden", type=int, default=None, help="MLP inner size (default 4 x hidden)"
    )
    p.add_argument("--tokens", type=int, default=256, help="tokens per step (default 256)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed round (default 10)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per contender (default 5)")
    p.add_argument(
        "--backend", default="gloo", choices=("gloo", "nccl", "auto"), help="default gloo"
    )
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of step time and bytes per rank")
    p.set_defaults(func=_run)


def _check_args(args: argparse.Namespace) -> list[int]:
    """The sorted world sizes; ValueError naming the first bad argument."""
    try:
        world_sizes = sorted({int(w) for w in args.world_sizes.split(",") if w.strip()})
    except ValueError:
        raise ValueError(
            f"--world-sizes needs comma-separated integers, got {args.world_sizes!r}"
        ) from None
    if not world_sizes or world_sizes[0] < 1:
        raise ValueError("--world-sizes needs positive integers")
    if min(args.hidden, args.tokens, args.steps, args.rounds) < 1:
        raise ValueError("--hidden, --tokens, --steps and --rounds must be positive")
    ffn = 4 * args.hidden if args.ffn_hidden is None else args.ffn_hidden
    bad = [n for n in world_sizes if ffn < 1 or ffn % n]
    if bad:
        raise ValueError(
            f"the MLP inner size {ffn} must be divisible by every world size (not by {bad[0]})"
        )
    return world_sizes


def _points(args: argparse.Namespace, world_sizes: list[int]) -> list[Point]:
    def at(n: int) -> Callable[[], list[dict]]:
        return lambda: measure([n], args.hidden, args.ffn_hidden, args.tokens, args.steps,
                               args.rounds, args.backend)  # fmt: skip

    return [Point(f"measuring {n} rank(s) ...", at(n)) for n in world_sizes]


def _header(args: argparse.Namespace, env: dict, _plan: Any) -> str:
    return (f"cores={env['cores']} backend={args.backend} torch={env['torch']} hidden={args.hidden} "
            f"tokens={args.tokens} steps/round={args.steps} rounds={args.rounds}")  # fmt: skip


def _record_backend(env: dict, args: argparse.Namespace, _plan: Any) -> None:
    if args.backend != "auto":
        env["backend"] = args.backend


SWEEP = Sweep(name="tp", plan=_check_args, header=_header, points=_points, table=table, plot=plot,
              width=140, environment=_record_backend)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    return run_sweep(SWEEP, args)
