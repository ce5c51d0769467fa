"""Run a submission under torchrun with a timeout, and read the metrics each rank wrote.

The entry point runs as ``python -m torch.distributed.run --standalone
--nproc-per-node N --max-restarts R train.py ARGS`` in the submission folder, with
``{out}`` a fresh folder. The launcher's output goes to ``out/launcher.log``.
Every process the run started, seen at any poll, is killed at the end if it is
still alive, so a run never leaves anything behind, whatever the submission does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddtk.project.manifest import ProjectSpec
from ddtk.project.procs import descendants, kill_tree

POLL_S = 0.05
REQUIRED = {
    "final_step": int,
    "start_step": int,
    "world_size": int,
    "param_checksum": str,
    "throughput": float,
}


@dataclass
class RunResult:
    """How a run ended and what its ranks reported."""

    ranks: int
    out: Path
    returncode: int | None
    timed_out: bool
    seconds: float
    log_tail: str
    metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Exited 0 in time and every rank wrote valid metrics."""
        return self.returncode == 0 and not self.timed_out and not self.problems

    def failure(self) -> str:
        """One sentence on why the run is not ok (empty when it is)."""
        if self.timed_out:
            return f"the {self.ranks}-rank run did not finish within {self.seconds:.0f} s and was killed"
        if self.returncode != 0:
            tail = " | ".join(worker_lines(self.log_tail)) or "no output from the workers"
            return f"the {self.ranks}-rank run exited with status {self.returncode}: {tail}"
        return "; ".join(self.problems)

    def mean(self, key: str) -> float:
        """The mean of a numeric metric over the ranks."""
        return sum(float(m[key]) for m in self.metrics.values()) / len(self.metrics)


_LAUNCHER = re.compile(
    r"^[EWI]\d{4} .*torch/distributed/elastic|ChildFailedError|^\*{10,}|OMP_NUM_THREADS"
)


def worker_lines(log: str, keep: int = 3) -> list[str]:
    """The last ``keep`` distinct lines the workers printed before torchrun's failure report."""
    lines = []
    for line in log.splitlines():
        if line.startswith(("E", "W")) and _LAUNCHER.search(line) and "failed (exitcode" in line:
            break
        if line.strip() and not _LAUNCHER.search(line) and (not lines or lines[-1] != line.strip()):
            lines.append(line.strip())
    return lines[-keep:]


def torchrun_command(spec: ProjectSpec, ranks: int, out: Path, max_restarts: int) -> list[str]:
    """The launcher command line for ``ranks`` workers."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(ranks), "--max-restarts", str(max_restarts),
        "--monitor-interval", "0.1", spec.entry, *spec.command_args(out),
    ]  # fmt: skip


def check_metrics(data: Any, rank: int, ranks: int, steps: int) -> list[str]:
    """Problems with one rank's metrics JSON (types, world size, final step)."""
    if not isinstance(data, dict):
        return [f"rank {rank}'s metrics are not a JSON object"]
    out = []
    for key, kind in REQUIRED.items():
        value = data.get(key)
        ok = (
            isinstance(value, int | float) and math.isfinite(value)
            if kind is float
            else isinstance(value, kind)
        )
        if isinstance(value, bool) or not ok:
            out.append(f"rank {rank}'s metrics have no valid {key!r} (got {value!r})")
    if out:
        return out
    if data["world_size"] != ranks:
        out.append(
            f"rank {rank} reports world_size {data['world_size']} in a {ranks}-rank run "
            "(the program does not join torchrun's process group)"
        )
    if data["final_step"] != steps:
        out.append(
            f"rank {rank} ended at step {data['final_step']}, the check run has {steps} steps"
        )
    return out


def read_metrics(spec: ProjectSpec, out: Path, ranks: int) -> tuple[dict[int, dict], list[str]]:
    """Every rank's metrics, and the problems found (missing file, bad JSON, bad fields)."""
    metrics, problems = {}, []
    for rank in range(ranks):
        path = spec.metrics_path(out, rank)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            problems.append(
                f"rank {rank} wrote no metrics at {spec.metrics.replace('{rank}', str(rank))}"
            )
            continue
        except (OSError, ValueError):
            problems.append(f"rank {rank}'s metrics file {path.name} is not valid JSON")
            continue
        found = check_metrics(data, rank, ranks, spec.steps)
        problems += found
        if not found:
            metrics[rank] = data
    return metrics, problems


def run(
    spec: ProjectSpec,
    ranks: int,
    out: Path,
    timeout_s: float,
    *,
    max_restarts: int = 0,
    on_poll: Callable[[subprocess.Popen], None] | None = None,
) -> RunResult:
    """Run the submission on ``ranks`` ranks into ``out``; kill everything after ``timeout_s``.

    ``on_poll(proc)`` is called every 50 ms while the launcher runs (the SIGKILL
    check uses it to watch for a commit and kill a worker).
    """
    out.mkdir(parents=True, exist_ok=True)
    log = out / "launcher.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    start = time.monotonic()
    seen: dict[int, psutil.Process] = {}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            torchrun_command(spec, ranks, out, max_restarts),
            cwd=spec.root, env=env, stdin=subprocess.DEVNULL, stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        timed_out = False
        try:
            while proc.poll() is None:
                seen.update((p.pid, p) for p in descendants(proc.pid))
                if time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                if on_poll is not None:
                    on_poll(proc)
                time.sleep(POLL_S)
        finally:
            kill_tree(proc)
            for p in seen.values():
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(list(seen.values()), timeout=10)
    seconds = time.monotonic() - start
    tail = log.read_bytes()[-4000:].decode("utf-8", "replace")
    result = RunResult(ranks, out, None if timed_out else proc.returncode, timed_out, seconds, tail)
    if result.returncode == 0 and not timed_out:
        result.metrics, result.problems = read_metrics(spec, out, ranks)
    return result
