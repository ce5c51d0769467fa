"""``ddtk bench precision``: float32 against bf16 autocast (and fp16 with a loss scaler).

    ddtk bench precision                      # digits MLP and a 2x1024 synthetic MLP, 60 steps each
    ddtk bench precision --steps 100 --hidden 2048 --dtypes fp32,bf16,fp16 \\
        --json build/bench/precision.json --plot build/bench/precision.png

For each workload every precision trains the same model from the same weights
on the same batches, interleaved step by step in one process (one thread), so
machine noise hits them alike:

* ``fp32``: plain float32 training (the peer),
* ``bf16``: forward pass under ``torch.autocast(dtype=torch.bfloat16)``, float32
  master weights, no loss scaler,
* ``fp16``: autocast to float16 with :class:`~ddtk.precision.DynamicLossScaler`
  (the default on CUDA; on CPU add it with ``--dtypes``).

Workloads: ``digits`` (the course's MLP on scikit-learn digits) and
``synthetic`` (an MLP with ``--layers`` hidden layers of ``--hidden`` units on
``synthetic_classification``, big enough for matmul speed to dominate).

Reported per row: median step time (forward, backward, SGD update), memory,
final loss and accuracy on a held-out 20 % after ``--steps`` steps (evaluated in
float32), and bf16/fp32 and fp16/fp32 ratios. Memory on CPU is the bytes of the
tensors autograd saves for backward (counted by a
``torch.autograd.graph.saved_tensors_hooks`` pack hook, each tensor once,
parameters excluded; under autocast this includes the 16-bit weight copies) plus parameters and gradients; on CUDA it is
``torch.cuda.max_memory_allocated`` over one step. Whether bf16 is faster
depends on the CPU: kernels with AVX512-BF16/AMX are, plain AVX2 ones are not.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddtk.bench.report import save_figure
from ddtk.bench.runner import Point, Sweep, run_sweep

WORKLOADS = ("digits", "synthetic")
PRECISIONS = ("fp32", "bf16", "fp16")


def _workload(name: str, hidden: int, layers: int, seed: int) -> tuple[Any, Any, nn.Module]:
    """(train, test) datasets and a seeded model for a workload."""
    from ddtk.data import load_dataset, train_test_split
    from ddtk.models import build_model

    if name == "digits":
        ds = load_dataset("digits")
        dims: tuple[int, ...] = (64, 32)
    else:
        ds = load_dataset("synthetic_classification", n=4096, seed=seed)
        dims = (hidden,) * layers
    train, test = train_test_split(ds, test_fraction=0.2, seed=seed)
    model = build_model("mlp", ds.input_shape, ds.num_classes, seed=seed, hidden_dims=dims)
    return train, test, model


class _Contender:
    """One precision's model copy, optimizer and scaler, with a timed step and a memory probe."""

    def __init__(self, name: str, model: nn.Module, device: torch.device, lr: float) -> None:
        import copy

        from ddtk.precision import DynamicLossScaler

        self.name, self.device = name, device
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
        self.model = copy.deepcopy(model).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scaler = DynamicLossScaler() if name == "fp16" else None
        self.times: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        from ddtk.precision import amp_train_step

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = amp_train_step(self.model, self.opt, x, y, nn.functional.cross_entropy,
                              self.dtype, self.scaler)  # fmt: skip
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - start)
        return loss

    def memory(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
        """Bytes saved for backward, of parameters and of gradients, during one training step."""
        params = list(self.model.parameters())
        param_bytes = sum(p.nbytes for p in params)
        grad_bytes = param_bytes  # one float32 gradient per parameter (master weights)
        own = {p.untyped_storage().data_ptr() for p in params}
        seen: dict[tuple[int, int], int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            # A tensor saved by two operations (a ReLU's output is the next Linear's input) counts once.
            if t.untyped_storage().data_ptr() not in own:
                seen[(t.data_ptr(), t.nbytes)] = t.nbytes
            return t

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.step(x, y)
        self.times.pop()  # the probe step is not a timing sample
        row = {"saved_bytes": sum(seen.values()), "param_bytes": param_bytes,
               "grad_bytes": grad_bytes}  # fmt: skip
        if self.device.type == "cuda":
            row["peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        else:
            row["peak_bytes"] = row["saved_bytes"] + param_bytes + grad_bytes
        return row

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """Float32 loss and accuracy on held-out data."""
        with torch.no_grad():
            logits = self.model(x.to(self.device)).float()
        y = y.to(self.device)
        loss = float(nn.functional.cross_entropy(logits, y))
        return loss, float((logits.argmax(1) == y).float().mean())


def measure(
    workloads: tuple[str, ...] = WORKLOADS,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    steps: int = 60,
    batch: int = 128,
    hidden: int = 1024,
    layers: int = 2,
    lr: float = 0.05,
    warmup: int = 3,
    seed: int = 0,
    device: str | None = None,
) -> list[dict]:
    """One row per (workload, precision): step time, memory, final loss/accuracy, ratios to fp32.

    Runs in this process with one thread (restored afterwards); on CUDA when
    available unless ``device`` says otherwise.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = []
        for w in workloads:
            rows += _measure_workload(
                w, precisions, steps, batch, hidden, layers, lr, warmup, seed, dev
            )
    finally:
        torch.set_num_threads(threads)
    return add_ratios(rows)


def _measure_workload(
    workload: str, precisions: tuple[str, ...], steps: int, batch: int, hidden: int, layers: int,
    lr: float, warmup: int, seed: int, dev: torch.device,
) -> list[dict]:  # fmt: skip
    train, test, model = _workload(workload, hidden, layers, seed)
    g = torch.Generator().manual_seed(seed)
    idx = [torch.randint(0, len(train), (batch,), generator=g) for _ in range(warmup + steps)]
    batches = [(train.x[i].to(dev), train.y[i].to(dev)) for i in idx]
    # Memory on throw-away copies, so that every timed contender starts from the same weights.
    memory = {p: _Contender(p, model, dev, lr).memory(*batches[0]) for p in precisions}
    contenders = [_Contender(p, model, dev, lr) for p in precisions]
    losses: dict[str, list[float]] = {c.name: [] for c in contenders}
    for i, (x, y) in enumerate(batches):
        k = i % len(contenders)
        for c in (
            contenders[k:] + contenders[:k]
        ):  # rotate the order: no contender always goes first
            losses[c.name].append(c.step(x, y))
    rows = []
    for c in contenders:
        times = c.times[warmup:]
        loss, acc = c.evaluate(test.x, test.y)
        rows.append({
            "workload": workload, "precision": c.name, "device": dev.type,
            "parameters": sum(p.numel() for p in c.model.parameters()), "batch": batch, "steps": steps,
            "step_ms": 1e3 * statistics.median(times), "step_ms_all": [1e3 * t for t in times],
            **memory[c.name], "final_train_loss": losses[c.name][-1], "test_loss": loss,
            "test_accuracy": acc, "nonfinite_losses": sum(not torch.isfinite(torch.tensor(v)) for v in losses[c.name]),
            "skipped_steps": len(c.scaler.skipped_steps) if c.scaler else 0,
        })  # fmt: skip
    return rows


def add_ratios(rows: list[dict]) -> list[dict]:
    """Add ``time_vs_fp32`` and ``memory_vs_fp32`` (this row over the same workload's fp32 row)."""
    peer = {r["workload"]: r for r in rows if r["precision"] == "fp32"}
    for r in rows:
        p = peer.get(r["workload"])
        r["time_vs_fp32"] = r["step_ms"] / p["step_ms"] if p else None
        r["memory_vs_fp32"] = r["peak_bytes"] / p["peak_bytes"] if p else None
        r["saved_vs_fp32"] = r["saved_bytes"] / p["saved_bytes"] if p and p["saved_bytes"] else None
    return rows


def table(rows: list[dict]):
    """A rich table of the rows."""
    from rich.table import Table

    from ddtk.bench.timing import format_bytes

    t = Table(title="mixed precision: one training step, one thread (ratio = this / fp32)")
    cols = ("workload", "params", "precision", "step (ms)", "time ratio", "saved for bwd",
            "memory", "mem ratio", "test loss", "test acc", "skipped")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("workload", "precision") else "right")
    for r in rows:
        ratio = "-" if r["time_vs_fp32"] is None else f"{r['time_vs_fp32']:.2f}x"
        mem = "-" if r["memory_vs_fp32"] is None else f"{r['memory_vs_fp32']:.2f}x"
        t.add_row(r["workload"], f"{r['parameters']:,}", r["precision"], f"{r['step_ms']:.2f}", ratio,
                  format_bytes(r["saved_bytes"]), format_bytes(r["peak_bytes"]), mem,
                  f"{r['test_loss']:.3g}", f"{r['test_accuracy']:.3f}", str(r["skipped_steps"]))  # fmt: skip
    return t


def plot(rows: list[dict], path: str) -> None:
    """Step time and memory per workload, one bar per precision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    by = {(r["workload"], r["precision"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(precisions)
    for j, p in enumerate(precisions):
        xs = [i + j * width for i in range(len(workloads))]
        for ax, key, scale in ((axes[0], "step_ms", 1.0), (axes[1], "peak_bytes", 2.0**-20)):
            ax.bar(xs, [by[(w, p)][key] * scale if (w, p) in by else 0 for w in workloads],
                   width, label=p)  # fmt: skip
    for ax, label in ((axes[0], "step time (ms)"), (axes[1], "memory (MiB)")):
        ax.set_xticks(
            [i + width * (len(precisions) - 1) / 2 for i in range(len(workloads))], workloads
        )
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle("fp32 vs 16-bit autocast")
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench precision``."""
    p = subparsers.add_parser("precision", help="fp32 vs bf16 autocast (fp16 + scaler on CUDA): time, memory, accuracy",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated, from {', '.join(WORKLOADS)} (default both)")  # fmt: skip
    p.add_argument("--dtypes", default=None,
                   help="comma-separated precisions from fp32,bf16,fp16 (default fp32,bf16; "
                        "fp32,bf16,fp16 on CUDA)")  # fmt: skip
    p.add_argument("--steps", type=int, default=60, help="timed training steps (default 60)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps (default 3)")
    p.add_argument("--batch", type=int, default=128, help="samples per step (default 128)")
    p.add_argument("--hidden", type=int, default=1024, help="synthetic MLP width (default 1024)")
    p.add_argument("--layers", type=int, default=2, help="synthetic MLP hidden layers (default 2)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available"
    )
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of step time and memory")
    p.set_defaults(func=_run)


def _parse(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """Validated (workloads, precisions, device); ValueError names the bad option."""
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    if not workloads or set(workloads) - set(WORKLOADS):
        raise ValueError(
            f"--workloads takes names from {', '.join(WORKLOADS)}, got {args.workloads!r}"
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but no CUDA device is available")
    default = "fp32,bf16,fp16" if device == "cuda" else "fp32,bf16"
    precisions = tuple(
        dict.fromkeys(p.strip() for p in (args.dtypes or default).split(",") if p.strip())
    )
    if not precisions or set(precisions) - set(PRECISIONS):
        raise ValueError(f"--dtypes takes names from {', '.join(PRECISIONS)}, got {args.dtypes!r}")
    if min(args.steps, args.batch, args.hidden, args.layers) < 1 or args.warmup < 0 or args.lr <= 0:
        raise ValueError(
            "--steps, --batch, --hidden, --layers and --lr must be positive, --warmup >= 0"
        )
    return workloads, precisions, device


def _points(
    args: argparse.Namespace, plan: tuple[tuple[str, ...], tuple[str, ...], str]
) -> list[Point]:
    workloads, precisions, device = plan

    def at(w: str) -> Callable[[], list[dict]]:
        return lambda: measure((w,), precisions, args.steps, args.batch, args.hidden, args.layers,
                               args.lr, args.warmup, device=device)  # fmt: skip

    return [Point(f"measuring {w} ...", at(w)) for w in workloads]


def _header(args: argparse.Namespace, env: dict, plan: Any) -> str:
    return (f"cores={env['cores']} torch={env['torch']} device={plan[2]} threads=1 steps={args.steps} "
            f"batch={args.batch} cpu bf16 units={env['cpu_bf16'] or 'none'}")  # fmt: skip


def _record_bf16(env: dict, _args: argparse.Namespace, _plan: Any) -> None:
    env["cpu_bf16"] = _cpu_bf16_flags()


SWEEP = Sweep(name="precision", plan=_parse, header=_header, points=_points, table=table, plot=plot,
              width=140, environment=_record_bf16, after_all=add_ratios)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    return run_sweep(SWEEP, args)


def _cpu_bf16_flags() -> str:
    """The CPU's bf16 matmul units named in /proc/cpuinfo (avx512_bf16, amx_bf16), if any."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return ""
    return ",".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags)
