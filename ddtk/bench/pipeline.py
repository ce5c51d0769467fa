"""``ddtk bench pipeline``: step time, bubble and activation memory of the pipeline schedules.

    ddtk bench pipeline                      # p = 2,3,4 stages; m = 1,2,4,8; 40 ms synthetic stages
    ddtk bench pipeline -p 2,4 -m 1,4,8 --stage-ms 20 --json build/bench/pipeline.json \\
        --plot build/bench/pipeline.png
    ddtk bench pipeline --stage-ms 0         # a real MLP instead of synthetic compute

For each number of stages ``p`` (one rank per stage), each schedule (``naive``,
``gpipe``, ``1f1b``) and each micro-batch count ``m`` (naive runs ``m = 1`` only),
:class:`ddtk.parallel.pipeline.PipelineParallel` trains on the same batch for
``--steps`` timed steps after one warm-up step. A row reports:

* step time: median over steps of the slowest rank's ``train_step`` (ms),
* the ideal step time with synthetic stages, ``(m + p - 1)/m * (1 + r) * stage_ms``,
* the bubble measured from the recorded timelines (idle share of ``p`` times the
  step's span, :func:`~ddtk.parallel.pipeline_schedules.bubble_fraction`), the
  textbook ``(p - 1)/(m + p - 1)`` and their ratio,
* the peak number of micro-batches whose activations a stage held (the largest
  over ranks) and what the schedule promises (``m`` for gpipe, ``min(p, m)`` for 1f1b).

Synthetic compute (``--stage-ms T``, the default mode): each stage is a small
linear layer followed by a layer that sleeps, in forward, ``T * b / batch``
milliseconds for a micro-batch of ``b`` samples and ``r`` times as long in
backward (``--backward-ratio r``, default 2). Every stage then takes the same
time, as the textbook formula assumes, and a sleeping rank uses no CPU, so
4 ranks on 2 cores still show the real bubble. With ``--stage-ms 0`` the model
is an MLP of ``p`` hidden layers of ``--width`` units on the digits data, cut
by parameter count: the stages then differ and share the cores, and the bubble
includes that imbalance.
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
from ddtk.parallel.pipeline_schedules import (
    SCHEDULES,
    Timeline,
    bubble_fraction,
    theoretical_bubble,
)

MAX_STAGES = 8


class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward sleep for given seconds."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class SyntheticCompute(nn.Module):
    """Identity layer that sleeps ``ms_per_sample * len(x)`` ms in forward, ``backward_ratio`` times that in backward.

    >>> layer = SyntheticCompute(ms_per_sample=0.5)
    >>> x = torch.ones(4, 3, requires_grad=True)
    >>> start = time.perf_counter(); y = layer(x); round((time.perf_counter() - start) * 1e3) >= 2
    True
    >>> torch.equal(y, x)
    True
    """

    def __init__(self, ms_per_sample: float, backward_ratio: float = 2.0):
        super().__init__()
        self.ms_per_sample = ms_per_sample
        self.backward_ratio = backward_ratio

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seconds = self.ms_per_sample * len(x) / 1e3
        return _Sleep.apply(x, seconds, seconds * self.backward_ratio)


def _workload(p: int, stage_ms: float, backward_ratio: float, batch: int, width: int):
    """(model factory, x, y, loss, balance) for synthetic or real stages."""
    g = torch.Generator().manual_seed(0)
    if stage_ms > 0:

        def model() -> nn.Sequential:  # fmt: skip
            torch.manual_seed(0)
            layers: list[nn.Module] = []
            for _ in range(p):
                layers += [
                    nn.Linear(width, width),
                    SyntheticCompute(stage_ms / batch, backward_ratio),
                ]
            return nn.Sequential(*layers)

        x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
        return model, x, y, nn.MSELoss(), [2] * p
    from ddtk.data import load_dataset
    from ddtk.models import build_model

    ds = load_dataset("digits")
    idx = torch.randint(0, len(ds), (batch,), generator=g)
    return (lambda: build_model("mlp", hidden_dims=(width,) * p, seed=0)), ds.x[idx], ds.y[idx], \
        nn.CrossEntropyLoss(), None  # fmt: skip


def _configs(schedules: list[str], microbatches: list[int]) -> list[tuple[str, int]]:
    return [(s, m) for s in schedules for m in ([1] if s == "naive" else microbatches)]


def _rank_bench(ctx: Any, schedules: list[str], microbatches: list[int], stage_ms: float,
                backward_ratio: float, batch: int, width: int, steps: int) -> dict:  # fmt: skip
    """Runs in every rank: per configuration, the step times and this rank's timelines."""
    from ddtk.bench.timing import timed_across_ranks
    from ddtk.parallel.pipeline import PipelineParallel

    model, x, y, loss, balance = _workload(ctx.world_size, stage_ms, backward_ratio, batch, width)
    out = {}
    for schedule, m in _configs(schedules, microbatches):
        pipe = PipelineParallel(ctx, model(), loss, m, schedule, balance=balance)
        pipe.train_step(x, y)  # warm-up: connections, allocations
        times, timelines = [], []
        for _ in range(steps):
            times.append(timed_across_ranks(lambda pipe=pipe: pipe.train_step(x, y)))
            timelines.append(pipe.timeline)
        out[(schedule, m)] = {"times": times, "timelines": timelines}
    return out


def measure(
    stages: list[int],
    microbatches: list[int] = (1, 2, 4, 8),  # type: ignore[assignment]
    schedules: list[str] = SCHEDULES,  # type: ignore[assignment]
    stage_ms: float = 40.0,
    backward_ratio: float = 2.0,
    batch: int = 64,
    width: int = 64,
    steps: int = 3,
) -> list[dict]:
    """One row per (stages, schedule, micro-batches); see the module docstring for the columns."""
    import ddtk

    rows = []
    for p in stages:
        res = ddtk.launch(_rank_bench, p, args=(list(schedules), list(microbatches), stage_ms,
                          backward_ratio, batch, width, steps), validate=False, timeout=1800,
                          echo=False)  # fmt: skip
        for schedule, m in _configs(list(schedules), list(microbatches)):
            per_step = [[r[(schedule, m)]["timelines"][s] for r in res] for s in range(steps)]
            bubbles = [bubble_fraction(t) for t in per_step]
            median = statistics.median(bubbles)
            shown = per_step[bubbles.index(min(bubbles, key=lambda b: abs(b - median)))]
            theory = theoretical_bubble(p, m)
            step_s = statistics.median(res[0][(schedule, m)]["times"])
            ideal = (m + p - 1) / m * (1 + backward_ratio) * stage_ms if stage_ms > 0 else None
            rows.append({
                "stages": p, "schedule": schedule, "microbatches": m, "step_ms": 1e3 * step_s,
                "ideal_step_ms": ideal, "step_vs_ideal": 1e3 * step_s / ideal if ideal else None,
                "bubble": median, "bubble_theory": theory,
                "bubble_ratio": median / theory if theory else None,
                "peak_in_flight": max(t.peak_in_flight for t in shown),
                "peak_expected": min(p, m) if schedule == "1f1b" else m,
                "step_times_s": res[0][(schedule, m)]["times"],
                "timeline": [[[e.kind, e.micro, e.start, e.end] for e in t.events] for t in shown],
            })  # fmt: skip
    return rows


def timelines_of(row: dict) -> list[Timeline]:
    """The :class:`Timeline` objects stored in a row (its median-bubble step)."""
    out = []
    for rank, events in enumerate(row["timeline"]):
        tl = Timeline(rank)
        for kind, micro, start, end in events:
            tl.record(kind, micro, start, end)
        out.append(tl)
    return out


def table(rows: list[dict]):
    """A rich table of the rows."""
    from rich.table import Table

    t = Table(title="pipeline schedules: step time, bubble (idle share) and activations held")
    for col in ("p", "schedule", "m", "step ms", "ideal ms", "vs ideal", "bubble", "(p-1)/(m+p-1)",
                "ratio", "peak held", "expected"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r["stages"]), r["schedule"], str(r["microbatches"]), f"{r['step_ms']:.1f}",
            "-" if r["ideal_step_ms"] is None else f"{r['ideal_step_ms']:.1f}",
            "-" if r["step_vs_ideal"] is None else f"{r['step_vs_ideal']:.2f}x",
            f"{r['bubble']:.3f}", f"{r['bubble_theory']:.3f}",
            "-" if r["bubble_ratio"] is None else f"{r['bubble_ratio']:.2f}x",
            str(r["peak_in_flight"]), str(r["peak_expected"]),
        )  # fmt: skip
    return t


def plot(rows: list[dict], path: str) -> None:
    """Measured timelines of the largest p (one per schedule), and bubble against m with the formula."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddtk.viz.pipeline import plot_timeline

    p = max(r["stages"] for r in rows)
    ms = sorted({r["microbatches"] for r in rows if r["schedule"] != "naive"}) or [1]
    m_show = max([m for m in ms if m <= 4] or ms[:1])
    shown = [
        r
        for r in rows
        if r["stages"] == p and r["microbatches"] == (1 if r["schedule"] == "naive" else m_show)
    ]
    fig, axes = plt.subplots(len(shown) + 1, 1, figsize=(10, 2.2 * len(shown) + 3.2), squeeze=False)
    for ax, r in zip(axes[:, 0], shown):
        plot_timeline(timelines_of(r), ax=ax, title=f"{r['schedule']}, p={p}, m={r['microbatches']}: "
                      f"bubble {r['bubble']:.0%} measured, {r['bubble_theory']:.0%} theory")  # fmt: skip
    ax = axes[-1, 0]
    for k, stages in enumerate(sorted({r["stages"] for r in rows})):
        grid = [1 + i * 0.25 for i in range(int((max(ms) - 1) * 4) + 1)]
        ax.plot(grid, [theoretical_bubble(stages, m) for m in grid], color=f"C{k}", ls=":",
                label=f"(p-1)/(m+p-1), p={stages}")  # fmt: skip
        for schedule, marker in zip(SCHEDULES, "sox"):
            pts = [
                (r["microbatches"], r["bubble"])
                for r in rows
                if r["stages"] == stages and r["schedule"] == schedule
            ]
            if pts:
                ax.plot(
                    *zip(*pts),
                    marker=marker,
                    ls="none",
                    color=f"C{k}",
                    label=f"{schedule}, p={stages}",
                )
    ax.set(
        xlabel="micro-batches m", ylabel="bubble (idle share)", title="measured bubble vs formula"
    )
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=6, ncol=3)
    save_figure(fig, path)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench pipeline``."""
    p = subparsers.add_parser("pipeline", help="pipeline schedules: step time, bubble vs (p-1)/(m+p-1), activations held",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "-p",
        "--stages",
        default="2,3,4",
        help="comma-separated stage counts = ranks (default 2,3,4)",
    )
    p.add_argument(
        "-m",
        "--microbatches",
        default="1,2,4,8",
        help="comma-separated micro-batch counts (default 1,2,4,8)",
    )
    p.add_argument(
        "--schedules",
        default=",".join(SCHEDULES),
        help="comma-separated (default naive,gpipe,1f1b)",
    )
    p.add_argument(
        "--stage-ms",
        type=float,
        default=40.0,
        help="synthetic forward ms of one stage on the whole batch; 0 = real MLP (default 40)",
    )
    p.add_argument(
        "--backward-ratio",
        type=float,
        default=2.0,
        help="synthetic backward / forward time (default 2)",
    )
    p.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    p.add_argument("--width", type=int, default=64, help="layer width (default 64)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration (default 3)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG of the timelines and the bubble against m"
    )
    p.set_defaults(func=_run)  # fmt: skip


def _parse(args: argparse.Namespace) -> tuple[list[int], list[int], list[str]]:
    """Validate the arguments; raise ValueError naming the problem."""
    try:
        stages = sorted({int(v) for v in args.stages.split(",") if v.strip()})
        micro = sorted({int(v) for v in args.microbatches.split(",") if v.strip()})
    except ValueError:
        raise ValueError("--stages and --microbatches take comma-separated integers") from None
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    if not stages or stages[0] < 1 or stages[-1] > MAX_STAGES:
        raise ValueError(f"--stages needs integers in [1, {MAX_STAGES}]")
    if not micro or micro[0] < 1:
        raise ValueError("--microbatches needs positive integers")
    if not schedules or any(s not in SCHEDULES for s in schedules):
        raise ValueError(f"--schedules takes names among {', '.join(SCHEDULES)}")
    if args.stage_ms < 0 or args.backward_ratio <= 0 or min(args.width, args.steps) < 1:
        raise ValueError("--stage-ms must be >= 0; --backward-ratio, --width and --steps positive")
    if args.batch < micro[-1]:
        raise ValueError(
            f"--batch ({args.batch}) must be at least the largest micro-batch count ({micro[-1]})"
        )
    return stages, micro, schedules


def _points(args: argparse.Namespace, plan: tuple[list[int], list[int], list[str]]) -> list[Point]:
    stages, micro, schedules = plan

    def at(p: int) -> Callable[[], list[dict]]:
        return lambda: measure([p], micro, schedules, args.stage_ms, args.backward_ratio,
                               args.batch, args.width, args.steps)  # fmt: skip

    return [Point(f"measuring {p} stage(s) ...", at(p)) for p in stages]


def _header(args: argparse.Namespace, env: dict, _plan: Any) -> str:
    mode = (
        f"synthetic stages {args.stage_ms:g} ms (backward x{args.backward_ratio:g})"
        if args.stage_ms
        else f"real MLP width {args.width}"
    )
    return (f"cores={env['cores']} backend={env['backend']} torch={env['torch']} "
            f"{mode} batch={args.batch} steps={args.steps}")  # fmt: skip


SWEEP = Sweep(name="pipeline", plan=_parse, header=_header, points=_points, table=table, plot=plot,
              width=132)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    return run_sweep(SWEEP, args)
