"""The single-process recipe made data parallel with Horovod: lab 02's job.

    horovodrun --gloo -np 2 -H localhost:2 python -m ddtk.examples.cnn_horovod --epochs 4

The Horovod recipe, and nothing else, changed from :mod:`ddtk.examples.cnn_single`:
``hvd.init()``; one shard of every epoch per rank; the learning rate scaled by
``hvd.size()`` (with the same linear warm-up); rank 0's parameters and optimizer
state broadcast before the first step; ``hvd.DistributedOptimizer`` averaging the
gradients (``--fp16-allreduce`` sends them as float16); test metrics averaged
over the ranks with ``hvd.allreduce``; rank 0 alone prints, saves the checkpoint
and writes ``--json``. The same command runs on a cluster with ``-H node1:8,node2:8``
(``deploy/kubeflow/horovod-mpijob.yaml`` and ``deploy/slurm/horovod.sbatch``).
"""

from __future__ import annotations

import argparse
import json
import time

import horovod.torch as hvd
import torch
from torch import nn

from ddtk.data import load_dataset, train_test_split
from ddtk.examples.cnn_common import build_parser, evaluate, parse_checked, warmup_lr
from ddtk.models import build_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line (:func:`~ddtk.examples.cnn_common.build_parser`) and this recipe's flags."""
    p = build_parser(__doc__.splitlines()[0])
    p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    return parse_checked(p, argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(args.threads)
    train, test = train_test_split(load_dataset("digits"), seed=0)
    model = build_model("resnet", seed=0)
    lr = args.lr * hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # wrap first: DistributedOptimizer builds a new optimizer, which state given before would miss
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    steps_per_epoch = len(train) // (args.batch_size * hvd.size())
    step, metrics = 0, {}
    for epoch in range(args.epochs):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))
        order = order[hvd.rank() :: hvd.size()]
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
        shard = slice(hvd.rank(), None, hvd.size())
        loss, correct = evaluate(model, test.x[shard], test.y[shard])
        loss, correct = hvd.allreduce(torch.tensor([loss, correct]), op=hvd.Sum).tolist()
        seconds = hvd.allreduce(torch.tensor(seconds), op=hvd.Max).item()
        metrics = {
            "epoch": epoch + 1,
            "loss": loss / len(test),
            "accuracy": correct / len(test),
            "images_per_s": steps_per_epoch * args.batch_size * hvd.size() / seconds,
        }
        if hvd.rank() == 0:
            print(json.dumps(metrics), flush=True)
    if args.checkpoint and hvd.rank() == 0:
        torch.save(model.state_dict(), args.checkpoint)
    if args.json and hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": hvd.size(), **vars(args)}, f)
    return metrics


if __name__ == "__main__":
    main()
