"""The checkpoint commit protocol and elastic training's timeline, as lecture 06 explains them.

``draw_commit_protocol`` shows how :func:`ddtk.checkpoint.save` commits a checkpoint: each
file is written under a temporary name, fsynced, renamed into place and its directory
fsynced, and the manifest comes last. The order of the files is not typed in here: it is
traced from a real ``save`` into a temporary directory (every ``os.replace`` it makes is
recorded), so the figure changes when the code does. Under the rows, what a crash at each
point leaves behind.

``draw_elastic_timeline`` shows ranks on a time axis through one failure under an elastic
launcher (torchrun ``--nnodes=MIN:MAX``, Horovod Elastic, Ray Train): periodic
checkpoints, the failure, the time until it is detected, the rendezvous of the survivors,
the restart that reloads the last checkpoint, and the work between that checkpoint and the
failure, which is computed again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from unittest import mock

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

_PHASES = ("write to a temporary name", "fsync the file", "os.replace to the final name",
           "fsync the directory")  # fmt: skip
_COLORS = ("#dbe9f6", "#9dc3e6", "#f6c85f", "#b9e0a5")


def traced_commit_order() -> list[str]:
    """The final names that :func:`ddtk.checkpoint.save` renames into place, in order.

    Runs a real ``save`` of a one-tensor state into a temporary directory and records
    every ``os.replace`` it makes (the last one is the manifest: the commit).
    """
    import torch

    from ddtk.checkpoint import capture, save

    renamed: list[str] = []
    real_replace = os.replace

    def record(src, dst, *args, **kwargs):
        renamed.append(Path(dst).name)
        return real_replace(src, dst, *args, **kwargs)

    with tempfile.TemporaryDirectory() as tmp, mock.patch("os.replace", record):
        save(tmp, capture(torch.nn.Linear(2, 2), step=1), 1)
    return renamed


def _box(
    ax, x: float, y: float, w: float, h: float, text: str, color: str, fontsize: float = 7.5
) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01,rounding_size=0.05",
                                fc=color, ec="black", lw=0.8))  # fmt: skip
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def draw_commit_protocol(*, files: list[str] | None = None, title: str | None = None) -> Figure:
    """Per file: temp write, fsync, rename, fsync dir; manifest last; what a crash leaves.

    ``files``: the final names in commit order; None traces them from ``ddtk.checkpoint.save``.
    """
    files = list(files) if files is not None else traced_commit_order()
    rows = len(files)
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.6 * rows + 1.2))
    w, h, gap = 2.2, 0.5, 0.25
    x0 = 2.0
    for r, name in enumerate(files):
        y = (rows - r) * 0.75 + 1.4
        last = r == rows - 1
        ax.text(x0 - 0.15, y + h / 2, name + ("\n(the commit)" if last else ""), ha="right",
                va="center", fontsize=8.5, fontweight="bold" if last else "normal")  # fmt: skip
        for c, (phase, color) in enumerate(zip(_PHASES, _COLORS)):
            label = phase.replace("a temporary name", f"{name}.tmp-*") if c == 0 else phase
            _box(ax, x0 + c * (w + gap), y, w, h, label, "#f4a582" if last and c == 2 else color)
        if r < rows - 1:  # the next file starts after this one is durable
            ax.annotate("", xy=(x0 + 0.1, y - 0.25 + 0.02), xytext=(x0 + 4 * (w + gap) - gap, y - 0.02),
                        arrowprops={"arrowstyle": "-|>", "color": "0.5", "lw": 0.8,
                                    "connectionstyle": "arc3,rad=-0.05"})  # fmt: skip
    # where a crash leaves you
    crashes = [
        (x0 + 2 * (w + gap) - gap / 2, "A: crash before the manifest's rename\n"
         "step dir has no manifest (maybe *.tmp-* files):\nlatest() skips it, load() resumes the previous one"),
        (x0 + 3 * (w + gap) - gap / 2, "B: crash after the manifest's rename,\nbefore the directory fsync: "
         "after a power cut\nthe manifest may be gone (then as A) or present,\nbut every file it names is durable"),
        (x0 + 4 * (w + gap) - gap / 2 + 0.05, "C: after the directory fsync:\ncommitted and durable;\nload() verifies sizes and "
         "sha256"),
    ]  # fmt: skip
    y_manifest = 1.4 + 0.75
    for i, (x, text) in enumerate(crashes):
        ax.plot([x], [y_manifest + h / 2], marker="X", color="#c44e52", ms=11, zorder=5)
        ax.text(x0 - 1.6 + i * 3.6, 0.55, text, fontsize=7.2, va="bottom", ha="left",
                bbox={"fc": "#fbeaea" if i == 0 else "#fff7e0" if i == 1 else "#eaf5e4", "ec": "0.6"})  # fmt: skip
        ax.text(x, y_manifest - 0.2, "ABC"[i], color="#c44e52", fontsize=9, fontweight="bold", ha="center",
                va="center")  # fmt: skip
    ax.set_xlim(-0.2, x0 + 4 * (w + gap) + 0.1)
    ax.set_ylim(0.4, (rows + 1) * 0.75 + 1.3)
    ax.axis("off")
    ax.set_title(title or "Checkpoint commit protocol of ddtk.checkpoint.save "
                 "(file order traced from a real save): manifest written last", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def draw_elastic_timeline(
    *,
    ranks: int = 4,
    failed_rank: int = 3,
    every: float = 10.0,
    fail_at: float = 27.0,
    detection: float = 2.0,
    rendezvous: float = 3.0,
    reload: float = 2.5,
    end: float = 52.0,
    unit: str = "s",
    title: str | None = None,
) -> Figure:
    """Ranks on a time axis through one failure: detect, rendezvous, reload, recompute, go on.

    The survivors continue with ``ranks - 1`` workers (an elastic ``--nnodes=MIN:MAX`` job
    above its minimum). ``every`` is the checkpoint interval; the lost work is the span
    from the last checkpoint before ``fail_at`` to ``fail_at``.
    """
    if not 0 <= failed_rank < ranks:
        raise ValueError(f"failed_rank must be in 0..{ranks - 1}, got {failed_rank}")
    last_ckpt = (fail_at // every) * every
    t_detect = fail_at + detection
    t_rdzv = t_detect + rendezvous
    t_resume = t_rdzv + reload
    t_caught_up = t_resume + (fail_at - last_ckpt)
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.45 * ranks))
    hgt = 0.6
    for r in range(ranks):
        y = ranks - 1 - r
        ax.add_patch(Rectangle((0, y - hgt / 2), fail_at, hgt, fc="#9dc3e6", ec="none"))
        if r != failed_rank:
            ax.add_patch(
                Rectangle(
                    (fail_at, y - hgt / 2), detection, hgt, fc="#eeeeee", ec="0.6", hatch="//"
                )
            )
            ax.add_patch(
                Rectangle((t_detect, y - hgt / 2), rendezvous, hgt, fc="#f6c85f", ec="none")
            )
            ax.add_patch(Rectangle((t_rdzv, y - hgt / 2), reload, hgt, fc="#dd8452", ec="none"))
            ax.add_patch(Rectangle((t_resume, y - hgt / 2), t_caught_up - t_resume, hgt, fc="#f4a582",
                                   ec="#c44e52", hatch=".."))  # fmt: skip
            ax.add_patch(
                Rectangle(
                    (t_caught_up, y - hgt / 2), end - t_caught_up, hgt, fc="#9dc3e6", ec="none"
                )
            )
        else:
            ax.plot([fail_at], [y], marker="X", color="#c44e52", ms=14)
            ax.text(fail_at + 0.6, y, "process dies (SIGKILL, lost node)", va="center", fontsize=8,
                    color="#c44e52")  # fmt: skip
        # the lost work on the ranks that did it before the failure
        ax.add_patch(Rectangle((last_ckpt, y - hgt / 2), fail_at - last_ckpt, hgt, fc="none", ec="#c44e52",
                               hatch="xx", lw=0.8))  # fmt: skip
    for t in [k * every for k in range(1, int(end // every) + 1) if k * every < fail_at]:
        ax.axvline(t, color="#55a868", lw=1.5)
        ax.text(t, -0.45, "checkpoint", ha="center", va="center", fontsize=7, color="#2d6a3a",
                bbox={"fc": "white", "ec": "none", "pad": 0.5})  # fmt: skip
    ax.axvline(fail_at, color="#c44e52", lw=1, ls="--")
    spans = [
        (last_ckpt, fail_at, "lost work\n(done, not committed)"),
        (fail_at, t_detect, "detection"),
        (t_detect, t_rdzv, "rendezvous\n(new world)"),
        (t_rdzv, t_resume, "restart +\nload ckpt"),
        (t_resume, t_caught_up, "recompute\nlost steps"),
    ]
    for i, (a, b, label) in enumerate(spans):
        y = -0.8 - 0.75 * (i % 2)  # alternate rows: short spans do not overlap
        ax.annotate("", xy=(a, y), xytext=(b, y), arrowprops={"arrowstyle": "<->", "lw": 0.8})
        ax.text((a + b) / 2, y - 0.12, label, ha="center", va="top", fontsize=7.2)
    ax.set_yticks(range(ranks), [f"rank {ranks - 1 - y}" for y in range(ranks)])
    ax.set_xlim(0, end)
    ax.set_ylim(-2.6, ranks - 0.4)
    ax.set_xlabel(f"time ({unit})")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"Elastic training through one failure: {ranks} ranks -> {ranks - 1}, "
                 f"checkpoint every {every:g} {unit}", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig
