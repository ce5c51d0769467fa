"""DDP's knobs in one short recipe: buckets, SyncBatchNorm, ``no_sync`` accumulation, ``join``.

    torchrun --nproc-per-node 2 -m ddtk.examples.ddp_features --uneven 2

Every call here is PyTorch's own public API, on gloo and CPU (NCCL and
``device_ids=[local_rank]`` on GPUs):

* ``nn.SyncBatchNorm.convert_sync_batchnorm`` swaps every BatchNorm for one whose
  batch statistics are all-reduced over the ranks (its forward is a collective);
  DDP accepts it only in a CUDA module, so ``--sync-bn`` defaults to on only there;
* ``DistributedDataParallel(model, bucket_cap_mb=..., gradient_as_bucket_view=True)``
  sets the Reducer's bucket size and lets each ``.grad`` be a view into its bucket;
* ``model.no_sync()`` skips the all-reduce for the first ``accumulate - 1``
  micro-batches of a step: the gradients accumulate locally and the last backward
  all-reduces their sum once;
* ``model.join()`` (the ``Join`` context manager) lets a rank whose data ran out
  keep answering the others' collectives, so uneven shards do not hang the job.

Rank ``r`` gets ``--uneven * r`` fewer optimizer steps than rank 0. Each rank prints
one JSON line; at the end the ranks check that their weights are identical.
"""

import argparse
import json
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ddtk.process_exit import exit_without_static_destructors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="optimizer steps on rank 0")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--uneven", type=int, default=2, help="steps fewer per rank index")
    p.add_argument("--bucket-cap-mb", type=float, default=0.01)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available(),
                   help="SyncBatchNorm (default: on where CUDA is)")  # fmt: skip
    return p.parse_args(argv)


def build_model() -> nn.Module:
    """A small CNN with BatchNorm: 8x8 digits-sized inputs, 10 classes."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 8 * 8, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    model = build_model()
    if args.sync_bn:  # GPU only: DDP refuses SyncBatchNorm in a CPU module (ValueError)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counts = {"all_reduces": 0}

    def counting_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        counts["all_reduces"] += 1  # per bucket sent; a joined rank's shadow all-reduces count too
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)

    my_steps = max(1, args.steps - args.uneven * rank)  # uneven shards: rank 1 runs out first
    gen = torch.Generator().manual_seed(rank)
    with model.join():  # a finished rank shadows the others' all-reduces until all are done
        for _ in range(my_steps):
            optimizer.zero_grad()
            for micro in range(args.accumulate):
                x = torch.randn(args.micro_batch, 1, 8, 8, generator=gen)
                y = torch.randint(0, 10, (args.micro_batch,), generator=gen)
                last = micro == args.accumulate - 1
                with nullcontext() if last else model.no_sync():  # all-reduce on the last only
                    loss = nn.functional.cross_entropy(model(x), y) / args.accumulate
                    loss.backward()
            optimizer.step()

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    spread -= flat
    report = {
        "rank": rank,
        "optimizer_steps": my_steps,
        "micro_batches": my_steps * args.accumulate,
        "bucket_all_reduces": counts["all_reduces"],
        "sync_batchnorm_layers": sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules()),
        "max_weight_difference_to_other_ranks": spread.abs().max().item(),
        "last_loss": loss.item() * args.accumulate,
    }
    for r in range(size):  # one line per rank, in rank order
        if r == rank:
            print(json.dumps(report), flush=True)
        dist.barrier()
    dist.destroy_process_group()
    return report


if __name__ == "__main__":
    main()
    exit_without_static_destructors()  # torch 2.13 DDP on gloo can abort at teardown
