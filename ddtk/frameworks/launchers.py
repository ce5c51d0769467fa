"""Run a framework's own launcher (``torchrun``, ``horovodrun``, ``deepspeed``, TF workers) from Python.

A notebook cell or a benchmark calls :func:`run_command` and sees the job's
output live, line by line, as the launcher prints it (``horovodrun`` prefixes
each line with ``[rank]<stdout>:``, ``torchrun --tee`` the same idea). What it
guarantees, so a failed job loses nothing and leaves nothing behind:

* the command runs in its own process group; on a timeout, an error or Ctrl-C
  the whole group gets SIGTERM, then SIGKILL, so no rank outlives the call;
* ``PATH`` starts with this interpreter's ``bin`` folder, so the launchers and
  the ``ninja`` that DeepSpeed's JIT build calls are the ones of this environment;
* a non-zero exit raises :class:`LauncherError` with the last lines of output,
  not a traceback from inside ``subprocess``.

>>> horovodrun_command(2, ["-m", "ddtk.examples.cnn_horovod"], hosts="localhost:1,127.0.0.1:1")[1:6]
['--gloo', '-np', '2', '-H', 'localhost:1,127.0.0.1:1']
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent


class LauncherError(RuntimeError):
    """A launched job exited non-zero or ran out of time; the message ends with its last lines."""


@dataclass
class Completed:
    """What a finished job printed (stdout and stderr interleaved), its exit code and its wall time."""

    command: list[str]
    returncode: int
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def tool(name: str) -> str:
    """The path of a launcher beside this interpreter (else on PATH); a clear error when absent."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found:
        return found
    hint = "run `make horovod`" if name == "horovodrun" else "run `make venv`"
    raise FileNotFoundError(f"`{name}` is neither beside {sys.executable} nor on PATH: {hint}")


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the interpreter's ``bin`` first on PATH and ``extra`` set."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (for MASTER_PORT and the like)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, script: Sequence[str], **options: object) -> list[str]:
    """``torchrun --nproc-per-node N [--opt value...] script...`` with this environment's torchrun.

    ``options`` become flags (``master_port=29500`` -> ``--master-port 29500``);
    ``script`` is ``["-m", "pkg.mod", ...]`` or ``["path.py", ...]``.
    """
    _positive("nproc", nproc)
    cmd = [tool("torchrun"), "--nproc-per-node", str(nproc)]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    if script and script[0] == "-m":
        cmd.append("--module")
        script = script[1:]
    return cmd + list(script)


def horovodrun_command(
    np: int, script: Sequence[str], hosts: str | None = None, options: Sequence[str] = ()
) -> list[str]:
    """``horovodrun --gloo -np N -H hosts python script...``; ``hosts`` defaults to ``localhost:N``.

    Two host names for this machine (``localhost:1,127.0.0.1:1``) make Horovod
    treat it as two nodes: a cross-host ring over TCP, the multi-node path.
    """
    _positive("np", np)
    hosts = hosts or f"localhost:{np}"
    return [
        tool("horovodrun"),
        "--gloo",
        "-np",
        str(np),
        "-H",
        hosts,
        *options,
        sys.executable,
        *script,
    ]


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300.0,
    echo: bool | Callable[[str], None] = True,
    cwd: str | os.PathLike | None = None,
    check: bool = True,
    keep: int = 4000,
) -> Completed:
    """Run ``command``, streaming its output as it comes, and return what it printed.

    ``env`` adds variables to this environment (see :func:`tool_env`). ``echo``
    is True (print each line), False (quiet) or a callable that gets each line.
    The last ``keep`` lines are kept. With ``check`` a non-zero exit or a timeout
    raises :class:`LauncherError`; the process group is always reaped.
    """
    cmd = [str(c) for c in command]
    sink = echo if callable(echo) else (lambda line: print(line, flush=True)) if echo else None
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=tool_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    lines: list[str] = []

    def pump() -> None:
        for raw in proc.stdout:  # type: ignore[union-attr]
            line = raw.rstrip("\n")
            lines.append(line)
            if len(lines) > keep:
                del lines[: len(lines) - keep]
            if sink:
                sink(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        else:
            _kill_group(proc, grace=1.0)  # ranks a launcher left behind
        reader.join(30)  # EOF comes once every holder of the pipe is gone; a loaded machine is slow to say so
    done = Completed(cmd, proc.returncode, lines, time.perf_counter() - start)
    if check and (timed_out or proc.returncode != 0):
        what = (
            f"ran past {timeout:g} s and was stopped"
            if timed_out
            else f"exited with {proc.returncode}"
        )
        tail = "\n".join(lines[-25:])
        raise LauncherError(f"`{' '.join(cmd[:6])} ...` {what}. Last lines:\n{tail}")
    return done


def torchrun_script(
    source: str,
    nproc: int = 2,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    **options: object,
) -> tuple[list[str], list[str]]:
    """Run the Python ``source`` under ``torchrun`` on this host; return the command and the
    lines its ranks printed to stdout that start with ``[rank``, in rank order (each rank's
    own order kept).

    Each rank's stdout goes to its own file (torchrun's ``--redirects 1`` under a temporary
    ``--log-dir``), read back once the job ends: ranks that share one pipe can cut into each
    other's lines, whatever they flush. Their stderr and torchrun's own messages still
    stream into the shared pipe. The script goes to a temporary file; ``options`` are
    torchrun flags as in :func:`torchrun_command` (default: a c10d rendezvous on a free local
    port). The process group is reaped whatever happens, and a failing job is returned, not
    raised: the lectures show what its ranks printed, errors included.
    """
    import tempfile

    flags: dict[str, object] = {"nnodes": 1, "rdzv_backend": "c10d", "rdzv_endpoint": "localhost:0"}
    flags.update(options)
    with tempfile.TemporaryDirectory(prefix="ddtk-torchrun-") as tmp:
        path, logs = Path(tmp) / "script.py", Path(tmp) / "logs"
        path.write_text(source)
        cmd = torchrun_command(nproc, [str(path)], **flags, log_dir=logs, redirects=1)
        run_command(cmd, env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout,
                    echo=False, check=False)  # fmt: skip
        lines = [line for text in _rank_stdout(logs) for line in text.splitlines()]
    return cmd, [line for line in lines if line.startswith("[rank ")]


def _rank_stdout(logs: Path) -> list[str]:
    """What each local rank wrote to stdout under torchrun's ``--log-dir``, in rank order
    (``<run>/attempt_<n>/<local rank>/stdout.log``; a restarted job's attempts in turn)."""

    def order(file: Path) -> tuple[int, int]:
        return int(file.parent.parent.name.removeprefix("attempt_")), int(file.parent.name)

    files = sorted(logs.glob("*/attempt_*/*/stdout.log"), key=order)
    return [file.read_text(errors="replace") for file in files]
