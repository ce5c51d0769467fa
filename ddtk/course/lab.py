"""``ddtk course lab``: start JupyterLab on the course, wherever the learner happens to be.

``make lab`` runs this. A plain ``jupyter lab`` trips over three common setups: as root
(a container, a cloud VM) JupyterLab refuses to start without ``--allow-root``; without
a display (SSH, a container) it tries to open a browser that is not there and the
learner has to dig the token out of the log; and when port 8888 is taken it silently
moves to another port. So the choices are made here, up front, and said in plain words:

- ``--allow-root`` only when the effective user id is 0;
- the first free port from 8888 (or ``--port N``, which must be free), then
  ``--port-retries=0`` so the server cannot drift to a port other than the one printed;
- ``--no-browser`` when asked, or when there is no display (``DISPLAY`` and
  ``WAYLAND_DISPLAY`` unset on Linux; macOS and Windows always have one);
- a token made with :func:`secrets.token_hex` (or ``$JUPYTER_TOKEN`` if set), given to
  the server in the ``JUPYTER_TOKEN`` environment variable rather than on the command
  line, where any local user could read it with ``ps``; so the full URL is known before
  the server starts.

>>> choices = choose(port=9999, no_browser=True, euid=0, token="abc", port_free=lambda p, ip: True)
>>> [a for a in lab_command(choices)[3:] if not a.startswith("--notebook-dir")]
['--ip=127.0.0.1', '--port=9999', '--port-retries=0', '--allow-root', '--no-browser', 'course/01-distributed-fundamentals.ipynb']
>>> choices.url
'http://127.0.0.1:9999/lab/tree/course/01-distributed-fundamentals.ipynb?token=abc'
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

NOTEBOOK = "course/01-distributed-fundamentals.ipynb"
FIRST_PORT = 8888
PORT_SPAN = 100  # ports tried from FIRST_PORT when none is given
STOP_GRACE = 20.0  # seconds the server gets to shut its kernels down before SIGKILL

PortCheck = Callable[[int, str], bool]


@dataclass(frozen=True)
class LabChoices:
    """What ``ddtk course lab`` decided, and why (``notes``, in plain words)."""

    root: Path
    notebook: str | None
    ip: str
    port: int
    token: str
    as_root: bool
    open_browser: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def url(self) -> str:
        """The URL that opens the notebook, token included."""
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0", "::") else self.ip
        host = f"[{host}]" if ":" in host else host
        path = f"lab/tree/{self.notebook}" if self.notebook else "lab"
        return f"http://{host}:{self.port}/{path}?token={self.token}"


# ---------------------------------------------------------------- the choices


def port_is_free(port: int, ip: str = "127.0.0.1") -> bool:
    """Whether a TCP server could listen on ``ip:port`` right now."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def free_port(ip: str = "127.0.0.1", *, port_free: PortCheck = port_is_free) -> int:
    """The first free port from 8888 on; OSError when the next 100 are all taken."""
    for port in range(FIRST_PORT, FIRST_PORT + PORT_SPAN):
        if port_free(port, ip):
            return port
    last = FIRST_PORT + PORT_SPAN - 1
    raise OSError(f"ports {FIRST_PORT}-{last} are all in use on {ip}; pass --port N")


def has_display(environ: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """Whether a browser window can open: always on macOS and Windows, else DISPLAY or Wayland."""
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if platform == "darwin" or platform.startswith("win"):
        return True
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def _effective_uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1  # Windows has no uid


def _pick_port(port: int | None, ip: str, port_free: PortCheck) -> tuple[int, str]:
    if port is not None:
        if not port_free(port, ip):
            raise OSError(f"port {port} is in use on {ip}; pick another or leave --port out")
        return port, f"port {port}, as asked"
    chosen = free_port(ip, port_free=port_free)
    if chosen == FIRST_PORT:
        return chosen, f"port {chosen}"
    return chosen, f"port {chosen} (8888-{chosen - 1} are in use)"


def _pick_browser(
    no_browser: bool, port: int, environ: Mapping[str, str], platform: str
) -> tuple[bool, str]:
    if no_browser:
        return False, "--no-browser: not opening a browser; open the URL below"
    if not has_display(environ, platform):
        return False, (
            "no display (DISPLAY and WAYLAND_DISPLAY are unset): not opening a browser; "
            f"open the URL below (over SSH, first: ssh -L {port}:127.0.0.1:{port} this-host)"
        )
    return True, "opening your browser"


def choose(
    port: int | None = None,
    no_browser: bool = False,
    ip: str = "127.0.0.1",
    *,
    root: Path | None = None,
    euid: int | None = None,
    environ: Mapping[str, str] | None = None,
    platform: str | None = None,
    token: str | None = None,
    port_free: PortCheck = port_is_free,
) -> LabChoices:
    """Decide root, port, browser and token; the keyword-only arguments exist for tests.

    Raises OSError when ``port`` is taken or no port from 8888 to 8987 is free.
    """
    from ddtk.course.catalog import REPO_ROOT

    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    root = (root or REPO_ROOT).resolve()
    as_root = (_effective_uid() if euid is None else euid) == 0
    chosen_port, port_note = _pick_port(port, ip, port_free)
    open_browser, browser_note = _pick_browser(no_browser, chosen_port, environ, platform)
    notebook = NOTEBOOK if (root / NOTEBOOK).is_file() else None
    notes = [
        "running as root: passing --allow-root (JupyterLab refuses to start as root without it)"
        if as_root
        else "not running as root: no --allow-root needed",
        f"serving {root} on {ip}, {port_note}",
        browser_note,
    ]
    if notebook is None:
        notes.append(f"{NOTEBOOK} is missing: opening the file browser instead")
    token = token or environ.get("JUPYTER_TOKEN") or secrets.token_hex(24)
    return LabChoices(root, notebook, ip, chosen_port, token, as_root, open_browser, tuple(notes))


def lab_command(choices: LabChoices, python: str = sys.executable) -> list[str]:
    """The JupyterLab argv for ``choices`` (the token travels in :func:`lab_env`, not here)."""
    argv = [
        python,
        "-m",
        "jupyterlab",
        f"--notebook-dir={choices.root}",
        f"--ip={choices.ip}",
        f"--port={choices.port}",
        "--port-retries=0",  # the port was checked; never drift from the URL we print
    ]
    if choices.as_root:
        argv.append("--allow-root")
    if not choices.open_browser:
        argv.append("--no-browser")
    if choices.notebook:
        argv.append(choices.notebook)
    return argv


def lab_env(choices: LabChoices, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ours plus ``JUPYTER_TOKEN`` (jupyter_server reads it at start)."""
    return {**(os.environ if environ is None else environ), "JUPYTER_TOKEN": choices.token}


def explain(choices: LabChoices) -> list[str]:
    """What was chosen and why, one line each, ending with the URL to open."""
    return [*choices.notes, f"JupyterLab: {choices.url}", "Ctrl-C stops the server and its kernels"]


# ---------------------------------------------------------------- running and stopping


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """While inside: SIGTERM and SIGHUP (terminal closed) act like Ctrl-C, so the server stops too."""
    names = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {name: signal.signal(getattr(signal, name), interrupt) for name in names}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def stop_server(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """Stop the server: SIGTERM (it shuts its kernels down), then SIGKILL whatever outlives ``grace``.

    Kernels run in sessions of their own, so they are collected before the server is
    signalled: a kernel orphaned by a server that died first is still found and killed.
    """
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    if proc.poll() is None:
        proc.terminate()
    try:
        _gone, alive = psutil.wait_procs(family, timeout=grace)
    except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
        alive = family
    for survivor in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    psutil.wait_procs(alive, timeout=5)
    proc.wait()


def run(choices: LabChoices, *, grace: float = STOP_GRACE) -> int:
    """Start JupyterLab for ``choices`` and wait; Ctrl-C, SIGTERM or SIGHUP stop it cleanly.

    The server runs in its own session, so Ctrl-C reaches only this process, which then
    stops the server once, without JupyterLab's "Shutdown this Jupyter server (y/[n])?".
    Returns the server's exit code, or 0 when the user stopped it.
    """
    detach = {"start_new_session": True} if os.name == "posix" else {}
    with _stop_signals_interrupt():
        proc = subprocess.Popen(
            lab_command(choices), env=lab_env(choices), cwd=choices.root, **detach
        )
        try:
            return proc.wait()
        except KeyboardInterrupt:
            print("\nstopping JupyterLab and its kernels...", file=sys.stderr, flush=True)
            return 0
        finally:
            if proc.poll() is None:
                stop_server(proc, grace)
