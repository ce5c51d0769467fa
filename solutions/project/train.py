"""Data parallel + ZeRO-1 training of the byte-level GPT, with atomic sharded checkpoints and resume.

Run it the way a job runs at work::

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 train.py --steps 60 --every 10 --out /tmp/run

* **Data parallel**: every rank holds the whole model and computes on its slice
  of the global batch (``gpt.rank_batch``); the global batch, and so the
  training, does not depend on the world size.
* **ZeRO stage 1** (:class:`ddtk.parallel.zero.ZeroOptimizer`): gradients are
  averaged with an all-reduce, each rank keeps the AdamW state of its shard of
  the flat parameters only, steps that shard, and an all-gather brings every
  rank the updated parameters. See DESIGN.md for why stage 1.
* **Checkpoints** every ``--every`` steps (:func:`ddtk.checkpoint.save_sharded`):
  each rank writes its shard atomically, rank 0 writes the manifest with sizes
  and sha256 last; ``step-NNNNNN/manifest.json`` existing means committed.
* **Resume**: a (re)started rank loads the newest good checkpoint
  (:func:`ddtk.checkpoint.load_zero`) and goes on from its step; under torchrun
  ``--max-restarts`` a SIGKILLed rank costs at most the steps since the last commit.

Outputs under ``--out``: ``checkpoints/step-NNNNNN/`` and ``metrics/rank-<r>.json``
(the fields ``ddtk project check`` reads, plus the measured step and checkpoint times).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from gpt import GPTConfig, TinyGPT, checksum, rank_batch, stdlib_bytes

from ddtk import DistributedContext
from ddtk.checkpoint import atomic_write_bytes, latest, load_zero, save_sharded, zero_state
from ddtk.parallel.zero import ZeroOptimizer
from ddtk.process_exit import exit_without_static_destructors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences per step)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stage", type=int, default=1, choices=(0, 1, 2), help="ZeRO stage")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--out", type=Path, default=Path("runs/zero1"))
    args = p.parse_args(argv)
    if args.steps < 1 or args.every < 1 or args.batch < 1 or args.threads < 1:
        p.error("--steps, --every, --batch and --threads must be >= 1")
    return args


def init_process_group() -> None:
    """Join torchrun's group (gloo); a plain ``python train.py`` makes a one-rank group.

    torchrun keeps one TCPStore across restarts: the keys of each restart get their
    own prefix, so a restarted rank never reads an address its dead peer published.
    """
    if "RANK" not in os.environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_store,
        timeout=timedelta(seconds=60),
    )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"project/restart-{restart}", store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world)


def train(args: argparse.Namespace, ctx: DistributedContext) -> dict:
    """Train from the newest checkpoint (or step 0) to ``args.steps``; return the metrics."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # every rank builds the same initial model
    cfg, data = GPTConfig(), stdlib_bytes()
    model = TinyGPT(cfg)
    opt = ZeroOptimizer(ctx, model, torch.optim.AdamW, stage=args.stage, lr=args.lr)
    ckpt_dir = args.out / "checkpoints"
    start = load_zero(ctx, ckpt_dir, opt, rng=False).step if latest(ckpt_dir) else 0
    committed, ckpt_seconds, step_seconds = [], [], []
    loss = torch.tensor(float("nan"))
    timed_from = None
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        x, y = rank_batch(data, step, args.batch, cfg.block, args.seed, ctx.rank, ctx.world_size)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        step_seconds.append(time.perf_counter() - t0)
        if timed_from is None:  # the first step warms up; throughput counts the rest
            timed_from = time.perf_counter()
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            t1 = time.perf_counter()
            save_sharded(ctx, ckpt_dir, zero_state(opt, rng=False), step + 1, keep_last=2)
            ckpt_seconds.append(time.perf_counter() - t1)
            committed.append(step + 1)
    timed_steps = max(args.steps - start - 1, 0)
    elapsed = time.perf_counter() - (timed_from or time.perf_counter())
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "steps": args.steps,
        "start_step": start,
        "final_step": args.steps,
        "committed_steps": committed,
        "param_checksum": checksum(model),
        "throughput": timed_steps * args.batch / elapsed if elapsed > 0 else 0.0,
        "parameters": opt.numel,
        "zero_stage": args.stage,
        "step_seconds": sum(step_seconds[1:]) / max(len(step_seconds) - 1, 1),
        "checkpoint_seconds": sum(ckpt_seconds) / max(len(ckpt_seconds), 1),
        "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "loss": float(loss.detach()),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point for torchrun (or plain python): train, write this rank's metrics."""
    args = parse_args(argv)
    init_process_group()
    try:
        ctx = DistributedContext.from_env()
        metrics = train(args, ctx)
        path = args.out / "metrics" / f"rank-{ctx.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(metrics, indent=1).encode())
        dist.barrier()  # leave together, so no rank tears gloo down under a peer
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_static_destructors(main())
