"""Judge a run from what the checker observed (:mod:`ddtk.project.observe`), not from its reports.

- :func:`distribution_problems`: every rank stepped its optimizer exactly the run's step
  count, in one process, and (when the run had its own network namespace, so that the
  kernel sees what bypasses Python) the ranks exchanged at least a quarter of a rank's
  parameter bytes per step, over loopback or through the calls the probe counts:
  gradients or activations really crossed between processes.
- :func:`resume_problems`: after the SIGKILL, each rank's final attempt ran no more
  steps than were left after the last commit, and ends with the parameters an
  uninterrupted run ends with (the probe's digest, compared by the checker).
- :func:`sharding`: per-rank optimizer state (or parameters) at N ranks against the
  one-rank run's: sharded state, pipeline or tensor parallelism holds about 1/N.
"""

from __future__ import annotations

from pathlib import Path

from ddtk.project.observe import Attempt, Probe, samples_per_s

MIN_TRAFFIC = 0.25  # loopback bytes per step, as a share of the largest rank's parameter bytes


def distribution_problems(probe: Probe | None, ranks: int, steps: int) -> list[str]:
    """Why the run does not look like ``ranks`` processes training ``steps`` steps together."""
    if probe is None:
        return ["the checker could not watch the run"]
    tries = probe.by_rank()
    out = []
    for rank in range(ranks):
        mine = tries.get(rank, [])
        if not mine:
            out.append(f"the checker saw no optimizer step on rank {rank} (no torch.optim "
                       "optimizer stepped in that process)")  # fmt: skip
        elif len(mine) > 1:
            out.append(f"rank {rank} ran in {len(mine)} processes: the run restarted")
        elif mine[0].steps != steps:
            out.append(f"rank {rank}'s optimizer stepped {mine[0].steps} times; the check run "
                       f"has {steps} steps")  # fmt: skip
    if out or probe.lo_bytes is None or ranks < 2:  # without a namespace, DDP's traffic is unseen
        return out
    held = max(a.held_param_bytes for a in probe.final().values())
    per_step = (probe.lo_bytes + sum(a.sent_bytes for a in probe.final().values())) / steps
    if per_step < MIN_TRAFFIC * held:
        out.append(
            f"the ranks exchanged {per_step / 1024:.1f} KiB per step over the network, less than "
            f"{MIN_TRAFFIC:.0%} of one rank's {held / 1024:.0f} KiB of parameters: they do not "
            "train together (no gradient or activation crosses between them)"
        )
    return out


def observed(probe: Probe | None, global_batch: int) -> dict:
    """What the checker measured of a run, for the criterion's ``measured`` values."""
    if probe is None:
        return {}
    final = probe.final()
    rate = samples_per_s(final[0], global_batch) if 0 in final else None
    return {
        "optimizer_steps": {r: [a.steps for a in t] for r, t in sorted(probe.by_rank().items())},
        "samples_per_s": None if rate is None else round(rate, 2),
        "loopback_bytes": probe.lo_bytes,
        "sent_bytes": {r: a.sent_bytes for r, a in sorted(final.items())},
        "state_bytes": {r: a.held_state_bytes for r, a in sorted(final.items())},
    }


def resume_problems(
    probe: Probe | None, uninterrupted: Probe | None, ranks: int, steps: int, committed: int
) -> list[str]:
    """Why the resumed run is not a real resume of the checkpoint of step ``committed``."""
    if probe is None or uninterrupted is None:
        return ["the checker has no uninterrupted run to compare the resume with"]
    tries, clean = probe.by_rank(), uninterrupted.final()
    out = []
    for rank in range(ranks):
        mine = tries.get(rank, [])
        if len(mine) < 2:
            out.append(f"rank {rank} was not restarted after the kill (the checker saw "
                       f"{len(mine)} process(es) step its optimizer)")  # fmt: skip
            continue
        last: Attempt = mine[-1]
        if last.steps > steps - committed:
            out.append(
                f"rank {rank}'s final attempt ran {last.steps} optimizer steps, but only "
                f"{steps - committed} were left after the commit of step {committed}: it "
                "recomputed committed work instead of resuming"
            )
        elif rank in clean and last.digest != clean[rank].digest:
            out.append(
                f"rank {rank}'s parameters after the resume differ from an uninterrupted run's: "
                "the checkpoint does not restore the exact training state"
            )
    return out


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed)."""
    if not path.is_dir() or path.is_symlink():
        return 0
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def sharding(
    per_world: dict[int, Probe], rtol: float
) -> tuple[str | None, dict[str, dict[int, int]]]:
    """Whether per-rank optimizer state (or, for an optimizer without state, parameters)
    shrinks to about 1/N of the one-rank run's; the problem (or None) and the numbers."""
    held: dict[str, dict[int, int]] = {"state_bytes": {}, "param_bytes": {}}
    for n, probe in sorted(per_world.items()):
        final = probe.final().values()
        held["state_bytes"][n] = max((a.held_state_bytes for a in final), default=0)
        held["param_bytes"][n] = max((a.held_param_bytes for a in final), default=0)
    key = "state_bytes" if held["state_bytes"].get(1) else "param_bytes"
    one = held[key].get(1)
    if not one:
        return "the one-rank run's optimizer held nothing the checker could measure", held
    wide = [n for n in sorted(held[key]) if n > 1 and held[key][n] > one / n * (1 + rtol)]
    if wide:
        pairs = ", ".join(f"{n} ranks: {held[key][n] / 2**20:.2f} MiB" for n in wide)
        return (
            f"per-rank optimizer {key.split('_')[0]} does not shrink with the ranks (1 rank: "
            f"{one / 2**20:.2f} MiB; {pairs}; sharded it would be about 1/N): no second strategy "
            "(sharded optimizer state, pipeline or tensor parallelism) is in use",
            held,
        )
    return None, held


__all__ = [
    "distribution_problems", "folder_bytes", "observed", "resume_problems", "sharding",
]  # fmt: skip
