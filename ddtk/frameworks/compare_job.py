"""One rank of the framework comparison: every torch framework trains in the same processes, interleaved.

Run under ``horovodrun`` (which starts the ranks and Horovod's rendezvous); the
ranks then also form a ``torch.distributed`` gloo group for DDP, DeepSpeed and
ddtk, so all of them share processes, data and machine noise::

    horovodrun --gloo -np 2 -H localhost:2 python -m ddtk.frameworks.compare_job \\
        --frameworks ddp,horovod,deepspeed-zero1,ddtk-dp --steps 20 --rounds 3 --json out.json

Every contender starts from the same weights (``build_model("resnet", seed=0)``)
with SGD (momentum 0.9, learning rate scaled by the world size) and takes the
same batches: step ``s`` uses a seeded global batch of ``batch_size * world``
digits, rank ``r`` its ``r``-th slice (weak scaling). A round is ``--steps``
steps of one contender, timed from a barrier to the slowest rank's end; rounds
cycle through the contenders ``--rounds`` times. Rank 0 writes, per contender,
the median round's samples/s, the model-state bytes each rank holds after backward
(:func:`ddtk.frameworks.state.state_bytes`, max over ranks), the last loss, and
the process's peak RSS (meaningful only when one contender runs alone).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TORCH_FRAMEWORKS = ("ddp", "horovod", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "ddtk-dp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frameworks", default=",".join(TORCH_FRAMEWORKS))
    p.add_argument("--steps", type=int, default=20, help="steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    unknown = set(args.frameworks.split(",")) - set(TORCH_FRAMEWORKS)
    if unknown:
        p.error(f"unknown framework(s) {sorted(unknown)}; choose from {', '.join(TORCH_FRAMEWORKS)}")
    if min(args.steps, args.rounds, args.batch_size) < 1:
        p.error("--steps, --rounds and --batch-size must be >= 1")
    return args


def init_groups() -> tuple[int, int]:
    """Horovod first (horovodrun started us), then a gloo group on a port rank 0 chose."""
    import horovod.torch as hvd
    import torch.distributed as dist

    from ddtk.frameworks.launchers import free_port

    hvd.init()
    # The name must match on every rank: by default it is the type of `obj` (int vs NoneType: a hang).
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, 0, name="master_port")
    os.environ.update(
        RANK=str(hvd.rank()), WORLD_SIZE=str(hvd.size()), LOCAL_RANK=str(hvd.local_rank()),
        LOCAL_WORLD_SIZE=str(hvd.local_size()), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    dist.init_process_group("gloo")
    return hvd.rank(), hvd.size()


@dataclass
class Contender:
    """One framework's training step, split where its state peaks: after backward, before the update."""

    backward: Callable[[torch.Tensor, torch.Tensor], float]
    update: Callable[[], None]
    holders: tuple  # the objects that hold its model state, for state_bytes

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        loss = self.backward(x, y)
        self.update()
        return loss


def deepspeed_config(stage: int, n_params: int) -> dict:
    """ZeRO ``stage`` with buckets that hold the whole model, as DDP's do for a model this small.

    DeepSpeed allocates its buckets at their configured size (5e8 elements, 2 GB in
    fp32, by default for ZeRO-3's reduce bucket); DDP's hold only the parameters
    assigned to them. ``stage3_param_persistence_threshold: 0`` partitions every
    parameter (by default those under 1e5 elements stay whole on every rank, which
    here would be all of them).
    """
    return {
        "train_micro_batch_size_per_gpu": 1,  # bookkeeping only: the loop feeds the batches
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": n_params,
            "allgather_bucket_size": n_params,
            "stage3_prefetch_bucket_size": n_params,
            "stage3_param_persistence_threshold": 0,
        },
        "zero_allow_untested_optimizer": True,  # ZeRO is tested with DeepSpeed's Adam family
    }


def build(name: str, lr: float) -> Contender:
    """The contender called ``name``, from the same initial weights as every other."""
    from ddtk.models import build_model, count_parameters

    model = build_model("resnet", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # gradient_as_bucket_view: .grad are views into the Reducer's buckets, so the
        # buckets are counted once, through the gradients.
        ddp = DDP(model, gradient_as_bucket_view=True)
        return _plain(ddp, opt, (ddp, opt))
    if name == "horovod":
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        return _plain(model, dopt, (model, dopt))
    if name.startswith("deepspeed"):
        import deepspeed

        config = deepspeed_config(int(name[-1]), count_parameters(model))
        engine, dopt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

        def ds_backward(x: torch.Tensor, y: torch.Tensor) -> float:
            loss = nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            return loss.item()

        return Contender(ds_backward, engine.step, (engine.module, dopt))
    from ddtk.comm.context import DistributedContext
    from ddtk.parallel.data_parallel import DataParallel

    trainer = DataParallel(DistributedContext.from_env(validate=False), model, optimizer=opt)
    return _plain(model, opt, (model, opt, trainer))  # its backward hooks do the averaging


def _plain(model: nn.Module, opt: Any, holders: tuple) -> Contender:
    """zero_grad, forward, backward / step: DDP, Horovod and ddtk share this loop."""

    def backward(x: torch.Tensor, y: torch.Tensor) -> float:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.item()

    return Contender(backward, opt.step, holders)


def batches(batch_size: int, rank: int, world: int, steps: int):
    """This rank's slice of each step's seeded global batch (the same for every contender)."""
    from ddtk.data import load_dataset

    data = load_dataset("digits")
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        idx = torch.randint(len(data), (batch_size * world,), generator=g)[rank::world]
        out.append((data.x[idx], data.y[idx]))
    return out


def _max_over_ranks(value: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rank, world = init_groups()
    import torch.distributed as dist

    from ddtk.frameworks.state import state_bytes

    names = args.frameworks.split(",")
    data = batches(args.batch_size, rank, world, args.steps)
    contenders = {name: build(name, args.lr * world) for name in names}
    held = {}
    for name, c in contenders.items():  # two warm-up steps; the state is measured in the second
        c.step(*data[0])  # (after backward, with the optimizer's state already there)
        c.backward(*data[1 % len(data)])
        held[name] = int(_max_over_ranks(state_bytes(*c.holders)))
        c.update()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    losses: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, c in contenders.items():
            dist.barrier()
            start = time.perf_counter()
            for x, y in data:
                losses[name] = c.step(x, y)
            seconds[name].append(_max_over_ranks(time.perf_counter() - start))
    rows = []
    for name in contenders:
        rows.append({
            "framework": name,
            "world_size": world,
            "samples_per_s": world * args.batch_size * args.steps / statistics.median(seconds[name]),
            "round_seconds": seconds[name],
            "state_bytes_per_rank": held[name],
            "last_loss": losses[name],
        })  # fmt: skip
    peak = _max_over_ranks(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "peak_rss_bytes": int(peak), **vars(args)}, f)
    dist.destroy_process_group()
    import horovod.torch as hvd

    hvd.shutdown()


if __name__ == "__main__":
    from ddtk.process_exit import exit_without_static_destructors

    main()
    exit_without_static_destructors()  # torch 2.13 DDP on gloo can abort at teardown
