"""Diagrams of lecture 03: DDP's Reducer overlapping bucket all-reduces with backward, and Horovod's engine.

:func:`draw_ddp_bucket_overlap` cuts a real model's parameters into buckets with the rule DDP
uses (:func:`ddtk.frameworks.ddp_internals.rebuilt_buckets`, which calls the same torch
function as the Reducer) and lays out one backward pass on a simple cost model: each
gradient takes time in proportion to its parameter count, and each bucket's all-reduce
costs ``alpha + bytes / beta`` on one communication stream. The timings are a model for
the picture; the bucket boundaries are DDP's.

:func:`draw_horovod_architecture` draws the pieces of section 1: the training thread that
only enqueues, the background thread's cycle, the coordinator's negotiation and the fusion
buffer.
"""

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

__all__ = [
    "BucketTimeline",
    "bucket_timeline",
    "draw_ddp_bucket_overlap",
    "draw_horovod_architecture",
]

_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c")


@dataclass
class BucketTimeline:
    """One modelled backward pass: per-gradient compute spans and per-bucket all-reduce spans (µs)."""

    names: list[str]  # parameter names, in gradient-arrival order
    grad_spans: list[tuple[float, float]]  # (start, end) of each gradient, arrival order
    grad_bucket: list[int]  # bucket index of each gradient, arrival order
    comm_spans: list[tuple[float, float]]  # (start, end) of each bucket's all-reduce
    bucket_bytes: list[int]

    @property
    def backward_end(self) -> float:
        return self.grad_spans[-1][1]

    @property
    def exposed(self) -> float:
        """Communication left after backward ends: what the overlap did not hide."""
        return max(0.0, self.comm_spans[-1][1] - self.backward_end)


def bucket_timeline(
    named_shapes: list[tuple[str, tuple[int, ...]]], bucket_cap_mb: float = 0.02,
    us_per_param: float = 0.01, alpha_us: float = 30.0, beta_bytes_per_us: float = 1000.0,
) -> BucketTimeline:  # fmt: skip
    """Lay out one backward pass: DDP's rebuilt buckets, compute ∝ parameters, all-reduce = α + bytes/β.

    >>> t = bucket_timeline([("a", (1000,)), ("b", (1000,))], bucket_cap_mb=0.004)
    >>> len(t.comm_spans), t.names
    (1, ['b', 'a'])
    """
    from ddtk.frameworks.ddp_internals import rebuilt_buckets

    cap = int(bucket_cap_mb * 2**20)
    buckets = rebuilt_buckets([s for _, s in named_shapes], cap)
    arrival = list(reversed(range(len(named_shapes))))
    numel = [1] * len(named_shapes)
    for i, (_, shape) in enumerate(named_shapes):
        for d in shape:
            numel[i] *= d
    bucket_of = {p: b for b, params in enumerate(buckets) for p in params}
    t, spans, ready = 0.0, [], {}
    for p in arrival:
        spans.append((t, t + us_per_param * numel[p]))
        t = spans[-1][1]
        ready[p] = t
    comm, free = [], 0.0
    for params in buckets:
        start = max(free, max(ready[p] for p in params))  # launched when its last gradient is in
        nbytes = 4 * sum(numel[p] for p in params)
        comm.append((start, start + alpha_us + nbytes / beta_bytes_per_us))
        free = comm[-1][1]
    return BucketTimeline(
        names=[named_shapes[p][0] for p in arrival], grad_spans=spans,
        grad_bucket=[bucket_of[p] for p in arrival], comm_spans=comm,
        bucket_bytes=[4 * sum(numel[p] for p in b) for b in buckets],
    )  # fmt: skip


def _resnet_shapes() -> list[tuple[str, tuple[int, ...]]]:
    from ddtk.models import build_model

    return [(n, tuple(p.shape)) for n, p in build_model("resnet", seed=0).named_parameters()]


def draw_ddp_bucket_overlap(
    bucket_cap_mb: float = 0.02, alpha_us: float = 30.0, beta_bytes_per_us: float = 1000.0,
    us_per_param: float = 0.01,
) -> Figure:  # fmt: skip
    """DDP's buckets filling in reverse layer order during backward, their all-reduces overlapping it.

    Top: the rebuilt buckets (``bucket_cap_mb``) of ddtk's digits ResNet. Bottom: the
    same model with one bucket for everything (DDP's first iteration), where the whole
    all-reduce waits for the end of backward.
    """
    shapes = _resnet_shapes()
    kw = {
        "us_per_param": us_per_param,
        "alpha_us": alpha_us,
        "beta_bytes_per_us": beta_bytes_per_us,
    }
    rebuilt = bucket_timeline(shapes, bucket_cap_mb, **kw)
    single = bucket_timeline(shapes, 1e6, **kw)
    fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), sharex=True)
    for ax, tl, label in ((axes[0], rebuilt, f"bucket_cap_mb={bucket_cap_mb:g}: {len(rebuilt.comm_spans)} buckets"),
                          (axes[1], single, "one bucket (DDP's first iteration)")):  # fmt: skip
        for (a, b), k, name in zip(tl.grad_spans, tl.grad_bucket, tl.names):
            ax.barh(
                1,
                b - a,
                left=a,
                height=0.6,
                color=_COLORS[k % len(_COLORS)],
                edgecolor="white",
                lw=0.5,
            )
            if b - a > 0.06 * tl.comm_spans[-1][1]:
                ax.text((a + b) / 2, 1, name, ha="center", va="center", fontsize=6, color="white")
        for k, ((a, b), nbytes) in enumerate(zip(tl.comm_spans, tl.bucket_bytes)):
            ax.barh(
                0,
                b - a,
                left=a,
                height=0.6,
                color=_COLORS[k % len(_COLORS)],
                hatch="//",
                edgecolor="white",
            )
            ax.text(
                (a + b) / 2,
                0,
                f"bucket {k}\n{nbytes / 1024:.1f} KiB",
                ha="center",
                va="center",
                fontsize=7,
            )
        ax.axvline(tl.backward_end, color="black", ls="--", lw=1)
        ax.annotate(f"exposed: {tl.exposed:.0f} µs", xy=(tl.backward_end, 0.5), xytext=(6, 0),
                    textcoords="offset points", fontsize=8, va="center")  # fmt: skip
        ax.set_yticks([0, 1], ["all-reduce\n(comm stream)", "backward\n(autograd)"])
        ax.set_ylim(-0.5, 1.5)
        ax.set_title(label, fontsize=9, loc="left")
    axes[1].set_xlabel(
        f"modelled time (µs): gradient {us_per_param:g} µs/parameter, all-reduce {alpha_us:g} µs "
        f"+ bytes / {beta_bytes_per_us:g} B/µs"
    )
    fig.suptitle(
        "DDP's Reducer: buckets fill in reverse layer order, their all-reduces overlap backward"
    )
    fig.tight_layout()
    return fig


def _box(ax, x: float, y: float, w: float, h: float, text: str, color: str, size: int = 8) -> None:
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black", lw=0.8)
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(
    ax,
    a: tuple[float, float],
    b: tuple[float, float],
    text: str = "",
    style: str = "-|>",
    color: str = "black",
) -> None:
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=10, lw=1, color=color))
    if text:
        ax.text(
            (a[0] + b[0]) / 2,
            (a[1] + b[1]) / 2 + 0.12,
            text,
            ha="center",
            fontsize=7,
            style="italic",
        )


def draw_horovod_architecture(world_size: int = 2, cycle_time_ms: float = 1.0) -> Figure:
    """Horovod's engine per rank: enqueue, negotiate with the coordinator each cycle, fuse, all-reduce."""
    fig, ax = plt.subplots(figsize=(10, 2.2 + 1.9 * world_size))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, 2.0 * world_size + 0.6)
    ax.axis("off")
    for r in reversed(range(world_size)):
        y = 2.0 * (world_size - 1 - r) + 0.2
        ax.add_patch(FancyBboxPatch((0.05, y - 0.15), 9.9, 1.75, boxstyle="round,pad=0.02", fc="#f4f4f4",
                                    ec="#999999", lw=0.8))  # fmt: skip
        ax.text(
            0.15,
            y + 1.45,
            f"rank {r}" + (" (coordinator)" if r == 0 else ""),
            fontsize=8,
            weight="bold",
        )
        _box(ax, 0.3, y + 0.3, 1.9, 0.9, "training thread\nbackward: hook per\ngradient", "#c6dbef")
        _box(ax, 2.9, y + 0.3, 1.5, 0.9, "tensor queue\n(name, shape,\ndtype, op)", "#fdd0a2")
        _box(ax, 5.0, y + 0.3, 2.0, 0.9, f"background thread\nevery {cycle_time_ms:g} ms:\nready list, cache bits",
             "#c7e9c0")  # fmt: skip
        _box(ax, 7.6, y + 0.3, 2.1, 0.9, "fusion buffer\ncopy in, all-reduce,\ncopy out", "#dadaeb")
        _arrow(ax, (2.2, y + 0.75), (2.9, y + 0.75), "allreduce_async_")
        _arrow(ax, (4.4, y + 0.75), (5.0, y + 0.75))
        _arrow(ax, (7.0, y + 0.75), (7.6, y + 0.75), "responses")
    top0 = 2.0 * (world_size - 1) + 0.2
    for r in range(1, world_size):
        y = 2.0 * (world_size - 1 - r) + 0.2
        _arrow(ax, (6.0, y + 1.2), (6.0, top0 + 0.3), style="<|-|>")
        _arrow(ax, (8.65, y + 1.2), (8.65, top0 + 0.3), style="<|-|>", color="#6a51a3")
    mid = (top0 + 0.3 + 1.4) / 2
    ax.text(6.1, mid, "requests: ready tensors\nresponses: what to run\n(control: Gloo or MPI)", fontsize=7,
            va="center")  # fmt: skip
    ax.text(8.75, mid, "fused all-reduce\n(data: Gloo/MPI on CPU,\nNCCL on GPU)", fontsize=7, va="center",
            color="#6a51a3")  # fmt: skip
    ax.set_title(f"Horovod's engine on {world_size} ranks: the training thread only enqueues; "
                 "the background thread negotiates, fuses and reduces", fontsize=9)  # fmt: skip
    fig.tight_layout()
    return fig
