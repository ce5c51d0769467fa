"""``ddtk course lab`` (``make lab``): the JupyterLab command it builds, and the server it starts.

Unit tests pin each choice (root, display, port, token) through parameters; the
integration tests start the very command ``lab_command`` builds, and ``ddtk course lab``
itself, check that the server answers with the token, start a kernel, and check that
stopping leaves no server and no kernel behind.
"""

from __future__ import annotations

import contextlib
import doctest
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import default_sigint

from ddtk.course import lab
from ddtk.course.cli import main as course_main

ROOT = Path(__file__).resolve().parents[1]


def _choose(**kwargs: object) -> lab.LabChoices:
    defaults: dict[str, object] = {
        "root": ROOT,
        "euid": 1000,
        "environ": {"DISPLAY": ":0"},
        "platform": "linux",
        "token": "t0k",
        "port_free": lambda port, ip: True,
    }
    return lab.choose(**{**defaults, **kwargs})


# ---------------------------------------------------------------- the argv


@pytest.mark.parametrize("euid,expected", [(0, True), (1000, False), (-1, False)])
def test_allow_root_only_as_root(euid: int, expected: bool) -> None:
    choices = _choose(euid=euid)
    assert ("--allow-root" in lab.lab_command(choices)) is expected
    said = " ".join(lab.explain(choices))
    assert ("running as root: passing --allow-root" in said) is expected


def test_default_euid_is_this_process() -> None:
    choices = lab.choose(root=ROOT, token="x", port_free=lambda port, ip: True)
    assert choices.as_root is (os.geteuid() == 0)


@pytest.mark.parametrize(
    "environ,platform,no_browser,opens",
    [
        ({"DISPLAY": ":0"}, "linux", False, True),
        ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False, True),
        ({}, "linux", False, False),
        ({"DISPLAY": ""}, "linux", False, False),
        ({}, "darwin", False, True),
        ({}, "win32", False, True),
        ({"DISPLAY": ":0"}, "linux", True, False),
        ({}, "darwin", True, False),
    ],
)
def test_no_browser_without_display_or_when_asked(
    environ: dict[str, str], platform: str, no_browser: bool, opens: bool
) -> None:
    choices = _choose(environ=environ, platform=platform, no_browser=no_browser)
    assert choices.open_browser is opens
    assert ("--no-browser" in lab.lab_command(choices)) is not opens
    said = " ".join(lab.explain(choices))
    if not opens and not no_browser:
        assert "no display" in said and "not opening a browser" in said
    if no_browser:
        assert "--no-browser: not opening a browser" in said


def test_first_free_port_from_8888() -> None:
    busy = {8888, 8889}
    choices = _choose(port_free=lambda port, ip: port not in busy)
    assert choices.port == 8890
    assert "--port=8890" in lab.lab_command(choices)
    assert "--port-retries=0" in lab.lab_command(choices)
    assert any("8888-8889 are in use" in note for note in choices.notes)
    assert _choose().port == 8888


def test_given_port_is_used_or_refused() -> None:
    assert _choose(port=9123).port == 9123
    with pytest.raises(OSError, match="port 9123 is in use"):
        _choose(port=9123, port_free=lambda port, ip: False)
    with pytest.raises(OSError, match="are all in use"):
        _choose(port_free=lambda port, ip: False)


def test_port_is_free_sees_a_listening_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not lab.port_is_free(port)
        with pytest.raises(OSError, match=f"port {port} is in use"):
            lab.choose(port=port, root=ROOT, token="x")


def test_token_is_in_the_environment_and_url_not_the_argv() -> None:
    choices = _choose(token="s3cret")
    assert not any("s3cret" in arg for arg in lab.lab_command(choices))
    assert lab.lab_env(choices, {"PATH": "/bin"}) == {"PATH": "/bin", "JUPYTER_TOKEN": "s3cret"}
    assert choices.url == (
        "http://127.0.0.1:8888/lab/tree/course/01-distributed-fundamentals.ipynb?token=s3cret"
    )
    assert f"JupyterLab: {choices.url}" in lab.explain(choices)
    generated = _choose(token=None)
    assert len(generated.token) == 48 and int(generated.token, 16) >= 0
    assert _choose(token=None, environ={"JUPYTER_TOKEN": "mine"}).token == "mine"


def test_notebook_dir_is_the_repo_and_lecture_01_opens() -> None:
    argv = lab.lab_command(_choose(), python="/py")
    assert argv[:3] == ["/py", "-m", "jupyterlab"]
    assert f"--notebook-dir={ROOT}" in argv
    assert argv[-1] == "course/01-distributed-fundamentals.ipynb"


def test_missing_notebook_opens_the_file_browser(tmp_path: Path) -> None:
    choices = _choose(root=tmp_path)
    assert choices.notebook is None
    assert lab.lab_command(choices)[-1] == "--port-retries=0"
    assert choices.url.endswith("/lab?token=t0k")
    assert any("is missing" in note for note in choices.notes)


def test_listening_everywhere_prints_a_local_url() -> None:
    assert _choose(ip="0.0.0.0").url.startswith("http://127.0.0.1:8888/")
    assert "--ip=0.0.0.0" in lab.lab_command(_choose(ip="0.0.0.0"))


def test_cli_dry_run_prints_choices_and_command(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = course_main(
        ["lab", "--dry-run", "--no-browser", "--port", str(port), "--root", str(ROOT)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert f"--port={port}" in out and "--no-browser" in out and "JUPYTER_TOKEN=" in out
    assert "JupyterLab: http://127.0.0.1:" in out


@pytest.mark.parametrize("bad", ["0", "70000", "http"])
def test_cli_rejects_a_bad_port(bad: str) -> None:
    with pytest.raises(SystemExit) as caught:
        course_main(["lab", "--dry-run", "--port", bad])
    assert caught.value.code == 2


def test_module_docstring_examples() -> None:
    result = doctest.testmod(lab)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------- the real server

START_TIMEOUT = 90.0  # JupyterLab needs 10-40 s to answer on a loaded 2-core machine


def _os_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _isolated_env(tmp_path: Path, token: str) -> dict[str, str]:
    """The learner's environment, with Jupyter's runtime and settings files kept in tmp_path."""
    return {
        **os.environ,
        "JUPYTER_TOKEN": token,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
    }


def _request(url: str, token: str | None, method: str = "GET") -> tuple[int, bytes]:
    headers = {"Authorization": f"token {token}"} if token else {}
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _wait_for_status(base: str, token: str, proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            return _request(f"{base}/api/status", token)[0]
        if time.monotonic() > deadline:
            pytest.fail(f"no answer within {START_TIMEOUT:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _start_kernel(base: str, token: str, server: psutil.Process) -> list[psutil.Process]:
    """Start a python3 kernel through the REST API; return the server and its kernel processes."""
    status, body = _request(f"{base}/api/kernels", token, method="POST")
    assert status == 201, body
    assert json.loads(body)["name"]
    deadline = time.monotonic() + 30
    while not (kernels := server.children(recursive=True)):
        assert time.monotonic() < deadline, "the kernel process did not appear"
        time.sleep(0.2)
    return [server, *kernels]


def _assert_all_gone(family: list[psutil.Process]) -> None:
    _gone, alive = psutil.wait_procs(family, timeout=10)
    running = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for proc in running:
        proc.kill()
    assert not running, f"left running: {[(p.pid, p.cmdline()[:4]) for p in running]}"


@contextlib.contextmanager
def _server(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        # SIGINT at its default whatever this run inherited, so the Ctrl-C test is real.
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                lab.stop_server(proc, grace=20)


@pytest.mark.notebook
@pytest.mark.slow
def test_lab_command_serves_and_stops_cleanly(tmp_path: Path) -> None:
    choices = lab.choose(port=_os_free_port(), no_browser=True, root=ROOT)
    argv = lab.lab_command(choices)
    base = f"http://127.0.0.1:{choices.port}"
    log = tmp_path / "lab.log"
    with _server(argv, _isolated_env(tmp_path, choices.token), log) as proc:
        assert _wait_for_status(base, choices.token, proc, log) == 200
        assert _request(f"{base}/api/status", None)[0] == 403  # the token is really required
        family = _start_kernel(base, choices.token, psutil.Process(proc.pid))
        lab.stop_server(proc, grace=20)
    _assert_all_gone(family)
    assert "Shutting down 1 kernel" in log.read_text()


@pytest.mark.notebook
@pytest.mark.slow
def test_ddtk_course_lab_stops_on_ctrl_c(tmp_path: Path) -> None:
    port, token = _os_free_port(), "0123456789abcdef"
    argv = [sys.executable, "-m", "ddtk", "course", "lab", "--no-browser", f"--port={port}"]
    log = tmp_path / "ddtk.log"
    base = f"http://127.0.0.1:{port}"
    with _server(argv, _isolated_env(tmp_path, token), log) as ddtk:
        assert _wait_for_status(base, token, ddtk, log) == 200
        (server,) = psutil.Process(ddtk.pid).children()
        family = _start_kernel(base, token, server)
        ddtk.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does
        assert ddtk.wait(timeout=60) == 0, log.read_text()[-3000:]
    _assert_all_gone(family)
    text = log.read_text()
    assert "stopping JupyterLab and its kernels" in text
    assert (
        f"JupyterLab: {base}/lab/tree/course/01-distributed-fundamentals.ipynb?token={token}"
        in (text)
    )
