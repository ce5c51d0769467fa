"""Train the ResNet-style CNN on digits in one process: the baseline every recipe changes.

    python -m ddtk.examples.cnn_single --epochs 4

The distributed recipes beside it (``cnn_ddp``, ``cnn_horovod``, ``cnn_deepspeed``,
``cnn_ddtk``) are this file with the fewest changes each framework needs, so
``difflib`` between them counts the "lines changed from single-process code" of
lecture 03's comparison (:func:`ddtk.frameworks.recipes.lines_changed`).

Each epoch prints one JSON line (``epoch``, ``loss``, ``accuracy``, ``images_per_s``);
``--json`` writes the last one plus the run's settings. The learning rate warms
up linearly over ``--warmup-epochs`` to ``--lr``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from ddtk.data import load_dataset, train_test_split
from ddtk.examples.cnn_common import build_parser, evaluate, parse_checked, warmup_lr
from ddtk.models import build_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line (:func:`~ddtk.examples.cnn_common.build_parser`) and this recipe's flags."""
    p = build_parser(__doc__.splitlines()[0])
    return parse_checked(p, argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    train, test = train_test_split(load_dataset("digits"), seed=0)
    model = build_model("resnet", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = len(train) // args.batch_size
    step, metrics = 0, {}
    for epoch in range(args.epochs):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))
        start = time.perf_counter()
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size : (i + 1) * args.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = warmup_lr(step, steps_per_epoch, args.lr, args.warmup_epochs)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(train.x[idx]), train.y[idx]).backward()
            optimizer.step()
            step += 1
        seconds = time.perf_counter() - start
        loss, correct = evaluate(model, test.x, test.y)
        metrics = {
            "epoch": epoch + 1,
            "loss": loss / len(test),
            "accuracy": correct / len(test),
            "images_per_s": steps_per_epoch * args.batch_size / seconds,
        }
        print(json.dumps(metrics), flush=True)
    if args.checkpoint:
        torch.save(model.state_dict(), args.checkpoint)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": 1, **vars(args)}, f)
    return metrics


if __name__ == "__main__":
    main()
