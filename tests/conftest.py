"""Shared fixtures: no process may outlive a test, and optional stacks skip or fail by policy."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import require_or_skip

# A run started in the background (`make test &`, nohup, some CI runners) inherits SIGINT
# ignored, and so would every process it starts: the Ctrl-C tests would then time out.
# A handler, unlike SIG_IGN, is reset to the default by exec, so children get Ctrl-C again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _children() -> list[psutil.Process]:
    """Live descendants, but for ddtk.launch's zygote: it lives as long as this process, by design."""
    from ddtk._forking import is_zygote

    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE and not is_zygote(p)
    ]


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail any test after which a child process of the test run is still alive."""
    before = {p.pid for p in _children()}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = [p for p in _children() if p.pid not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if left:
        names = ", ".join(f"{p.pid} ({' '.join(p.cmdline()[:4])})" for p in left)
        for p in left:
            p.kill()
        pytest.fail(f"processes left behind: {names}")


@pytest.fixture
def horovodrun() -> Path:
    """The ``horovodrun`` beside this interpreter, once Horovod is known to work with Gloo."""
    try:
        import horovod.torch as hvd
    except Exception as exc:
        require_or_skip("horovod", f"horovod.torch does not import ({exc}): run `make horovod`")
    if not hvd.gloo_built():
        require_or_skip("horovod", "Horovod was built without Gloo: run `make horovod`")
    path = Path(sys.executable).parent / "horovodrun"
    if not path.is_file():
        require_or_skip("horovod", f"{path} does not exist: run `make horovod`")
    return path


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch) -> Path:
    """This process's temporary files and folders go to a fresh folder, returned, so that a
    test can assert that what it ran removed its own (other workers' runs cannot blur it)."""
    import tempfile

    folder = tmp_path / "tempdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(scope="session")
def execution_cache():
    """The store of executed notebooks that every test of the session shares.

    A lab's own test and its graded class need the same sandboxed runs (the solution,
    the stub): whichever comes first executes them, the other reads them back
    (:mod:`ddtk.course.executions`). It lives in build/executed/ unless DDTK_EXECUTED
    names another folder; ``make test FRESH=1`` empties it first.
    """
    from ddtk.course.executions import ExecutionCache

    root = (
        os.environ.get("DDTK_EXECUTED")
        or Path(__file__).resolve().parents[1] / "build" / "executed"
    )
    return ExecutionCache(root)
