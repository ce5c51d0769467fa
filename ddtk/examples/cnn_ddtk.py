"""The single-process recipe made data parallel with ddtk's own ``DataParallel``, under ``torchrun``.

    torchrun --nproc-per-node 2 -m ddtk.examples.cnn_ddtk --epochs 4

Changed from :mod:`ddtk.examples.cnn_single`: a :class:`~ddtk.DistributedContext`
from torchrun's variables; :class:`~ddtk.parallel.data_parallel.DataParallel`
owns the step (it broadcasts rank 0's weights, and averages gradients in buckets
with ddtk's ring all-reduce, launched from backward hooks); one shard of every
epoch per rank; the learning rate scaled by the world size; metrics summed with
``ctx.all_reduce``; rank 0 alone prints, saves and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ddtk import DistributedContext
from ddtk.data import load_dataset, train_test_split
from ddtk.examples.cnn_common import build_parser, evaluate, parse_checked, warmup_lr
from ddtk.models import build_model
from ddtk.parallel.data_parallel import DataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line (:func:`~ddtk.examples.cnn_common.build_parser`) and this recipe's flags."""
    p = build_parser(__doc__.splitlines()[0])
    return parse_checked(p, argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ctx = DistributedContext.from_env(backend="gloo")
    rank, size = ctx.rank, ctx.world_size
    torch.set_num_threads(args.threads)
    train, test = train_test_split(load_dataset("digits"), seed=0)
    model = build_model("resnet", seed=0)
    lr = args.lr * size
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    trainer = DataParallel(ctx, model, optimizer=optimizer)
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
            trainer.train_step(train.x[idx], train.y[idx])
            step += 1
        seconds = time.perf_counter() - start
        totals = ctx.all_reduce(torch.tensor(evaluate(model, test.x[rank::size], test.y[rank::size])))
        loss, correct = totals.tolist()
        seconds = ctx.all_reduce(torch.tensor(seconds), op="max").item()
        metrics = {
            "epoch": epoch + 1,
            "loss": loss / len(test),
            "accuracy": correct / len(test),
            "images_per_s": steps_per_epoch * args.batch_size * size / seconds,
        }
        if rank == 0:
            print(json.dumps(metrics), flush=True)
    trainer.close()
    if args.checkpoint and rank == 0:
        torch.save(model.state_dict(), args.checkpoint)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": size, **vars(args)}, f)
    return metrics


if __name__ == "__main__":
    main()
