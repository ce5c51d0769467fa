"""The class's JupyterHub: nbgitpuller links, and the local hub that starts and stops here.

**Links.** One click on a JupyterHub pulls the class release into a learner's home.

nbgitpuller (https://nbgitpuller.readthedocs.io, the JupyterHub project's tool) serves
``<hub>/hub/user-redirect/git-pull?repo=...&branch=...&urlpath=...``: the learner's
server clones the repository (or merges the new commits into their copy, keeping their
changes), then opens ``urlpath``. The clone lands in a folder named after the repository
unless ``targetpath`` says otherwise.

>>> nbgitpuller_link("https://hub.example.edu", "https://github.com/acme/dtas-2027.git")
'https://hub.example.edu/hub/user-redirect/git-pull?repo=https%3A%2F%2Fgithub.com%2Facme%2Fdtas-2027.git&branch=main&urlpath=lab%2Ftree%2Fdtas-2027%2Fcourse%2F01-distributed-fundamentals.ipynb'

**The local hub.** :func:`local_hub` runs ``deploy/jupyterhub/jupyterhub_config.py`` (the
chart's values on one machine: a shared password, one local process per learner, homes
in a folder) on free loopback ports, and stops it with everything it started: the
proxy, the idle culler, each learner's server and their kernels. ``tests/test_class_day.py``
runs a class day on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

if TYPE_CHECKING:
    import psutil

FIRST_NOTEBOOK = "course/01-distributed-fundamentals.ipynb"
REPO_ROOT = Path(__file__).resolve().parents[2]
HUB_CONFIG = REPO_ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py"
# where `make hub-proxy` installs configurable-http-proxy (npm, pinned by its lock file)
HUB_PROXY = REPO_ROOT / ".cache" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


def _check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ssh", "git") or not parts.netloc:
        raise ValueError(f"{what} must be a full URL such as https://..., got {url!r}")
    return url.rstrip("/")


def nbgitpuller_link(
    hub: str, repo: str, *, branch: str = "main", path: str = FIRST_NOTEBOOK,
    target: str | None = None,
) -> str:  # fmt: skip
    """The link that pulls ``repo`` (its ``branch``) into a learner's server on ``hub`` and
    opens ``path`` (relative to the repository) in JupyterLab; ``target``: the folder in
    the learner's home (default: the repository's name)."""
    hub = _check_url(hub, "the hub")
    repo = _check_url(repo, "the repository")
    if not branch.strip():
        raise ValueError("the branch needs a name")
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"the path to open is relative to the repository, got {path!r}")
    folder = target or urlsplit(repo).path.rstrip("/").split("/")[-1].removesuffix(".git")
    query = {"repo": repo, "branch": branch, "urlpath": f"lab/tree/{folder}/{path}"}
    if target:
        query["targetpath"] = target
    return f"{hub}/hub/user-redirect/git-pull?{urlencode(query)}"


# ---------------------------------------------------------------- the local hub


class HubError(RuntimeError):
    """The local hub cannot start: a missing piece, or the hub exited or never answered."""


def find_proxy() -> Path | None:
    """configurable-http-proxy: ``DDTK_HUB_PROXY``, else ``make hub-proxy``'s, else the PATH's."""
    named = os.environ.get("DDTK_HUB_PROXY")
    if named:
        return Path(named) if os.access(named, os.X_OK) else None
    if HUB_PROXY.is_file():
        return HUB_PROXY
    found = shutil.which("configurable-http-proxy")
    return Path(found) if found else None


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (held open together so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _describe(proc: psutil.Process) -> str:
    import psutil

    try:
        return f"{proc.pid} ({' '.join(proc.cmdline()[:3])[:120]})"
    except psutil.Error:
        return str(proc.pid)


@dataclass
class LocalHub:
    """A running local hub: its public ``url`` (the proxy), its ``folder``, the login
    ``password``, the hub ``process`` and its three ``ports`` (public, hub API, proxy API)."""

    url: str
    folder: Path
    password: str
    process: subprocess.Popen[bytes]
    ports: tuple[int, int, int]

    @property
    def log(self) -> Path:
        """The hub's output, the proxy's and the culler's included."""
        return self.folder / "hub.log"

    def home(self, user: str) -> Path:
        """``user``'s home: their server's working folder, where nbgitpuller clones the release."""
        return self.folder / "homes" / user

    def family(self) -> list[psutil.Process]:
        """The hub and every live process under it: proxy, culler, servers, kernels, ranks."""
        import psutil

        try:
            hub = psutil.Process(self.process.pid)
            return [hub, *hub.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace: float = 30.0) -> list[str]:
        """Stop the hub as its operator would (SIGTERM: it stops the servers, their kernels,
        the culler and the proxy), wait up to ``grace`` seconds for all of them, then kill
        what is left. Returns what had to be killed: empty when the hub cleaned up after itself.
        """
        import psutil

        family = self.family()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        _gone, alive = psutil.wait_procs(family, timeout=max(1.0, grace / 6))
        left = []
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(_describe(proc))
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5)
        return left


def _wait_ready(hub: LocalHub, timeout: float) -> None:
    """Until the hub's API answers through the proxy (both are up and routed), or HubError."""
    deadline = time.monotonic() + timeout
    while True:
        if hub.process.poll() is not None:
            raise HubError(f"the hub exited with {hub.process.returncode}: "
                           f"{hub.log.read_text(errors='replace')[-3000:]}")  # fmt: skip
        try:
            with urllib.request.urlopen(f"{hub.url}/hub/api", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise HubError(f"the hub did not answer at {hub.url} within {timeout:.0f} s: "
                           f"{hub.log.read_text(errors='replace')[-3000:]}")  # fmt: skip
        time.sleep(0.25)


@contextlib.contextmanager
def local_hub(folder: Path, password: str, *, timeout: float = 120.0) -> Iterator[LocalHub]:
    """Run the local hub in ``folder`` (its database, log and the learners' homes) with the
    login ``password``; yield it once it answers, stop it (and everything under it) on exit.

    Raises :class:`HubError` when configurable-http-proxy or JupyterHub is missing, or
    when the hub exits or does not answer within ``timeout`` seconds.
    """
    proxy = find_proxy()
    if proxy is None:
        raise HubError("configurable-http-proxy is not installed: run `make hub-proxy` (npm)")
    if not HUB_CONFIG.is_file():
        raise HubError(f"{HUB_CONFIG} is missing: the local hub needs the course kit's deploy/")
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        raise HubError("JupyterHub is not installed: pip install -e '.[course]'") from None
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    ports = tuple(_free_ports(3))
    env = dict(
        os.environ,
        DDTK_HUB_DIR=str(folder), DDTK_HUB_PASSWORD=password, DDTK_HUB_PROXY=str(proxy),
        DDTK_HUB_PORT=str(ports[0]), DDTK_HUB_API_PORT=str(ports[1]),
        DDTK_HUB_PROXY_API_PORT=str(ports[2]),
    )  # fmt: skip
    with (folder / "hub.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(HUB_CONFIG)], cwd=folder, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    hub = LocalHub(f"http://127.0.0.1:{ports[0]}", folder, password, process, ports)
    try:
        _wait_ready(hub, timeout)
        yield hub
    finally:
        hub.stop()


__all__ = [
    "FIRST_NOTEBOOK", "HUB_CONFIG", "HUB_PROXY", "HubError", "LocalHub", "find_proxy",
    "local_hub", "nbgitpuller_link",
]  # fmt: skip
