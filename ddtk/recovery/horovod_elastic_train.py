"""Training that goes on when workers die or leave: Horovod Elastic (``hvd.elastic.run``).

``horovodrun --host-discovery-script`` asks a script for the hosts (and slots)
it may use, starts ``-np`` workers, and watches them. The training function is
wrapped in ``hvd.elastic.run`` and its state lives in
``hvd.elastic.TorchState(model, optimizer, step=...)``; ``state.commit()`` every
``--every`` steps copies it to host memory (and checks for host changes).

* A worker dies (SIGKILL): the survivors' next collective raises
  ``HorovodInternalError``; they roll the state back to the last commit
  (``state.restore()``), the driver blacklists the dead worker's host, and
  training resumes with the workers left (as long as there are ``--min-np``),
  after ``state.sync()`` broadcast rank 0's state.
* The discovery script stops listing a host: at the next commit every worker
  raises ``HostsUpdatedInterrupt``; nothing is rolled back (the commit just
  happened), the workers on the removed host stop, and the rest go on.

What is guaranteed: no committed step is lost; after a failure the state is
the last commit; every step in the final model was applied exactly once, by
the workers that ran it before the commit that kept it. Because the data of step
``s`` is a pure function of ``s`` and ranks take contiguous slices, a run
whose world size goes 2 -> 1 equals, bit for bit, the single-process
:func:`~ddtk.recovery.common.reference` with that per-step world-size
schedule, and is close (not equal: another summation order) to the
fixed-size reference. ``--batch-size`` must be divisible by every world size
the job can take (``--min-np`` .. ``--max-np``); a worker raises ValueError otherwise.

Run it on one machine (two "hosts", one slot each, so the survivor's host is
not the one blacklisted)::

    printf 'localhost:1\\n127.0.0.1:1\\n' > /tmp/hosts
    DDTK_HOSTS_FILE=/tmp/hosts horovodrun --gloo -np 2 --min-np 1 --max-np 2 \\
        --host-discovery-script ddtk/recovery/discover_hosts.sh \\
        python -m ddtk.recovery.horovod_elastic_train --dir /tmp/hrun --steps 40 \\
        --every 10 --kill-rank 1 --kill-step 25

Outputs in ``--dir``: ``final.json`` (fingerprint, steps, the world size of
each step in the final model, resets), ``steps-<host>-<local rank>.log`` (each completed
step, the world size that ran it and the time, per worker process),
``recovery.json`` (crash to first step after the reset, when a worker was killed).

>>> schedule_from_log([(0, 2), (1, 2), (2, 2), (1, 1), (2, 1), (3, 1)])
[2, 1, 1, 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from ddtk.checkpoint import atomic_write_bytes
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

__all__ = ["keep_only_host", "main", "parse_args", "read_log", "schedule_from_log", "train"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; bad combinations raise SystemExit with a message naming them."""
    p = training_parser(
        "ddtk.recovery.horovod_elastic_train", __doc__.split("\n")[0], "result directory"
    )
    p.add_argument("--hosts-file", type=Path, default=None, help="file the discovery script reads")
    p.add_argument(
        "--shrink-at-step",
        type=int,
        default=None,
        help="rank 0 rewrites --hosts-file to list only its own host at this step",
    )
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step")
    args = p.parse_args(argv)
    check_training_args(p, args)
    if (args.hosts_file is None) != (args.shrink_at_step is None):
        p.error("--hosts-file and --shrink-at-step go together")
    return args


def read_log(path: Path) -> list[tuple[int, int, float]]:
    """``(step, world size, time)`` of every step a worker completed, in order."""
    rows = [line.split() for line in Path(path).read_text().splitlines() if line.strip()]
    return [(int(r[0]), int(r[1]), float(r[2])) for r in rows]


def schedule_from_log(entries: Iterable[tuple[int, int] | tuple[int, int, float]]) -> list[int]:
    """Per-step world size of the steps that count, from one worker's ``(step, size)`` log.

    A step logged again later was rolled back and recomputed: the last time
    it was done is the one in the final model.
    """
    sizes: dict[int, int] = {}
    for step, size, *_ in entries:
        for later in [s for s in sizes if s > step]:
            del sizes[later]  # rolled back
        sizes[step] = size
    return [sizes[s] for s in sorted(sizes)]


def keep_only_host(hosts_file: Path, host: str) -> list[str]:
    """Rewrite a discovery file (``host:slots`` lines) keeping ``host`` only; returns the removed.

    >>> import pathlib, tempfile
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "hosts"
    >>> _ = f.write_text("localhost:1\\n127.0.0.1:1\\n")
    >>> keep_only_host(f, "127.0.0.1"), f.read_text()
    (['localhost:1'], '127.0.0.1:1\\n')
    """
    lines = [ln.strip() for ln in hosts_file.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if ln.split(":")[0] == host]
    atomic_write_bytes(hosts_file, ("\n".join(kept) + "\n").encode())
    return [ln for ln in lines if ln not in kept]


def train(args: argparse.Namespace) -> dict:
    """Run the elastic training loop in this Horovod worker; returns the result of rank 0."""
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    model, optimizer = build(args.seed)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    clock = RecoveryClock(args.dir)
    host = os.environ.get("HOROVOD_HOSTNAME", "host")
    log = args.dir / f"steps-{host}-{os.environ.get('HOROVOD_LOCAL_RANK', '0')}.log"
    # not part of the state: sync() after a reset sets state attributes back to the commit
    after_reset = {"pending": False, "resets": 0}

    def on_reset() -> None:
        after_reset["resets"] += 1
        after_reset["pending"] = True

    state.register_reset_callbacks([on_reset])

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"[{host} rank {hvd.rank()}/{hvd.size()}] {msg}", flush=True)

    @hvd.elastic.run
    def loop(state: hvd.elastic.TorchState) -> None:
        say(f"starting at step {state.step}")
        while state.step < args.steps:
            step, rank, size = state.step, hvd.rank(), hvd.size()
            if rank == args.kill_rank and step == args.kill_step:
                kill_self_once(args.dir / f"killed-step{step}", clock)
            if rank == 0 and step == args.shrink_at_step and size > 1:
                say(f"removing {keep_only_host(args.hosts_file, host)} from the discovery file")
            x, y = local_batch(step, rank, size, args.batch_size, args.seed)
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            with open(log, "a") as f:
                f.write(f"{step} {size} {time.time():.6f}\n")
            if after_reset["pending"]:
                after_reset["pending"] = False
                if rank == 0 and clock.mark_resume(step):
                    say(f"first step after the reset: {step} ({clock.recovery_seconds():.2f} s)")
            state.step = step + 1
            if args.step_delay:
                time.sleep(args.step_delay)
            if state.step % args.every == 0 or state.step == args.steps:
                state.commit()

    loop(state)
    result = {
        "fingerprint": fingerprint(model),
        "steps": state.step,
        "world_size": hvd.size(),
        "resets": after_reset["resets"],
        # world size of each step in the final model, from this worker's log (complete
        # for a worker that ran from the start)
        "schedule": schedule_from_log(read_log(log)),
        "time": time.time(),
    }
    if hvd.rank() == 0:
        atomic_write_bytes(args.dir / "final.json", json.dumps(result).encode())
        seconds = clock.recovery_seconds()
        if seconds is not None:
            rec = {"recovery_seconds": seconds, "resumed_step": clock.resumed_step()}
            atomic_write_bytes(args.dir / "recovery.json", json.dumps(rec).encode())
            say(f"recovery time {seconds:.2f} s")
    say(f"done: {state.step} steps, final world size {hvd.size()}, {after_reset['resets']} resets")
    hvd.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``horovodrun ... python -m ddtk.recovery.horovod_elastic_train``."""
    args = parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
