"""The single-process recipe under DeepSpeed: the engine, a JSON config and ZeRO, on gloo here.

    torchrun --nproc-per-node 2 -m ddtk.examples.cnn_deepspeed --zero-stage 2
    deepspeed --num_gpus 2 --module ddtk.examples.cnn_deepspeed --zero-stage 2   # on GPUs

Changed from :mod:`ddtk.examples.cnn_single`: ``deepspeed.init_distributed``
(gloo on CPU, NCCL on GPUs); ``deepspeed.initialize`` wraps the model and the
optimizer in an engine configured by a JSON dict (micro-batch size, ZeRO stage);
``engine.backward`` and ``engine.step`` replace ``loss.backward()`` and
``optimizer.step()`` (the engine averages gradients, and under ZeRO shards the
optimizer state, the gradients (stage 2) and the parameters (stage 3)); one
shard of every epoch per rank; the learning rate scaled by the world size;
metrics summed with ``all_reduce``; ``save_checkpoint`` writes a folder in which
every rank saves its own shard.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

from ddtk.data import load_dataset, train_test_split
from ddtk.examples.cnn_common import build_parser, evaluate, parse_checked, warmup_lr
from ddtk.frameworks.deepspeed_shm import remove_shm_buffers
from ddtk.models import build_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line (:func:`~ddtk.examples.cnn_common.build_parser`) and this recipe's flags."""
    p = build_parser(__doc__.splitlines()[0])
    p.add_argument("--zero-stage", type=int, default=1, choices=(0, 1, 2, 3))
    p.add_argument(
        "--local_rank", type=int, default=0, help=argparse.SUPPRESS
    )  # the deepspeed launcher's
    return parse_checked(p, argv)


def _device(on_gpu: bool) -> torch.device:
    """This rank's GPU (``LOCAL_RANK``, set by torchrun and the deepspeed launcher), or the CPU."""
    import os

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if on_gpu else "cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    return device


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    device = _device(on_gpu)
    train, test = (
        dataclasses.replace(s, x=s.x.to(device), y=s.y.to(device))
        for s in train_test_split(load_dataset("digits"), seed=0)
    )
    lr = args.lr * size
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,  # ZeRO is tested with DeepSpeed's Adam family; SGD works
    }
    model = build_model("resnet", seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
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
            model.backward(nn.functional.cross_entropy(model(train.x[idx]), train.y[idx]))
            model.step()
            step += 1
        seconds = time.perf_counter() - start
        totals = torch.tensor(evaluate(model.module, test.x[rank::size], test.y[rank::size]), device=device)
        dist.all_reduce(totals)
        loss, correct = totals.tolist()
        seconds_max = torch.tensor(seconds, device=device)
        dist.all_reduce(seconds_max, op=dist.ReduceOp.MAX)
        metrics = {
            "epoch": epoch + 1,
            "loss": loss / len(test),
            "accuracy": correct / len(test),
            "images_per_s": steps_per_epoch * args.batch_size * size / seconds_max.item(),
        }
        if rank == 0:
            print(json.dumps(metrics), flush=True)
    if args.checkpoint:  # every rank writes its shard of the ZeRO state
        model.save_checkpoint(args.checkpoint)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": size, **vars(args)}, f)
    dist.destroy_process_group()
    remove_shm_buffers()  # DeepSpeed's CPU all-reduce segments, which it never unlinks
    return metrics


if __name__ == "__main__":
    main()
