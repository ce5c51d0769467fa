"""The single-process recipe made data parallel with PyTorch DDP, launched by ``torchrun``.

    torchrun --nproc-per-node 2 -m ddtk.examples.cnn_ddp --epochs 4

Changed from :mod:`ddtk.examples.cnn_single`: ``init_process_group`` (gloo here;
NCCL with ``torch.cuda.set_device(LOCAL_RANK)`` on GPUs) from the variables
torchrun sets; the model wrapped in ``DistributedDataParallel`` (which broadcasts
rank 0's weights and buffers at construction and averages gradients in buckets
during backward); one shard of every epoch per rank; the learning rate scaled by
the world size; test metrics summed with ``all_reduce``; rank 0 alone prints,
saves and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddtk.data import load_dataset, train_test_split
from ddtk.examples.cnn_common import build_parser, evaluate, parse_checked, warmup_lr
from ddtk.models import build_model
from ddtk.process_exit import exit_without_static_destructors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line (:func:`~ddtk.examples.cnn_common.build_parser`) and this recipe's flags."""
    p = build_parser(__doc__.splitlines()[0])
    return parse_checked(p, argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    train, test = train_test_split(load_dataset("digits"), seed=0)
    model = DDP(build_model("resnet", seed=0))
    lr = args.lr * size
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    steps_per_epoch = len(train) // (args.batch_size * size)
    step, metrics = 0, {}
    for epoch in range(args.epochs):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))
        order = order[rank::size]
        start = time.perf_counter()
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size : (i + 1) * args.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = warmup_lr(step, steps_per_epoch, lr, args.warmup_epochs)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(train.x[idx]), train.y[idx]).backward()
            optimizer.step()
            step += 1
        seconds = time.perf_counter() - start
        totals = torch.tensor(evaluate(model.module, test.x[rank::size], test.y[rank::size]))
        dist.all_reduce(totals)
        loss, correct = totals.tolist()
        seconds_max = torch.tensor(seconds)
        dist.all_reduce(seconds_max, op=dist.ReduceOp.MAX)
        metrics = {
            "epoch": epoch + 1,
            "loss": loss / len(test),
            "accuracy": correct / len(test),
            "images_per_s": steps_per_epoch * args.batch_size * size / seconds_max.item(),
        }
        if rank == 0:
            print(json.dumps(metrics), flush=True)
    if args.checkpoint and rank == 0:
        torch.save(model.module.state_dict(), args.checkpoint)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": size, **vars(args)}, f)
    dist.destroy_process_group()
    return metrics


if __name__ == "__main__":
    main()
    exit_without_static_destructors()  # torch 2.13 DDP on gloo can abort at teardown
