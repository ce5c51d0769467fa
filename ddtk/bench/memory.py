"""``ddtk bench memory``: the memory calculator against measurement, and activation checkpointing.

    ddtk bench memory                                   # small models, checkpointing every 1, 2, 4 of 8 blocks
    ddtk bench memory --layers 8 --hidden 128 --seq-len 128 --batch 8 --json build/bench/memory.json --plot build/bench/memory.png

Part 1 builds the small models of :mod:`ddtk.models` (a TinyTransformer of the
given shape, the digits MLP and CNN), runs one forward, backward and Adam step,
and compares what :mod:`ddtk.memory.calculator` predicts with what is measured:
parameter and gradient bytes (summed tensors), Adam state bytes (the
optimiser's ``exp_avg`` and ``exp_avg_sq``) and activation bytes (distinct
storages saved for backward, :func:`ddtk.memory.measure.saved_activation_bytes`).
The ratio column is measured over predicted. The CNN has no activation formula
and shows ``-`` there.

Part 2 runs the TinyTransformer with its blocks checkpointed every ``k`` blocks
(``torch.utils.checkpoint``, non-reentrant) for each ``k`` of ``--every``, and
reports the bytes a forward leaves alive for backward, the peak of forward +
backward (CPU allocator events through the profiler) and the median step time,
each over the same figure without checkpointing. One thread.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch.nn import functional as F

from ddtk.bench.report import save_figure, write_json
from ddtk.memory import activation_checkpointing as ac
from ddtk.memory import calculator as calc
from ddtk.memory.measure import optimizer_state_bytes, saved_activation_bytes, tensor_bytes


def _measure_model(model: torch.nn.Module, loss_fn: Any) -> dict[str, int]:
    """Measured bytes of parameters, gradients, Adam state and saved activations for one step."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = None

    def forward() -> torch.Tensor:
        nonlocal loss
        loss = loss_fn(model)
        return loss

    acts = saved_activation_bytes(forward, exclude=model.parameters())
    loss.backward()
    opt.step()
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "params_bytes": tensor_bytes(model.parameters()),
        "grads_bytes": tensor_bytes(p.grad for p in model.parameters()),
        "optimizer_bytes": optimizer_state_bytes(opt),
        "activation_bytes": acts,
    }


def calculator_rows(
    layers: int = 4, hidden: int = 64, heads: int = 4, seq_len: int = 64, batch: int = 8,
    vocab: int = 128, seed: int = 0,
) -> list[dict]:  # fmt: skip
    """One row per (model, quantity): predicted and measured bytes and their ratio."""
    from ddtk.models import TinyTransformer, build_model

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    rows: list[dict] = []

    def add(model_name: str, predicted: dict[str, int | None], measured: dict[str, int]) -> None:
        for key in (
            "parameters",
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "activation_bytes",
        ):
            p = predicted.get(key)
            rows.append({"model": model_name, "quantity": key, "predicted": p, "measured": measured[key],
                         "ratio": measured[key] / p if p else None})  # fmt: skip

    cfg = calc.TransformerConfig(layers=layers, hidden=hidden, heads=heads, seq_len=seq_len,
                                 micro_batch=batch, vocab=vocab)  # fmt: skip
    tf = TinyTransformer(vocab, seq_len, hidden, heads, layers)
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=g)
    targets = torch.randint(0, vocab, (batch, seq_len), generator=g)
    est = calc.estimate(cfg)
    add(
        f"gpt L{layers} h{hidden} s{seq_len} b{batch}",
        {
            "parameters": cfg.parameters,
            "params_bytes": est.params_bytes,
            "grads_bytes": est.grads_bytes,
            "optimizer_bytes": est.optimizer_bytes,
            "activation_bytes": est.activation_bytes,
        },
        _measure_model(
            tf, lambda m: F.cross_entropy(m(tokens).reshape(-1, vocab), targets.reshape(-1))
        ),
    )
    x = torch.rand(batch, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    for name in ("mlp", "cnn"):
        n = (calc.mlp_parameter_count(64, (64, 32), 10) if name == "mlp"
             else calc.cnn_parameter_count())  # fmt: skip
        acts = calc.mlp_activation_bytes(batch, 64, (64, 32), 10) if name == "mlp" else None
        predicted = {"parameters": n, "params_bytes": 4 * n, "grads_bytes": 4 * n,
                     "optimizer_bytes": 8 * n, "activation_bytes": acts}  # fmt: skip
        add(f"{name} b{batch}", predicted, _measure_model(build_model(name, seed=seed),
                                                          lambda m: F.cross_entropy(m(x), y)))  # fmt: skip
    return rows


def measure(
    layers: int = 8, hidden: int = 64, heads: int = 4, seq_len: int = 64, batch: int = 8,
    vocab: int = 128, everies: tuple[int, ...] = (1, 2, 4), repeats: int = 5,
) -> list[dict]:  # fmt: skip
    """Both parts: calculator rows (``part="calculator"``) and checkpointing rows (``part="checkpointing"``)."""
    torch.set_num_threads(1)
    rows = [{"part": "calculator", **r} for r in
            calculator_rows(layers, hidden, heads, seq_len, batch, vocab)]  # fmt: skip
    sweep = ac.sweep((0, *[k for k in everies if k != 0]), layers=layers, hidden=hidden,
                     heads=heads, seq_len=seq_len, batch=batch, vocab=vocab, repeats=repeats)  # fmt: skip
    return rows + [{"part": "checkpointing", **r} for r in sweep]


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def tables(rows: list[dict]) -> tuple[Any, Any]:
    """Rich tables of both parts."""
    from rich.table import Table

    t1 = Table(title="memory calculator vs measured (fp32, Adam)")
    for col in ("model", "quantity", "predicted", "measured", "measured / predicted"):
        t1.add_column(col, justify="left" if col in ("model", "quantity") else "right")
    for r in rows:
        if r["part"] != "calculator":
            continue
        f = (
            (lambda v: "-" if v is None else f"{v:,}")
            if r["quantity"] == "parameters"
            else _fmt_bytes
        )
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.4f}"
        t1.add_row(r["model"], r["quantity"], f(r["predicted"]), f(r["measured"]), ratio)
    t2 = Table(title="activation checkpointing every k blocks (k = 0: none)")
    for col in ("k", "kept for backward", "ratio", "peak fwd+bwd", "ratio", "step ms", "ratio"):
        t2.add_column(col, justify="right")
    for r in rows:
        if r["part"] != "checkpointing":
            continue
        t2.add_row(str(r["every"]), _fmt_bytes(r["retained_bytes"]), f"{r['retained_bytes_ratio']:.3f}",
                   _fmt_bytes(r["peak_bytes"]), f"{r['peak_bytes_ratio']:.3f}",
                   f"{1e3 * r['step_s']:.2f}", f"{r['step_s_ratio']:.2f}x")  # fmt: skip
    return t1, t2


def plot(rows: list[dict], path: str) -> None:
    """Checkpointing: kept and peak bytes (left axis) and step time (right axis) against k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ck = [r for r in rows if r["part"] == "checkpointing"]
    labels = ["none" if r["every"] == 0 else str(r["every"]) for r in ck]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(ck))
    ax.bar(
        [i - 0.2 for i in xs],
        [r["retained_bytes"] / 2**20 for r in ck],
        0.4,
        label="kept for backward",
    )
    ax.bar([i + 0.2 for i in xs], [r["peak_bytes"] / 2**20 for r in ck], 0.4, label="peak fwd+bwd")
    ax.set(xticks=list(xs), xticklabels=labels, xlabel="checkpoint every k blocks", ylabel="MiB")
    ax2 = ax.twinx()
    ax2.plot(list(xs), [1e3 * r["step_s"] for r in ck], "ko-", label="step time")
    ax2.set_ylabel("step (ms)")
    ax2.set_ylim(bottom=0)
    ax.legend(loc="upper right")
    ax.set_title(f"activation checkpointing, {ck[0]['layers']} blocks" if ck else "")
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench memory``."""
    p = subparsers.add_parser("memory", help="memory calculator vs measured; activation checkpointing sweep",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--layers", type=int, default=8, help="transformer blocks (default 8)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--seq-len", type=int, default=64, help="sequence length (default 64)")
    p.add_argument("--batch", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--vocab", type=int, default=128, help="vocabulary (default 128)")
    p.add_argument("--every", default="1,2,4", help="checkpoint segment lengths (default 1,2,4)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per setting (default 5)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of the checkpointing sweep")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ddtk.bench.collectives import environment

    console = Console()
    try:
        everies = tuple(sorted({int(k) for k in args.every.split(",") if k.strip()}))
        sizes = (
            args.layers,
            args.hidden,
            args.heads,
            args.seq_len,
            args.batch,
            args.vocab,
            args.repeats,
        )
        if min(sizes) < 1 or not everies or everies[0] < 0:
            raise ValueError("sizes and --repeats must be positive, --every non-negative integers")
        if args.hidden % args.heads:
            raise ValueError(
                f"--hidden ({args.hidden}) must be divisible by --heads ({args.heads})"
            )
    except ValueError as exc:
        console.print(f"ddtk bench memory: {exc}")
        return 2
    env = environment()
    console.print(
        f"[bold]ddtk bench memory[/bold]  cores={env['cores']} torch={env['torch']} threads=1"
    )
    with console.status("measuring ..."):
        rows = measure(args.layers, args.hidden, args.heads, args.seq_len, args.batch, args.vocab,
                       everies, args.repeats)  # fmt: skip
    for t in tables(rows):
        console.print(t)
    if args.json:
        write_json(args.json, env, args, rows)
    if args.plot:
        plot(rows, args.plot)
    return 0
