"""``ddtk bench zero``: memory per rank and step time of ZeRO stages 0, 1, 2 and FSDP2 (stage 3).

    ddtk bench zero                        # world sizes 1, 2, 3; digits MLP, Adam
    ddtk bench zero -n 2,4 --model cnn --steps 20 --json build/bench/zero.json --plot build/bench/zero.png

Every rank trains the same model from the same weights on its shard of digits
with Adam, once per contender, in the same processes:

* ``dp``: :class:`ddtk.parallel.zero.ZeroOptimizer` with ``stage=0`` (full
  optimizer state everywhere, gradients all-reduced: plain data parallelism),
* ``zero-1`` and ``zero-2``: the same with the optimizer state (stage 1) and
  the gradients too (stage 2) sharded,
* ``fsdp2``: PyTorch's ``fully_shard`` (parameters sharded as well), where
  :func:`ddtk.parallel.fsdp.fsdp_supported` says it runs.

For each it reports the bytes one rank holds (the largest over ranks) of
parameters, reduced gradients and optimizer state, measured from the tensors'
``nbytes`` (a DTensor counts its local shard), next to the ZeRO paper's fp32
formula (:func:`ddtk.parallel.zero.zero_memory_per_param` times the parameter
count) and their ratio; the step time (median over steps of the slowest rank;
fsdp2 steps are timed per rank, without a barrier); and the bytes one rank sent
per step as counted by ``ctx.stats`` next to the ring formula (dp: 2(n-1)/n of
the padded model, zero-1: 3(n-1)/n, zero-2: 2(n-1)/n, fsdp2: 3(n-1)/n). FSDP2
talks through ``torch.distributed`` directly, so its bytes are not counted.
Each rank runs one thread; world size and core count are recorded with the rows.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch

from ddtk.bench.report import save_figure
from ddtk.bench.runner import Point, Sweep, run_sweep

CONTENDERS = ("dp", "zero-1", "zero-2", "fsdp2")
_STAGE = {"dp": 0, "zero-1": 1, "zero-2": 2, "fsdp2": 3}
_COMM_FACTOR = {"dp": 2, "zero-1": 3, "zero-2": 2, "fsdp2": 3}  # times (n-1)/n of the model bytes


def _batches(ctx: Any, batch: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` local batches of ``batch`` digits from this rank's shard (repeated if short)."""
    from ddtk.data import DataPartitioner, load_dataset

    ds = load_dataset("digits")
    x, y = ds.subset(DataPartitioner(len(ds), ctx.world_size, "shuffled").get_indices(ctx.rank))
    reps = -(-batch * count // len(y))
    x, y = x.repeat(reps, 1, 1, 1), y.repeat(reps)
    return [(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(count)]


def _zero_contender(ctx: Any, stage: int, model_name: str, batches: list, lr: float) -> dict:
    """Train with ZeroOptimizer at ``stage``: first batch as warm-up, the rest timed step by step."""
    from ddtk.bench.timing import timed_across_ranks
    from ddtk.models import build_model
    from ddtk.parallel.zero import ZeroOptimizer

    model = build_model(model_name, seed=0)
    opt = ZeroOptimizer(ctx, model, torch.optim.Adam, stage=stage, lr=lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step(*batches[0])
    ctx.stats.reset()
    times = [timed_across_ranks(lambda b=b: step(*b)) for b in batches[1:]]
    return {
        "numel": opt.numel, "padded_numel": opt.padded_numel,
        "parameter_bytes": opt.parameter_bytes(), "gradient_bytes": opt.gradient_bytes(),
        "state_bytes": opt.state_bytes(), "step_s": statistics.median(times),
        "bytes_sent_per_step": ctx.stats.bytes_sent / len(times),
    }  # fmt: skip


def _fsdp_contender(ctx: Any, model_name: str, batches: list, lr: float) -> dict:
    """Train with FSDP2 on the same batches; the first step is the warm-up."""
    from ddtk.models import build_model, count_parameters
    from ddtk.parallel.fsdp import run_fsdp_peer

    model = build_model(model_name, seed=0)
    numel = count_parameters(model)
    run = run_fsdp_peer(ctx, model, batches, torch.optim.Adam, lr=lr)
    return {
        "numel": numel, "padded_numel": numel, "parameter_bytes": run.parameter_bytes,
        "gradient_bytes": run.gradient_bytes, "state_bytes": run.state_bytes,
        "step_s": statistics.median(run.step_seconds[1:]), "bytes_sent_per_step": None,
    }  # fmt: skip


def _rank_bench(
    ctx: Any, model_name: str, batch: int, steps: int, contenders: list[str], lr: float
) -> dict[str, dict]:
    """Runs in every rank: one measurement per contender."""
    torch.set_num_threads(1)
    batches = _batches(ctx, batch, steps + 1)
    out = {}
    for name in contenders:
        if name == "fsdp2":
            out[name] = _fsdp_contender(ctx, model_name, batches, lr)
        else:
            out[name] = _zero_contender(ctx, _STAGE[name], model_name, batches, lr)
    return out


def measure(
    world_sizes: list[int],
    model_name: str = "mlp",
    batch: int = 32,
    steps: int = 10,
    contenders: list[str] | None = None,
    lr: float = 1e-3,
) -> list[dict]:
    """One row per (world size, contender): measured bytes per rank, formula, ratio, step time, bytes sent."""
    import ddtk
    from ddtk.parallel.fsdp import fsdp_supported

    if contenders is None:
        contenders = [c for c in CONTENDERS if c != "fsdp2" or fsdp_supported("cpu")[0]]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        raise ValueError(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")
    rows: list[dict] = []
    for n in world_sizes:
        per_rank = ddtk.launch(_rank_bench, n, args=(model_name, batch, steps, contenders, lr),
                               validate=False, echo=False, timeout=1800)  # fmt: skip
        for name in contenders:
            rows.append(_row(n, name, [r[name] for r in per_rank]))
    return add_ratios(rows)


def _row(n: int, name: str, ranks: list[dict]) -> dict:
    """Combine the ranks' figures: memory of the fullest rank, time of the slowest, formulas alongside."""
    from ddtk.parallel.zero import zero_memory_per_param

    numel, padded = ranks[0]["numel"], ranks[0]["padded_numel"]
    per_param = zero_memory_per_param(_STAGE[name], n, mixed_precision=False)
    sent = [r["bytes_sent_per_step"] for r in ranks]
    row = {
        "world_size": n, "contender": name, "stage": _STAGE[name], "numel": numel,
        "parameter_bytes": max(r["parameter_bytes"] for r in ranks),
        "gradient_bytes": max(r["gradient_bytes"] for r in ranks),
        "state_bytes": max(r["state_bytes"] for r in ranks),
        "formula_parameter_bytes": per_param["parameters"] * numel,
        "formula_gradient_bytes": per_param["gradients"] * numel,
        "formula_state_bytes": per_param["optimizer_state"] * numel,
        "step_ms": 1e3 * max(r["step_s"] for r in ranks),
        "bytes_sent_per_step": None if None in sent else max(sent),
        "formula_bytes_sent_per_step": _COMM_FACTOR[name] * (n - 1) / n * padded * 4,
    }  # fmt: skip
    row["total_bytes"] = row["parameter_bytes"] + row["gradient_bytes"] + row["state_bytes"]
    row["formula_total_bytes"] = per_param["total"] * numel
    return row


def add_ratios(rows: list[dict]) -> list[dict]:
    """Add measured/formula ratios and ``state_vs_dp`` (state bytes over dp's at the same world size)."""
    dp = {r["world_size"]: r for r in rows if r["contender"] == "dp"}
    for r in rows:
        r["state_ratio"] = r["state_bytes"] / r["formula_state_bytes"]
        r["total_ratio"] = r["total_bytes"] / r["formula_total_bytes"]
        peer = dp.get(r["world_size"])
        r["state_vs_dp"] = r["state_bytes"] / peer["state_bytes"] if peer else None
        r["step_vs_dp"] = r["step_ms"] / peer["step_ms"] if peer else None
    return rows


def table(rows: list[dict]):
    """A rich table of the rows (KiB per rank)."""
    from rich.table import Table

    t = Table(
        title="ZeRO memory per rank (fp32 Adam, KiB; formula = paper's fp32 bytes/param x params)"
    )
    cols = ("ranks", "contender", "params", "grads", "opt state", "formula", "ratio",
            "state vs dp", "total", "formula", "step (ms)", "sent/step", "formula")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right")

    def kib(v: float | None) -> str:
        return "-" if v is None else f"{v / 1024:.1f}"

    for r in rows:
        t.add_row(
            str(r["world_size"]), r["contender"], kib(r["parameter_bytes"]), kib(r["gradient_bytes"]),
            kib(r["state_bytes"]), kib(r["formula_state_bytes"]), f"{r['state_ratio']:.3f}",
            "-" if r["state_vs_dp"] is None else f"{r['state_vs_dp']:.3f}",
            kib(r["total_bytes"]), kib(r["formula_total_bytes"]), f"{r['step_ms']:.2f}",
            kib(r["bytes_sent_per_step"]), kib(r["formula_bytes_sent_per_step"]),
        )  # fmt: skip
    return t


def plot(rows: list[dict], path: str) -> None:
    """Stacked bars of parameter, gradient and state bytes per rank, and step time, per world size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["world_size"] for r in rows})
    names = [c for c in CONTENDERS if any(r["contender"] == c for r in rows)]
    by = {(r["world_size"], r["contender"]): r for r in rows}
    width = 0.8 / len(names)
    fig, (mem, tim) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {
        "parameter_bytes": "tab:blue",
        "gradient_bytes": "tab:orange",
        "state_bytes": "tab:green",
    }
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(ns))]
        bottom = [0.0] * len(ns)
        for key, color in colors.items():
            vals = [by[(n, name)][key] / 1024 if (n, name) in by else 0.0 for n in ns]
            label = key.split("_")[0] if j == 0 else None
            mem.bar(xs, vals, width * 0.95, bottom=bottom, color=color, edgecolor="k", label=label)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        for x, top in zip(xs, bottom, strict=True):
            mem.text(x, top, name, ha="center", va="bottom", fontsize=7, rotation=90)
        tim.bar(xs, [by[(n, name)]["step_ms"] if (n, name) in by else 0.0 for n in ns],
                width * 0.95, label=name)  # fmt: skip
    for ax in (mem, tim):
        ax.set_xticks(range(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("ranks")
        ax.legend(fontsize=8)
    mem.set(ylabel="KiB per rank", title="memory per rank (fp32 Adam)")
    mem.margins(y=0.25)
    tim.set(ylabel="ms per step", title="step time (slowest rank)")
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench zero``."""
    p = subparsers.add_parser("zero", help="ZeRO stages 0/1/2 and FSDP2: memory per rank and step time",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "-n",
        "--world-sizes",
        default="1,2,3",
        help="comma-separated world sizes, <= 4 (default 1,2,3)",
    )
    p.add_argument(
        "--model", default="mlp", choices=("mlp", "cnn", "linear"), help="model (default mlp)"
    )
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per contender (default 10)")
    p.add_argument(
        "--contenders",
        default=None,
        help=f"comma-separated subset of {','.join(CONTENDERS)} (default: all that run here)",
    )
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG bar chart of memory per rank and step time"
    )
    p.set_defaults(func=_run)  # fmt: skip


def _parse(args: argparse.Namespace) -> tuple[list[int], list[str] | None]:
    """World sizes and contenders from the arguments; ValueError naming the problem."""
    try:
        world_sizes = sorted({int(w) for w in args.world_sizes.split(",") if w.strip()})
    except ValueError:
        raise ValueError(f"--world-sizes needs integers, got {args.world_sizes!r}") from None
    if not world_sizes or world_sizes[0] < 1 or world_sizes[-1] > 4:
        raise ValueError(f"--world-sizes needs integers from 1 to 4, got {args.world_sizes!r}")
    if min(args.batch, args.steps) < 1 or args.lr <= 0:
        raise ValueError("--batch, --steps and --lr must be positive")
    contenders = None
    if args.contenders is not None:
        contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
        unknown = [c for c in contenders if c not in CONTENDERS]
        if unknown or not contenders:
            raise ValueError(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")
        if "fsdp2" in contenders:
            from ddtk.parallel.fsdp import fsdp_supported

            ok, reason = fsdp_supported("cpu")
            if not ok:
                raise ValueError(f"fsdp2 cannot run here: {reason}")
    return world_sizes, contenders


def _points(args: argparse.Namespace, plan: tuple[list[int], list[str] | None]) -> list[Point]:
    world_sizes, contenders = plan

    def at(n: int) -> Callable[[], list[dict]]:
        return lambda: measure([n], args.model, args.batch, args.steps, contenders, args.lr)

    return [Point(f"measuring {n} rank(s) ...", at(n)) for n in world_sizes]


def _header(args: argparse.Namespace, env: dict, _plan: Any) -> str:
    return (f"cores={env['cores']} backend={env['backend']} torch={env['torch']} "
            f"model={args.model} batch/rank={args.batch} steps={args.steps}")  # fmt: skip


SWEEP = Sweep(name="zero", plan=_parse, header=_header, points=_points, table=table, plot=plot,
              width=160, after_point=add_ratios)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    return run_sweep(SWEEP, args)
