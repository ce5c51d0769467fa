"""Ray's architecture and Ray Train V2's run structure, as lecture 02 explains them.

``draw_ray_architecture`` shows a two-node cluster: the head node's GCS, a raylet and a
shared-memory object store on every node, worker processes, and the driver that owns an
object, with the three paths a task takes (lease and submission, object transfer, and the
owner's bookkeeping). ``draw_train_v2`` shows what ``TorchTrainer.fit()`` starts: the
controller actor, the placement group with one bundle per worker, the worker group that
forms one ``torch.distributed`` process group, and where ``ray.train.report`` goes.
Sources: the Ray v2 architecture white paper (2022), Wang et al., *Ownership* (NSDI 2021),
and ``ray/train/v2/_internal/execution`` (controller, worker_group) in Ray 2.60.
"""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

_COLORS = {
    "node": "#f4f4f4",
    "gcs": "#f6c85f",
    "raylet": "#9dc3e6",
    "store": "#b9e0a5",
    "worker": "#ffffff",
    "owner": "#f4a582",
    "controller": "#f6c85f",
    "bundle": "#e8eef7",
}


def _box(ax, x: float, y: float, w: float, h: float, text: str, color: str, **kw) -> None:
    """A rounded box with centred text; (x, y) is the lower-left corner."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            fc=color,
            ec=kw.pop("ec", "black"),
            lw=kw.pop("lw", 1.0),
        )
    )
    ax.text(
        x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=kw.pop("fontsize", 8), **kw
    )


def _arrow(ax, start, end, color: str, label: str = "", style: str = "-", rad: float = 0.0,
           label_at: float = 0.5, offset: tuple[float, float] = (0.0, 0.12)) -> None:  # fmt: skip
    """An arrow from start to end, labelled near `label_at` of the way along it."""
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=12,
            color=color,
            lw=1.6,
            linestyle=style,
            connectionstyle=f"arc3,rad={rad}",
        )
    )
    if label:
        x = start[0] + (end[0] - start[0]) * label_at + offset[0]
        y = start[1] + (end[1] - start[1]) * label_at + offset[1]
        ax.text(x, y, label, ha="center", va="center", fontsize=7.5, color=color,
                bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1})  # fmt: skip


def draw_ray_architecture(*, workers_per_node: int = 2, title: str | None = None) -> Figure:
    """Two Ray nodes: GCS on the head, a raylet and object store per node, workers, an owner.

    The driver on the head node submits a task that runs on node 2 and owns its result:
    (1) the driver asks its raylet for a worker lease, which spills back to node 2's raylet;
    (2) the driver sends the task straight to the leased worker; (3) the result goes into
    node 2's object store and only its location goes to the owner; (4) a ``ray.get`` on the
    head pulls the object between the object stores. The GCS sees none of these steps.
    """
    fig, ax = plt.subplots(figsize=(11, 5.6))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 6.2)
    ax.axis("off")
    ax.set_title(title or "Ray's architecture: who talks to whom when a task runs on another node")

    nodes = {"head node": 0.2, "node 2": 5.8}
    width = 4.4 / workers_per_node - 0.15
    for name, x0 in nodes.items():
        ax.add_patch(FancyBboxPatch((x0, 0.2), 5.0, 5.2, boxstyle="round,pad=0.02,rounding_size=0.15",
                                    fc=_COLORS["node"], ec="grey", lw=1.2))  # fmt: skip
        ax.text(x0 + 0.15, 5.25, name, fontsize=10, fontweight="bold", va="top")
        _box(
            ax,
            x0 + 0.3,
            3.4,
            2.1,
            0.8,
            "raylet\nscheduler, worker pool,\nobject manager",
            _COLORS["raylet"],
        )
        _box(ax, x0 + 0.3, 0.35, 4.4, 0.65, "shared-memory object store (/dev/shm)\nimmutable objects; zero-copy reads on this node",
             _COLORS["store"], fontsize=7.5)  # fmt: skip
        for i in range(workers_per_node):
            x = x0 + 0.3 + i * (width + 0.15)
            is_owner = name == "head node" and i == 0
            label = "driver = owner\nref counts, locations,\nlineage of its objects" if is_owner else f"worker process {i + 1}\n(core worker)"  # fmt: skip
            _box(
                ax, x, 1.55, width, 1.1, label, _COLORS["owner"] if is_owner else _COLORS["worker"]
            )
    # The GCS lives on the head node only.
    _box(
        ax,
        2.8,
        3.4,
        2.2,
        1.4,
        "GCS\nnodes, actors,\nplacement groups, jobs,\nKV store",
        _COLORS["gcs"],
    )

    owner_x = 0.5 + width / 2
    remote_x = 5.8 + 0.3 + (workers_per_node - 1) * (width + 0.15) + width / 2
    # (1) lease request: owner -> local raylet, which spills back to node 2's raylet
    _arrow(ax, (owner_x - 0.3, 2.65), (owner_x - 0.3, 3.4), "C0", "1 lease", offset=(-0.45, 0.0))
    _arrow(
        ax,
        (1.6, 4.2),
        (6.9, 4.2),
        "C0",
        "1 spillback: node 2 has a free CPU",
        rad=-0.4,
        offset=(0.0, 1.05),
    )
    # (2) the owner sends the task straight to the leased worker
    _arrow(ax, (owner_x + 0.3, 2.65), (remote_x, 2.65), "C0", "2 task spec, gRPC, owner -> leased worker",
           rad=-0.08, offset=(1.2, 0.42))  # fmt: skip
    # (3) the result is stored on node 2; only its location goes to the owner
    _arrow(ax, (remote_x + 0.4, 1.55), (remote_x + 0.4, 1.0), "C2", "3 result", offset=(0.55, 0.0))
    _arrow(ax, (remote_x - 0.2, 1.55), (owner_x + 0.2, 1.55), "C3", "3 its location -> owner (ownership)",
           style="--", rad=0.06, offset=(0.0, -0.3))  # fmt: skip
    # (4) ray.get on the head: the object managers pull the object between stores
    _arrow(ax, (6.1, 0.6), (4.7, 0.6), "C2")
    ax.text(5.4, 0.3, "4 ray.get\npulls it", ha="center", fontsize=7, color="C2")
    # GCS: liveness and resource views only
    _arrow(ax, (2.4, 3.8), (2.8, 3.8), "grey", style=":")
    _arrow(ax, (6.3, 4.2), (5.0, 4.5), "grey", style=":")
    ax.text(
        7.9,
        4.55,
        "raylets report liveness\nand resources to the GCS",
        fontsize=7,
        color="grey",
        ha="center",
    )
    ax.text(0.2, 0.0, "blue: scheduling and submission   green: object data   red dashed: ownership metadata   "
            "grey dotted: cluster metadata (not on a task's path)", fontsize=7.5)  # fmt: skip
    fig.tight_layout()
    return fig


def draw_train_v2(*, num_workers: int = 2, title: str | None = None) -> Figure:
    """What ``TorchTrainer.fit()`` starts in Ray Train V2, and where a report goes.

    The driver starts one controller actor; the controller reserves a placement group with
    one bundle per worker and starts one worker actor in each; the workers form one
    process group (rank 0's address is MASTER_ADDR); ``ray.train.report`` from every worker
    goes to the controller, and a checkpoint directory goes to ``storage_path``.
    """
    fig, ax = plt.subplots(figsize=(10, 4.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 5)
    ax.axis("off")
    ax.set_title(
        title
        or f"Ray Train V2: the controller, its worker group ({num_workers} workers) and storage"
    )
    _box(ax, 0.2, 3.6, 1.9, 0.9, "driver\ntrainer.fit()", _COLORS["owner"])
    _box(ax, 3.0, 3.6, 2.6, 0.9, "TrainController actor\nplacement, failure policy,\nreports, checkpoints", _COLORS["controller"])  # fmt: skip
    _box(
        ax,
        7.2,
        3.6,
        2.6,
        0.9,
        "storage_path\n(NFS, s3://, gs://)\ncheckpoints, results",
        _COLORS["store"],
    )
    _arrow(ax, (2.1, 4.05), (3.0, 4.05), "C0", "start", offset=(0.0, 0.2))
    ax.add_patch(FancyBboxPatch((0.8, 0.3), 8.4, 2.4, boxstyle="round,pad=0.02,rounding_size=0.12",
                                fc=_COLORS["bundle"], ec="grey", ls="--"))  # fmt: skip
    ax.text(
        0.95,
        2.55,
        "placement group: one bundle per worker (ScalingConfig, PACK by default)",
        fontsize=8,
        va="top",
    )
    width = 8.0 / num_workers - 0.3
    centres = []
    for rank in range(num_workers):
        x = 1.0 + rank * (width + 0.3)
        role = "MASTER_ADDR:PORT" if rank == 0 else "joins rank 0"
        _box(ax, x, 0.6, width, 1.5, f"worker actor, rank {rank}\ntrain_func(config)\n{role}\n"
             "get_dataset_shard('train')", _COLORS["worker"])  # fmt: skip
        centres.append(x + width / 2)
        _arrow(ax, (4.3, 3.6), (x + width / 2, 2.1), "C0")
        _arrow(ax, (x + width / 2 + 0.25, 2.1), (4.6, 3.6), "C3", style="--")
    for a, b in itertools.pairwise(centres):
        _arrow(
            ax,
            (a + 0.4, 0.75),
            (b - 0.4, 0.75),
            "C1",
            "process group (gloo / NCCL)",
            offset=(0.0, -0.25),
        )
    _arrow(ax, (5.6, 4.05), (7.2, 4.05), "C2", "persist checkpoint", offset=(0.0, 0.2))
    ax.text(5.0, 3.05, "blue: start workers, set up the group   red dashed: ray.train.report (every worker, same count)",
            ha="center", fontsize=7.5)  # fmt: skip
    fig.tight_layout()
    return fig
