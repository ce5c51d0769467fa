"""A submission's train.py that cheats the final project's checks in one way (MODE, set by
the test): each mode passes what the old, self-reported checks verified.

- ``nothing``: imports neither torch nor ddtk; reports constant checksums, a throughput
  of 1000 x world size, writes commit markers with nothing behind them and claims to
  resume at the newest marker.
- ``alone``: trains for real, every rank on the same batches, with no communication at
  all: the checksums agree because the ranks compute the same thing.
- ``recompute``: real data-parallel training with real checkpoints that it never
  loads: a restart trains from step 0 again and reports the newest commit as its
  start step.
- ``skip``: a restart jumps to the newest committed step without loading it.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
from pathlib import Path

MODE = "nothing"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def newest_commit(ckpt: Path) -> int:
    steps = [int(re.findall(r"\d+", m.parent.name)[-1]) for m in ckpt.glob("step-*/manifest.json")]
    return max(steps, default=0)


def write_metrics(args, rank, world, start, checksum, extra=None) -> None:
    path = args.out / "metrics" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "rank": rank,
        "world_size": world,
        "start_step": start,
        "final_step": args.steps,
        "param_checksum": checksum,
        "throughput": 1000.0 * world,
        "parameters": 1000,
    }
    path.write_text(json.dumps(data | (extra or {})))


def fake(args, rank, world) -> None:
    ckpt = args.out / "checkpoints"
    start = newest_commit(ckpt)
    for step in range(start, args.steps):
        if (step + 1) % args.every == 0 and rank == 0:
            marker = ckpt / f"step-{step + 1:06d}" / "manifest.json"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("{}")
    write_metrics(args, rank, world, start, "0" * 64)


def real(args, rank, world) -> None:
    import time

    import torch
    import torch.distributed as dist

    together = MODE != "alone"
    if together:  # torchrun keeps its store across restarts: each restart gets its own keys
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world,
            is_master=False,
            timeout=datetime.timedelta(seconds=30),
        )
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"restart-{restart}", store), rank=rank, world_size=world
        )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ckpt = args.out / "checkpoints"
    start = newest_commit(ckpt) if together else 0  # alone, a rank may see another's commit
    first = 0 if MODE == "recompute" else start
    for step in range(first, args.steps):
        gen = torch.Generator().manual_seed(step * 1000 + (rank if together else 0))
        x, y = (
            torch.randn(args.batch, 64, generator=gen),
            torch.randint(0, 8, (args.batch,), generator=gen),
        )
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if together:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        time.sleep(0.02)
        if (step + 1) % args.every == 0 and step + 1 > start:
            folder = ckpt / f"step-{step + 1:06d}"
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict()}, folder / f"rank-{rank}.pt"
            )
            if together:
                dist.barrier()
            if rank == 0:
                (folder / "manifest.json").write_text("{}")
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    write_metrics(args, rank, world, start, digest.hexdigest())
    if together:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    args = parse()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    (fake if MODE == "nothing" else real)(args, rank, world)


if __name__ == "__main__":
    main()
