"""Training that survives a killed worker under ``torchrun --max-restarts``: DDP + checkpoints.

torchrun (torch elastic) watches its workers; when one dies it stops the
others, runs a new rendezvous and starts the whole group again, at most
``--max-restarts`` times. Each (re)started worker resumes from
``ddtk.checkpoint.latest(dir)``: the model and optimizer (momentum included)
are loaded and the step counter is restored, so at most the steps since the
last commit are computed again. Rank 0 saves every ``--every`` steps and all
ranks meet at a barrier afterwards, so every rank knows the commit happened.
The data of step ``s`` is a pure function of ``s`` (:func:`~ddtk.recovery.common.global_batch`),
so the resumed run sees exactly the batches the lost steps saw and, with a
fixed world size, ends bitwise equal to an uninterrupted run.

Run it (one machine, two workers, rank 1 killed once before step 25)::

    torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=3 \\
        --rdzv-backend=c10d --rdzv-endpoint=localhost:29400 \\
        -m ddtk.recovery.torchrun_train --dir /tmp/run --steps 40 --every 10 \\
        --kill-rank 1 --kill-step 25

``python -m ddtk.recovery.torchrun_train ...`` (no torchrun) trains with one
process. Outputs in ``--dir``: ``step-NNNNNN/`` checkpoints, ``steps-rank{r}.log``
(every completed step, one line each, appended), ``final.json`` (fingerprint,
restarts), and ``recovery.json`` when a crash was recovered from (seconds from
the crash to the first step done after the restart, and to each stage before it:
restarted process up with torch imported, process group ready, model and optimizer
built and the checkpoint loaded into them, DDP ready). Building the first torch
optimizer in a process imports ``torch._dynamo``, which takes seconds: a restart
pays it again, with the Python and torch imports.

>>> import tempfile, json, pathlib
>>> d = tempfile.mkdtemp()
>>> main(["--dir", d, "--steps", "4", "--every", "2", "--quiet"])
0
>>> final = json.loads((pathlib.Path(d) / "final.json").read_text())
>>> final["steps"], final["world_size"], final["start_step"]
(4, 1, 0)
>>> from ddtk.recovery.common import fingerprint, reference
>>> final["fingerprint"] == fingerprint(reference(4, world_size=1))
True
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
from torch.nn.parallel import DistributedDataParallel

from ddtk.checkpoint import atomic_write_bytes, capture, latest, load, save
from ddtk.process_exit import exit_without_static_destructors
from ddtk.recovery.common import (
    RecoveryClock,
    build,
    check_training_args,
    fingerprint,
    kill_self_once,
    local_batch,
    loss_fn,
    training_parser,
)

__all__ = ["main", "parse_args", "train"]

_IMPORTED = time.time()  # this module and torch are imported: the process is up


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; bad combinations raise SystemExit with a message naming them."""
    p = training_parser(
        "ddtk.recovery.torchrun_train", __doc__.split("\n")[0], "checkpoint and result directory"
    )
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept")
    args = p.parse_args(argv)
    check_training_args(p, args)
    return args


def _init_process_group() -> None:
    """Join torchrun's group from its environment, or make a one-process group without it."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # torchrun keeps one TCPStore across restarts; without a per-restart prefix a
        # restarted rank can read the address a dead peer published in the previous
        # round and fail to connect to it (gloo "Connection refused").
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
        prefixed = dist.PrefixStore(f"ddtk-recovery/restart-{restart}", store)
        dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _log_step(path: Path, step: int) -> None:
    """Append one completed step (opened per write, so a SIGKILL loses nothing written)."""
    with open(path, "a") as f:
        f.write(f"{step}\n")


def _phases(clock: RecoveryClock, stamps: dict[str, float]) -> dict[str, float]:
    """Seconds from the crash to each stage of this restarted process (rank 0's view)."""
    crash = clock.crash_time() or 0.0
    phases = {name: t - crash for name, t in stamps.items()}
    phases["first_step_done"] = clock.recovery_seconds() or 0.0
    return phases


def train(args: argparse.Namespace) -> dict:
    """Train in the current process group, resuming from the newest checkpoint; returns the result."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise ValueError(f"--batch-size {args.batch_size} is not divisible by world size {world}")
    torch.set_num_threads(1)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    clock = RecoveryClock(args.dir)
    model, optimizer = build(args.seed)
    start = 0
    if latest(args.dir) is not None:
        start = load(args.dir, model, optimizer, rng=False).step
    stamps = dict(getattr(args, "stamps", {}), state_loaded=time.time())
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters: waits for all
    stamps["ddp_ready"] = time.time()
    log = args.dir / f"steps-rank{rank}.log"
    say = (lambda *a: None) if args.quiet or rank else (lambda *a: print(*a, flush=True))
    say(f"[rank {rank}/{world}] restart {restarts}: resuming at step {start}")
    loss = float("nan")
    for step in range(start, args.steps):
        if rank == args.kill_rank and step == args.kill_step:
            kill_self_once(args.dir / f"killed-rank{rank}-step{step}", clock)
        x, y = local_batch(step, rank, world, args.batch_size, args.seed)
        optimizer.zero_grad(set_to_none=True)
        out = loss_fn(ddp(x), y)
        out.backward()
        optimizer.step()
        loss = float(out.detach())
        _log_step(log, step)
        if rank == 0 and step == start and clock.mark_resume(step):
            say(f"[rank 0] first step after the crash: {step} ({clock.recovery_seconds():.2f} s)")
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            if rank == 0:
                state = capture(model, optimizer, step=step + 1, rng=False)
                save(args.dir, state, step + 1, world_size=world, keep_last=args.keep_last)
            dist.barrier()  # the commit is on disk before anyone goes past it
    prints: list[str | None] = [None] * world
    dist.all_gather_object(prints, fingerprint(model))
    if len(set(prints)) != 1:
        raise RuntimeError(f"ranks disagree on the final model: {prints}")
    result = {
        "fingerprint": prints[0],
        "steps": args.steps,
        "world_size": world,
        "start_step": start,
        "restarts": restarts,
        "last_loss": loss,
        "time": time.time(),
    }
    if rank == 0:
        atomic_write_bytes(args.dir / "final.json", json.dumps(result, indent=1).encode())
        seconds = clock.recovery_seconds()
        if seconds is not None:
            rec = {"recovery_seconds": seconds, "resumed_step": clock.resumed_step()}
            rec["phases"] = _phases(clock, stamps)
            atomic_write_bytes(args.dir / "recovery.json", json.dumps(rec).encode())
            say(f"[rank 0] recovery time {seconds:.2f} s")
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m`` and ``torchrun``; returns the exit status."""
    args = parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    _init_process_group()
    args.stamps = {"modules_imported": _IMPORTED, "process_group_ready": time.time()}
    try:
        train(args)
        # leave together: a rank tearing gloo down while its peer still writes its
        # results can abort the peer at exit, which torchrun would count as a failure
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_static_destructors(main())  # torch 2.13 DDP on gloo can abort at teardown
