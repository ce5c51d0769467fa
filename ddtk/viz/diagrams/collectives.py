"""Tree all-reduce diagrams for lecture 01: ddtk's binomial tree and NCCL's double binary tree.

The binomial tree is not redrawn from a textbook: :func:`binomial_tree_rounds` runs
:func:`ddtk.comm.tree.reduce_` and :func:`ddtk.comm.tree.broadcast_` on a recording
transport (one per rank) and times the recorded sends and receives, so the picture is
the schedule the code executes. The double binary tree follows NCCL's
``ncclGetBtree``/``ncclGetDtree`` (``src/graph/trees.cc`` in NVIDIA/nccl): the first
tree is an in-order binary tree rooted at 0, the second its mirror image
(``nranks - 1 - r``) for an even count, or the same tree shifted by one rank for an odd
count. NCCL builds these trees over *nodes*; inside a node the GPUs form a chain.
"""

from __future__ import annotations

from collections import defaultdict

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ddtk.comm import tree as ddtk_tree
from ddtk.comm.ops import ReduceOp

_COLORS = ("#4c72b0", "#dd8452")


class _Done:
    """A completed request: the recording transport never blocks."""

    def wait(self) -> None:
        return None


class _RecordingTransport:
    """Just enough of :class:`ddtk.comm.transport.Transport` to record one rank's messages."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.device = torch.device("cpu")
        self.events: list[tuple[str, int]] = []

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> _Done:
        self.events.append(("send", dst))
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> _Done:
        self.events.append(("recv", src))
        return _Done()


def _recorded(world_size: int, phase: str) -> dict[int, list[tuple[str, int]]]:
    """Each rank's ordered (kind, peer) events when it runs ddtk's tree ``phase``."""
    ranks = list(range(world_size))
    events = {}
    for r in ranks:
        comm = _RecordingTransport(r)
        buf = torch.zeros(1)
        if phase == "reduce":
            ddtk_tree.reduce_(comm, ranks, buf, ReduceOp.SUM, root=0, tag=0)
        else:
            ddtk_tree.broadcast_(comm, ranks, buf, root=0, tag=0)
        events[r] = comm.events
    return events


def binomial_tree_rounds(world_size: int = 8) -> list[list[tuple[int, int, int]]]:
    """The (round, src, dst) messages of ddtk's tree all-reduce, reduce then broadcast.

    Each rank's recorded events are matched with its peers' in order; a message takes
    place one round after both ends finished their previous message, which is when a
    blocking send and receive pair can complete.
    """
    phases = []
    for phase in ("reduce", "broadcast"):
        events = _recorded(world_size, phase)
        ready = defaultdict(int)
        pending = {r: list(ev) for r, ev in events.items()}
        messages: list[tuple[int, int, int]] = []
        while any(pending.values()):
            progressed = False
            for src in range(world_size):
                if not pending[src] or pending[src][0][0] != "send":
                    continue
                dst = pending[src][0][1]
                if pending[dst] and pending[dst][0] == ("recv", src):
                    t = max(ready[src], ready[dst]) + 1
                    ready[src] = ready[dst] = t
                    pending[src].pop(0)
                    pending[dst].pop(0)
                    messages.append((t, src, dst))
                    progressed = True
            if not progressed:
                raise RuntimeError(f"unmatched tree {phase} events: {pending}")
        phases.append(messages)
    return phases


def btree(nranks: int, rank: int) -> tuple[int, list[int]]:
    """Parent (-1 for the root) and children of ``rank`` in NCCL's binary tree rooted at 0."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if nranks > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    if low == 0:
        return up, []
    down1 = rank + low
    while down1 >= nranks:  # shrink the step until the right child exists
        low >>= 1
        down1 = rank + low if low else -1
    return up, [rank - (bit >> 1)] + ([down1] if down1 > 0 else [])


def double_binary_tree(nranks: int = 8) -> list[dict[int, int]]:
    """NCCL's two trees as {rank: parent} maps (the root's parent is -1)."""
    first = {r: btree(nranks, r)[0] for r in range(nranks)}
    if nranks % 2:  # odd: shift the first tree by one rank
        second = {(r + 1) % nranks: (p + 1) % nranks if p >= 0 else -1 for r, p in first.items()}
    else:  # even: mirror it
        second = {nranks - 1 - r: nranks - 1 - p if p >= 0 else -1 for r, p in first.items()}
    return [first, second]


def tree_depths(parents: dict[int, int]) -> dict[int, int]:
    """Each rank's depth in a tree given as {rank: parent} (the root's parent is -1)."""
    depth = {}
    for r in parents:
        d, p = 0, parents[r]
        while p >= 0:
            d, p = d + 1, parents[p]
        depth[r] = d
    return depth


def _draw_tree(ax: Axes, parents: dict[int, int], color: str, title: str) -> None:
    depth = tree_depths(parents)
    for r, p in parents.items():
        if p >= 0:
            ax.plot([p, r], [-depth[p], -depth[r]], color=color, lw=2, zorder=1)
    for r in parents:
        interior = any(p == r for p in parents.values())
        ax.scatter(r, -depth[r], s=520, color=color if interior else "white", edgecolor=color,
                   linewidth=2, zorder=2)  # fmt: skip
        ax.text(r, -depth[r], str(r), ha="center", va="center", zorder=3,
                color="white" if interior else color, fontsize=10, fontweight="bold")  # fmt: skip
    ax.set_title(title, fontsize=10)
    ax.set_xlim(-0.7, len(parents) - 0.3)
    ax.set_ylim(-max(depth.values()) - 0.6, 0.6)
    ax.axis("off")


def draw_double_binary_tree(nranks: int = 8) -> Figure:
    """NCCL's double binary tree over ``nranks`` nodes: every node is interior in at most one tree.

    Filled circles are interior nodes (they forward data), open circles are leaves.
    Each tree carries half of the message, so a node's sends are bounded in both trees
    together while latency grows as log2 of the node count.
    """
    trees = double_binary_tree(nranks)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for k, (ax, parents) in enumerate(zip(axes, trees)):
        root = next(r for r, p in parents.items() if p < 0)
        _draw_tree(
            ax,
            parents,
            _COLORS[k],
            f"tree {k}: root {root}, carries the {('first', 'second')[k]} half",
        )
    fig.suptitle(f"NCCL's double binary tree over {nranks} nodes (src/graph/trees.cc)")
    fig.tight_layout()
    return fig


def draw_binomial_tree_allreduce(world_size: int = 8) -> Figure:
    """ddtk's tree all-reduce as a space-time diagram: binomial reduce to rank 0, then broadcast.

    Computed by running :mod:`ddtk.comm.tree` on a recording transport. Columns are
    ranks, rows are rounds (time runs downwards); an arrow is one message, and every
    message carries the whole buffer.
    """
    reduce_msgs, bcast_msgs = binomial_tree_rounds(world_size)
    offset = max(t for t, _, _ in reduce_msgs)
    total = offset + max(t for t, _, _ in bcast_msgs)
    fig, ax = plt.subplots(figsize=(9, 0.55 * total + 1.6))
    for r in range(world_size):
        ax.plot([r, r], [0, total], color="0.85", lw=1, zorder=0)
        ax.text(r, -0.35, f"rank {r}", ha="center", va="bottom", fontsize=9)
    for messages, shift, color, label in ((reduce_msgs, 0, _COLORS[0], "reduce (add on arrival)"),
                                          (bcast_msgs, offset, _COLORS[1], "broadcast (copy)")):  # fmt: skip
        for t, src, dst in messages:
            ax.annotate("", xy=(dst, t + shift), xytext=(src, t + shift - 1),
                        arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.8})  # fmt: skip
        ax.plot([], [], color=color, lw=2, label=label)
    for t in range(1, total + 1):
        ax.text(world_size - 0.3, t, f"round {t}", va="center", fontsize=8, color="0.4")
    ax.axhline(offset, color="0.5", ls=":", lw=1)
    ax.set_xlim(-0.6, world_size + 0.5)
    ax.set_ylim(total + 0.4, -0.8)
    ax.axis("off")
    ax.legend(loc="upper center", bbox_to_anchor=(0.45, 0.0), ncol=2, fontsize=8, frameon=False)
    ax.set_title(f"ddtk tree all-reduce over {world_size} ranks: {total} rounds, "
                 f"each message the whole buffer (ddtk/comm/tree.py, replayed)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig
