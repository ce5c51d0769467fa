"""Network diagrams for lecture 04: a rail-optimised fat tree, NCCL's tree, two hierarchical all-reduces.

* :func:`draw_rail_optimized_fat_tree`: nodes of G GPUs, each GPU with its own NIC; NIC *i*
  of every node cabled to leaf switch *i* (rail *i*), every leaf cabled to every spine.
* :func:`draw_nccl_tree`: what NCCL builds for its tree algorithm, a chain through the GPUs
  of each node plus a double binary tree between nodes, computed with
  :func:`ddtk.viz.diagrams.collectives.double_binary_tree` (NCCL's ``ncclGetDtree``).
* :func:`draw_hierarchical_allreduce_forms`: ddtk's ``algorithm="hierarchical"`` (reduce to
  a leader, leaders' ring, broadcast) next to ``algorithm="hierarchical_rs"`` (Horovod's
  form: reduce-scatter, all-reduce of each shard across nodes, all-gather), with the bytes
  each sends across nodes from :func:`ddtk.comm.costmodel.cost_terms`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from ddtk.viz.diagrams.collectives import double_binary_tree, tree_depths

_RAILS = plt.get_cmap("tab10")
_TREES = ("#4c72b0", "#dd8452")


def _box(ax: Axes, x: float, y: float, w: float, h: float, label: str, color: str, **kw) -> None:
    ax.add_patch(Rectangle((x - w / 2, y - h / 2), w, h, facecolor=color, edgecolor="k", lw=0.8))
    ax.text(x, y, label, ha="center", va="center", fontsize=kw.get("fontsize", 7))


def _arrow(ax: Axes, a: tuple[float, float], b: tuple[float, float], color: str, **kw) -> None:
    ax.add_patch(
        FancyArrowPatch(
            a,
            b,
            arrowstyle="-|>",
            mutation_scale=8,
            color=color,
            lw=kw.get("lw", 1.2),
            connectionstyle=kw.get("style", "arc3"),
        )
    )


def draw_rail_optimized_fat_tree(
    nodes: int = 4, gpus_per_node: int = 8, spines: int = 4, oversubscription: float = 1.0
) -> Figure:
    """A two-tier rail-optimised fat tree: NIC *i* of every node on leaf *i*, leaves to spines.

    GPU *i* of any node reaches GPU *i* of any other node through one leaf switch, which
    is where NCCL keeps its rings (``NCCL_CROSS_NIC=0``). Traffic that changes rail (an
    all-to-all) crosses NVLink to the right GPU first (PXN) or climbs to a spine. With
    ``oversubscription`` > 1 the leaf-spine cables are drawn thinner.
    """
    fig, ax = plt.subplots(figsize=(12, 5.2))
    node_w = gpus_per_node * 0.55 + 0.3
    gap = 0.6
    width = nodes * node_w + (nodes - 1) * gap
    leaf_x = [width * (i + 0.5) / gpus_per_node for i in range(gpus_per_node)]
    spine_x = [width * (i + 0.5) / spines for i in range(spines)]
    for s, sx in enumerate(spine_x):
        _box(ax, sx, 5.0, 1.2, 0.45, f"spine {s}", "#e5e5e5", fontsize=8)
    for i, lx in enumerate(leaf_x):
        for sx in spine_x:
            ax.plot([lx, sx], [3.3, 4.78], color="0.55", lw=1.6 / oversubscription, zorder=0)
        _box(ax, lx, 3.3, 1.0, 0.42, f"leaf {i}\n(rail {i})", _RAILS(i % 10), fontsize=7)
    for n in range(nodes):
        x0 = n * (node_w + gap)
        ax.add_patch(Rectangle((x0, 0.0), node_w, 1.75, facecolor="#f7f7f7", edgecolor="k", lw=1))
        ax.text(x0 + node_w / 2, -0.25, f"node {n}: {gpus_per_node} GPUs on NVSwitch", ha="center",
                fontsize=8)  # fmt: skip
        ax.plot([x0 + 0.25, x0 + node_w - 0.25], [0.35, 0.35], color="#76b900", lw=3)
        for g in range(gpus_per_node):
            gx = x0 + 0.4 + g * 0.55
            _box(ax, gx, 0.75, 0.42, 0.35, f"G{g}", "#cfe8a9", fontsize=6)
            ax.plot([gx, gx], [0.57, 0.35], color="#76b900", lw=1)
            _box(ax, gx, 1.4, 0.42, 0.3, f"N{g}", _RAILS(g % 10), fontsize=6)
            ax.plot([gx, leaf_x[g]], [1.55, 3.09], color=_RAILS(g % 10), lw=0.9, alpha=0.8)
    ax.text(width + 0.2, 0.35, "NVLink /\nNVSwitch", fontsize=7, color="#4d7a00", va="center")
    ax.text(width + 0.2, 1.4, "one NIC\nper GPU", fontsize=7, va="center")
    ratio = "non-blocking" if oversubscription == 1 else f"{oversubscription:g}:1 oversubscribed"
    ax.set_title(
        f"Rail-optimised fat tree: {nodes} nodes x {gpus_per_node} GPUs/NICs, "
        f"{gpus_per_node} rail leaves, {spines} spines ({ratio})"
    )
    ax.set_xlim(-0.4, width + 1.2)
    ax.set_ylim(-0.5, 5.5)
    ax.axis("off")
    fig.tight_layout()
    return fig


def _tree_positions(parents: dict[int, int]) -> dict[int, tuple[float, float]]:
    depth = tree_depths(parents)
    return {r: (float(r), -2.2 * depth[r]) for r in parents}


def draw_nccl_tree(nodes: int = 8, gpus_per_node: int = 4) -> Figure:
    """NCCL's tree: a chain through each node's GPUs, and a double binary tree between nodes.

    Each panel is one of the two trees (each carries half of the data). A box is a node;
    inside it the GPUs form a chain (nccl #672: "Intra-node it's always a chain"), and one
    GPU of the chain talks to the node's parent and children in the inter-node binary tree
    (nccl #448: "The double binary tree concerns inter-node communication only"). A node
    that is interior in one tree is a leaf in the other, so every node sends and receives
    about the same in total. NCCL builds no 2D ring or other hierarchy beyond this.
    """
    trees = double_binary_tree(nodes)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    for k, (ax, parents) in enumerate(zip(axes, trees)):
        pos = _tree_positions(parents)
        color = _TREES[k]
        for r, p in parents.items():
            if p >= 0:
                (x0, y0), (x1, y1) = pos[p], pos[r]
                ax.plot([x0, x1], [y0 - 0.55, y1 + 0.55], color=color, lw=2.2, zorder=1)
        for r, (x, y) in pos.items():
            interior = any(p == r for p in parents.values())
            ax.add_patch(Rectangle((x - 0.42, y - 0.55), 0.84, 1.1, facecolor="white",
                                   edgecolor=color, lw=2.2 if interior else 1.0, zorder=2))  # fmt: skip
            ax.text(x, y + 0.72, f"node {r}", ha="center", fontsize=7, zorder=3)
            ys = [y + 0.4 - i * 0.8 / max(gpus_per_node - 1, 1) for i in range(gpus_per_node)]
            ax.plot([x] * gpus_per_node, ys, color="#76b900", lw=1.5, zorder=3)
            ax.scatter([x] * gpus_per_node, ys, s=22, color="#76b900", zorder=4)
        root = next(r for r, p in parents.items() if p < 0)
        ax.set_title(f"tree {k} (root node {root}): half of the data", fontsize=10)
        depth = -min(y for _, y in pos.values())
        ax.set_xlim(-0.8, nodes - 0.2)
        ax.set_ylim(-depth - 1.0, 1.2)
        ax.axis("off")
    fig.suptitle(
        f"NCCL's tree over {nodes} nodes x {gpus_per_node} GPUs: a chain inside each node "
        "(green), a double binary tree between nodes (src/graph/trees.cc)"
    )
    fig.tight_layout()
    return fig


def _rank_xy(node: int, local: int, group_size: int) -> tuple[float, float]:
    return node * (group_size + 1.2) + local, 0.0


def draw_hierarchical_allreduce_forms(nodes: int = 2, group_size: int = 4) -> Figure:
    """ddtk's two hierarchical all-reduces, phase by phase, for ``nodes`` groups of ``group_size``.

    Left, ``algorithm="hierarchical"``: a binomial-tree reduce to the leader (local rank 0),
    a ring all-reduce of the whole buffer among the leaders, a broadcast. Right,
    ``algorithm="hierarchical_rs"`` (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``): a ring
    reduce-scatter leaves local rank *j* with shard *j* summed over its node, the ranks with
    the same local rank all-reduce their shard across nodes (``group_size`` rings at once,
    one per GPU and NIC), and an all-gather rebuilds the buffer. The footers give the bytes
    per rank from :func:`ddtk.comm.costmodel.cost_terms`.
    """
    from ddtk.comm.costmodel import cost_terms

    n = nodes * group_size
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    phases = {
        "hierarchical": ("1. reduce to leader (tree)", "2. leaders' ring all-reduce", "3. broadcast"),
        "hierarchical_rs": ("1. reduce-scatter in node", "2. all-reduce shard j across nodes",
                            "3. all-gather in node"),
    }  # fmt: skip
    for ax, (algo, names) in zip(axes, phases.items()):
        for row, name in enumerate(names):
            y = -row * 2.0
            ax.text(-0.8, y + 0.9, name, fontsize=8, fontweight="bold")
            for node in range(nodes):
                for j in range(group_size):
                    x, _ = _rank_xy(node, j, group_size)
                    if algo == "hierarchical_rs":
                        for s in range(group_size):  # the buffer as group_size shards
                            owned = row == 2 or s == j
                            ax.add_patch(Rectangle((x - 0.35 + s * 0.7 / group_size, y - 0.2),
                                                   0.7 / group_size, 0.4, lw=0.4, edgecolor="k",
                                                   facecolor=_RAILS(s) if owned else "white"))  # fmt: skip
                    else:
                        full = row == 2 or j == 0
                        ax.add_patch(Rectangle((x - 0.35, y - 0.2), 0.7, 0.4, lw=0.6, edgecolor="k",
                                               facecolor="0.45" if full else "white"))  # fmt: skip
            for node in range(nodes):
                if algo == "hierarchical" and row in (0, 2):
                    for j in range(1, group_size):  # binomial tree: parent clears the lowest bit
                        x, _ = _rank_xy(node, j, group_size)
                        px, _ = _rank_xy(node, j & (j - 1), group_size)
                        a, b = (
                            ((x, y - 0.25), (px, y - 0.25))
                            if row == 0
                            else ((px, y - 0.25), (x, y - 0.25))
                        )
                        _arrow(ax, a, b, "0.3", style="arc3,rad=0.35")
                if algo == "hierarchical_rs" and row in (0, 2):
                    for j in range(group_size):
                        x, _ = _rank_xy(node, j, group_size)
                        x2, _ = _rank_xy(node, (j + 1) % group_size, group_size)
                        _arrow(ax, (x, y - 0.25), (x2, y - 0.25), "0.3", style="arc3,rad=0.3")
            if row == 1:
                for node in range(nodes):
                    nxt = (node + 1) % nodes
                    if nxt == node:
                        continue
                    lanes = [0] if algo == "hierarchical" else range(group_size)
                    for j in lanes:
                        a, _ = _rank_xy(node, j, group_size)
                        b, _ = _rank_xy(nxt, j, group_size)
                        color = "0.2" if algo == "hierarchical" else _RAILS(j)
                        _arrow(ax, (a, y + 0.22), (b, y + 0.22), color, lw=2.0 if algo == "hierarchical" else 1.2,
                               style=f"arc3,rad={-0.25 - 0.05 * j}")  # fmt: skip
        for node in range(nodes):
            x0, _ = _rank_xy(node, 0, group_size)
            ax.text(x0 + (group_size - 1) / 2, 1.45, f"node {node}", ha="center", fontsize=8)
        steps, factor = cost_terms(algo, n, group_size)
        inter = 2 * (nodes - 1) / nodes if nodes > 1 else 0.0
        across = (f"{inter:.3g} S on the leader's link" if algo == "hierarchical"
                  else f"{inter / group_size:.3g} S on each of {group_size} links")  # fmt: skip
        ax.text(-0.8, -5.0, f"{int(steps)} sequential steps; the busiest rank sends {factor:.3g} S\n"
                f"(one link per rank); across nodes: {across}", fontsize=8)  # fmt: skip
        ax.set_title(f'algorithm="{algo}"', fontsize=11)
        ax.set_xlim(-1.0, nodes * (group_size + 1.2) - 0.6)
        ax.set_ylim(-5.3, 1.7)
        ax.axis("off")
    fig.suptitle(
        f"Two hierarchical all-reduces, {nodes} nodes x {group_size} ranks (S: the buffer)"
    )
    fig.tight_layout()
    return fig
