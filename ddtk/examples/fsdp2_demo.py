"""FSDP2 in one page: ``fully_shard`` per block, then on the root, with a mixed-precision policy.

    torchrun --nproc-per-node 2 -m ddtk.examples.fsdp2_demo --steps 4 --precision bf16

Each rank keeps one shard (a row slice, ``Shard(dim=0)``) of every parameter as a
``DTensor``. Before a block's forward, FSDP2 all-gathers that block's parameters
(in ``param_dtype``), and frees them after; in backward it gathers them again and
reduce-scatters the gradients (in ``reduce_dtype``), so each rank's optimizer
updates only its own fp32 shard. The data are split as in DDP: every rank takes
its slice of the global batch. With the fp32 policy the losses equal those of the
unsharded model trained on the whole batch (:func:`reference_losses`) up to
rounding; with bf16 compute they agree to bf16's precision.

On GPUs: ``init_process_group("nccl")``, ``torch.cuda.set_device(LOCAL_RANK)``,
model and data on ``cuda``; the rest is unchanged.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

DIM, CLASSES, BLOCKS, BATCH, LR = 64, 8, 3, 32, 0.1


def build_model(seed: int = 0) -> nn.Sequential:
    """Three residual-free MLP blocks and a head: small enough for two CPU ranks."""
    torch.manual_seed(seed)
    blocks = [
        nn.Sequential(nn.Linear(DIM, DIM), nn.LayerNorm(DIM), nn.GELU()) for _ in range(BLOCKS)
    ]
    return nn.Sequential(*blocks, nn.Linear(DIM, CLASSES))


def batches(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches of the run, identical on every rank (each rank then takes its slice)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, DIM, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
            for _ in range(steps)]  # fmt: skip


def policy(precision: str) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction (the usual GPU setting), or fp32 throughout."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # param_dtype=None: compute in the parameters' own fp32


def train(steps: int = 4, precision: str = "bf16") -> dict:
    """Shard the model over the initialised process group, train ``steps`` steps, return what happened."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model()
    mp = policy(precision)
    for block in model[:-1]:  # one FSDP unit per block: gathered just before its forward
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # the root: the head's parameters, and the step's bookkeeping
    first = model[0][0].weight  # a DTensor now
    shards = {"type": type(first).__name__, "global_shape": tuple(first.shape),
              "local_shape": tuple(first.to_local().shape), "placements": str(first.placements),
              "dtype": str(first.dtype)}  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)  # steps the local fp32 shards
    losses = []
    for x, y in batches(steps):
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]  # this rank's slice of the global batch
        loss = nn.functional.cross_entropy(model(xs), ys)
        loss.backward()  # gradients are reduce-scattered (averaged) block by block
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)  # the global batch's loss: the mean of the ranks' equal slices
        losses.append(mean.item() / world)
    return {"rank": rank, "world_size": world, "precision": precision, "losses": losses, **shards}


def reference_losses(steps: int = 4) -> list[float]:
    """The same model, data and optimizer in one process, unsharded, fp32: what FSDP2 must reproduce."""
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def rank_main(ctx, steps: int = 4, precision: str = "bf16") -> dict:
    """Entry point for ``ddtk.launch`` (which has initialised the process group)."""
    return train(steps, precision)


def main(argv: list[str] | None = None) -> dict:
    """torchrun entry point: join the group from torchrun's variables, train, report on rank 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    try:
        out = train(args.steps, args.precision)
    finally:
        dist.destroy_process_group()
    if out["rank"] == 0:
        ref = reference_losses(args.steps)
        print(
            f"{out['type']} {out['global_shape']} -> local shard {out['local_shape']} {out['placements']}"
        )
        for step, (a, b) in enumerate(zip(out["losses"], ref)):
            print(f"step {step}: FSDP2 ({args.precision}) {a:.5f}  unsharded fp32 {b:.5f}")
    return out


if __name__ == "__main__":
    main()
