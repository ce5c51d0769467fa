"""Run a submission under torchrun, confined and watched, and read the metrics each rank wrote.

Each run gets a fresh folder with a name that says nothing about the run (so the
SIGKILL drill looks to the program exactly like any other run) holding a copy of the
submission (``src/``, the working folder), the output folder ``out/`` (``{out}``), the
probe's folder and a home. The entry point runs as ``python -m torch.distributed.run
--standalone --nproc-per-node N --max-restarts 1 train.py ARGS`` in ``src/``:

- **confined** where the machine allows it (:class:`ddtk.course.grading.jail.Jail`):
  its own PID, mount, IPC and network namespaces, a fresh unprivileged user, a
  read-only system, only the run's folder writable, and the original submission, the
  rubric and ``solutions/`` hidden; so a submission can neither edit its judge nor
  reach another run;
- **watched** (:mod:`ddtk.project.observe`): the checker's probe counts every rank's
  optimizer steps on the checker's clock, and the kernel counts the bytes the ranks
  exchange.

The launcher's output goes to ``launcher.log`` beside ``out/``. Every process the run
started is killed at the end if it is still alive, so a run never leaves anything
behind, whatever the submission does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddtk.project.manifest import ProjectSpec
from ddtk.project.observe import PROBE_PATH, Probe
from ddtk.project.procs import descendants, kill_tree

POLL_S = 0.05
MAX_RESTARTS = 1  # every run, so that the SIGKILL drill's run is like any other
SUBMISSION_MAX_BYTES = 256 * 2**20  # a bigger submission folder is not copied
LIMITS = {"memory_mb": 8192, "nproc": 4096, "fsize_mb": 2048, "nofile": 4096}
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
    probe: Probe | None = None
    jailed: bool = False

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


def new_run_folder(work: Path) -> Path:
    """A fresh folder for one run, named at random."""
    folder = work / secrets.token_hex(6)
    folder.mkdir(parents=True)
    return folder


def _tree_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if not p.is_symlink())


def _stage(spec: ProjectSpec, folder: Path) -> Path:
    """Copy the submission into ``folder/src`` (the program never touches the original)."""
    size = _tree_bytes(spec.root)
    if size > SUBMISSION_MAX_BYTES:
        raise ValueError(
            f"the submission folder holds {size / 2**20:.0f} MiB, more than the "
            f"{SUBMISSION_MAX_BYTES // 2**20} MiB a run copies: leave data and outputs out of it"
        )
    src = folder / "src"
    shutil.copytree(spec.root, src, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", ".git"))  # fmt: skip
    for name in ("out", "probe", "home"):
        (folder / name).mkdir()
    return src


def _hand_over(folder: Path, uid: int) -> None:
    """Give the run's own user everything in its folder."""
    for path in [folder, *folder.rglob("*")]:
        with contextlib.suppress(OSError):
            os.lchown(path, uid, uid)


def run(
    spec: ProjectSpec,
    ranks: int,
    folder: Path,
    timeout_s: float,
    *,
    on_poll: Callable[[subprocess.Popen], None] | None = None,
    hide: tuple[Path, ...] = (),
) -> RunResult:
    """Run the submission on ``ranks`` ranks in ``folder`` (see :func:`new_run_folder`);
    kill everything after ``timeout_s``. ``on_poll(proc)`` is called every 50 ms while
    the launcher runs (the SIGKILL drill uses it to watch for a commit and kill a worker).
    """
    from ddtk.course.grading.jail import Jail, kernel_env, private_paths

    out = folder / "out"
    try:
        src = _stage(spec, folder)
    except (OSError, ValueError) as exc:
        return RunResult(ranks, out, None, False, 0.0, "", problems=[str(exc)])
    jail = Jail(folder, private_paths(spec.root, *hide))
    probe = Probe(folder / "probe")
    env = kernel_env(os.environ, folder / "home", {
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROBE_PATH),
        "DDTK_PROBE_DIR": str(probe.folder), "TMPDIR": str(jail.tmp),
    })  # fmt: skip
    if jail.conf.own_user:
        _hand_over(folder, jail.uid)
    cmd = jail.wrap(torchrun_command(spec, ranks, out, MAX_RESTARTS), LIMITS, tmp_mb=2048, cwd=src)
    log = folder / "launcher.log"
    start = time.monotonic()
    seen: dict[int, psutil.Process] = {}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=src, env=env, stdin=subprocess.DEVNULL, stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        timed_out = False
        try:
            while proc.poll() is None:
                seen.update((p.pid, p) for p in descendants(proc.pid))
                probe.poll()
                if jail.conf.namespaces:  # every descendant is in the run's network namespace
                    any(probe.watch_network(pid) for pid in seen)
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
    probe.poll()
    seconds = time.monotonic() - start
    tail = log.read_bytes()[-4000:].decode("utf-8", "replace")
    result = RunResult(ranks, out, None if timed_out else proc.returncode, timed_out, seconds,
                       tail, probe=probe, jailed=jail.conf.namespaces)  # fmt: skip
    if result.returncode == 0 and not timed_out:
        result.metrics, result.problems = read_metrics(spec, out, ranks)
    return result
