"""ddtk.frameworks.ray_procs: what Ray's processes show on their command lines.

No public Ray API maps raylets to OS processes, so lecture 02 reads the process table.
The first tests check the parsing on command lines as Ray writes them; the last ones pin
the launcher conventions in the installed Ray (flag names, executable paths, process
titles), so that a Ray upgrade that changes them fails here rather than silently.
"""

from __future__ import annotations

import inspect

import psutil
import pytest

from ddtk.frameworks.ray_procs import NODE_ID_FLAG, ROLES, ray_role, raylet_node_id


class _Proc:
    """A stand-in for psutil.Process with a fixed command line."""

    def __init__(self, *argv: str, error: bool = False) -> None:
        self.argv, self.error = list(argv), error

    def cmdline(self) -> list[str]:
        if self.error:
            raise psutil.NoSuchProcess(1)
        return self.argv


RAYLET = (
    "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet",
    "--raylet_socket_name=/tmp/ray/session_x/sockets/raylet",
    "--node_manager_port=40123",
    "--node_id=0123abcd",
)


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (RAYLET, "raylet"),
        (("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=6379"), "GCS server"),
        (("ray::IDLE",), "worker process"),
        (("ray::Counter.inc",), "worker process"),
        (("ray::DashboardAgent", "--node-ip-address=127.0.0.1"), "dashboard agent"),
        (("ray::RuntimeEnvAgent",), "runtime-env agent"),
        (("python", "/venv/lib/python3.11/site-packages/ray/_private/log_monitor.py"), "log monitor"),
        (("python", "/venv/lib/python3.11/site-packages/ray/workers/default_worker.py"), "worker process"),
        (("python", "-m", "jupyter"), None),
    ],
)  # fmt: skip
def test_ray_role_reads_the_command_line(argv, role) -> None:
    assert ray_role(_Proc(*argv)) == role


def test_a_vanished_process_has_no_role_and_no_node() -> None:
    assert ray_role(_Proc(error=True)) is None
    assert raylet_node_id(_Proc(error=True)) is None


def test_raylet_node_id_comes_from_its_flag() -> None:
    assert raylet_node_id(_Proc(*RAYLET)) == "0123abcd"
    assert raylet_node_id(_Proc("ray::IDLE")) is None


# Pins on the installed Ray: if one fails after an upgrade, update ROLES / NODE_ID_FLAG.


@pytest.mark.ray
def test_installed_ray_passes_the_node_id_flag_to_the_raylet() -> None:
    services = pytest.importorskip("ray._private.services")
    assert f'f"{NODE_ID_FLAG}{{node_id}}"' in inspect.getsource(services.start_raylet)
    assert services.RAYLET_EXECUTABLE.replace("\\", "/").endswith(
        "raylet/raylet" + services.EXE_SUFFIX
    )
    assert "gcs_server" in services.GCS_SERVER_EXECUTABLE


@pytest.mark.ray
def test_installed_ray_titles_its_processes_as_ddtk_expects() -> None:
    constants = pytest.importorskip("ray._private.ray_constants")
    assert constants.WORKER_PROCESS_TYPE_IDLE_WORKER.startswith("ray::")
    assert constants.AGENT_PROCESS_TYPE_DASHBOARD_AGENT in ROLES
    assert constants.AGENT_PROCESS_TYPE_RUNTIME_ENV_AGENT in ROLES


def test_ray_still_says_timed_out_during_startup() -> None:
    """start_with_retry retries on this phrase of Ray's node start-up; pin it in the installed Ray."""
    node = pytest.importorskip("ray._private.node")
    from ddtk.frameworks.ray_procs import STARTUP_TIMEOUT

    assert STARTUP_TIMEOUT in inspect.getsource(node)


def _spawn_then(message: str, calls: list, fail_times: int):
    """A start function that leaves a child process behind and fails ``fail_times`` times."""
    import subprocess
    import sys

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        calls.append(proc)
        if len(calls) <= fail_times:
            raise Exception(message)  # Ray raises a bare Exception
        return proc

    return start


def test_start_with_retry_kills_what_a_timed_out_attempt_started_and_retries() -> None:
    from ddtk.frameworks.ray_procs import start_with_retry

    calls: list = []
    said: list[str] = []
    proc = start_with_retry(
        _spawn_then("The current node timed out during startup.", calls, 1), say=said.append
    )
    try:
        assert len(calls) == 2 and proc is calls[1]
        assert calls[0].poll() is not None  # the failed attempt's process was killed and reaped
        assert proc.poll() is None  # the successful one is left alone
        assert len(said) == 1 and "retrying" in said[0] and "1 processes" in said[0]
    finally:
        proc.kill()
        proc.wait()


def test_start_with_retry_raises_other_errors_and_the_last_timeout_without_leaving_processes() -> None:
    from ddtk.frameworks.ray_procs import start_with_retry

    calls: list = []
    with pytest.raises(Exception, match="port in use"):
        start_with_retry(_spawn_then("port in use", calls, 5), say=lambda _: None)
    assert len(calls) == 1 and calls[0].poll() is not None
    calls.clear()
    with pytest.raises(Exception, match="timed out during startup"):
        start_with_retry(_spawn_then("timed out during startup", calls, 5), 3, say=lambda _: None)
    assert len(calls) == 3 and all(c.poll() is not None for c in calls)
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        start_with_retry(lambda: None, 0)
