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
