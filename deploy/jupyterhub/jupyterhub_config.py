"""A JupyterHub for the class on one machine: values.yaml's hub, minus Kubernetes.

    DDTK_HUB_PASSWORD=... jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

runs the hub that ``values.yaml`` describes for the zero-to-jupyterhub chart, on this
machine, with no root and no user accounts: what a workshop laptop or a CI test can run.
``ddtk.course.hub.local_hub`` starts and stops it; ``tests/test_class_day.py`` runs a
whole class day on it in a browser. Everything a learner meets is read from
``values.yaml``, so the two cannot drift apart:

- ``singleuser.defaultUrl`` (JupyterLab), ``singleuser.startTimeout``,
  ``singleuser.extraEnv`` and the kernel culling of ``singleuser.extraFiles``
  (``MappingKernelManager``, passed to each server on its command line);
- ``cull``: the idle culler (jupyterhub-idle-culler) as a hub-managed service with the
  chart's role and the values' timeout, interval and maximum age;
- ``hub.config.Authenticator.admin_users``: the instructor is an admin;
- ``singleuser.cpu`` and ``singleuser.memory``: JupyterHub hands them to each server as
  ``CPU_LIMIT``, ``CPU_GUARANTEE``, ``MEM_LIMIT`` and ``MEM_GUARANTEE``. A local process
  spawner does not enforce them (Kubernetes does, in the chart): a local class shares
  the machine.

What differs, because there is no cluster:

- **Login**: the values' NativeAuthenticator (sign-up, then the instructor's approval)
  becomes JupyterHub's DummyAuthenticator with one shared password, ``DDTK_HUB_PASSWORD``
  (required; any user name logs in with it). Use it on a trusted machine only.
- **Servers**: ``SimpleLocalProcessSpawner`` runs each learner's ``jupyterhub-singleuser``
  as a process of the hub's own user, with its home at ``DDTK_HUB_DIR/homes/<name>``,
  instead of a Pod with a persistent volume. Learners are not isolated from each other.
- **The release**: as on the cluster, an nbgitpuller link (``ddtk course pull-link``)
  clones the class repository into the learner's home; nbgitpuller must be installed
  beside JupyterLab (``pip install -e '.[course]'``) and ``git`` on the PATH.
- **The proxy**: configurable-http-proxy from npm, the version the chart's proxy image
  runs, which ``make hub-proxy`` installs into ``.cache/hub-proxy`` (``DDTK_HUB_PROXY``
  names another one).

Environment: ``DDTK_HUB_PASSWORD`` (required), ``DDTK_HUB_DIR`` (the hub's database,
cookie secret, proxy pid file and the homes; default ``build/hub``), ``DDTK_HUB_PORT``
(the public port, default 8000), ``DDTK_HUB_API_PORT`` (the hub's internal port, 8081),
``DDTK_HUB_PROXY_API_PORT`` (the proxy's API, 8001). Everything listens on 127.0.0.1.
"""

import os
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = Path(__file__).resolve().with_name("values.yaml")
PROXY = ROOT / ".cache" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)


def _setting(values: dict, dotted: str, *more: str):
    """``values.yaml``'s value at ``dotted`` (``"cull.timeout"``) then the keys ``more`` (which
    may hold dots: ``"jupyter_server_config.json"``), or a clear error."""
    node, keys = values, [*dotted.split("."), *more]
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            where = ".".join(keys)
            raise SystemExit(f"{VALUES} has no {where}: the local hub takes it from there")
        node = node[key]
    return node


def _port(name: str, default: int) -> int:
    text = os.environ.get(name, str(default))
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise SystemExit(f"{name} must be a port number (1-65535), got {text!r}")
    return int(text)


def _proxy() -> str:
    named = os.environ.get("DDTK_HUB_PROXY")
    found = named or (str(PROXY) if PROXY.is_file() else shutil.which("configurable-http-proxy"))
    if not found or not os.access(found, os.X_OK):
        raise SystemExit(
            f"configurable-http-proxy not found ({named or PROXY}): run `make hub-proxy` "
            "(npm) or set DDTK_HUB_PROXY"
        )
    return found


password = os.environ.get("DDTK_HUB_PASSWORD", "")
if len(password) < 8:
    raise SystemExit(
        "set DDTK_HUB_PASSWORD (8 characters or more): the password every learner logs in with"
    )
values = yaml.safe_load(VALUES.read_text())
folder = Path(os.environ.get("DDTK_HUB_DIR") or ROOT / "build" / "hub").absolute()
(folder / "homes").mkdir(parents=True, exist_ok=True)
port = _port("DDTK_HUB_PORT", 8000)
api_port = _port("DDTK_HUB_API_PORT", 8081)
proxy_api_port = _port("DDTK_HUB_PROXY_API_PORT", 8001)
bin_dir = Path(sys.executable).parent  # the hub's environment serves the learners too

# --- the hub and its proxy, on loopback
c.JupyterHub.bind_url = f"http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = api_port
c.JupyterHub.db_url = f"sqlite:///{folder / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(folder / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.command = [_proxy()]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(folder / "jupyterhub-proxy.pid")
# Stopping the hub stops the proxy and every learner's server (the defaults, said here
# because the class-day test relies on it).
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True

# --- login: one shared password instead of the values' NativeAuthenticator
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = password
c.Authenticator.allow_all = True
c.Authenticator.admin_users = set(_setting(values, "hub.config.Authenticator.admin_users"))

# --- each learner's server: a local process with a home of its own
single = _setting(values, "singleuser")
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = str(folder / "homes" / "{username}")
c.Spawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
c.Spawner.default_url = _setting(values, "singleuser.defaultUrl")
c.Spawner.start_timeout = int(_setting(values, "singleuser.startTimeout"))
c.Spawner.http_timeout = 120  # a server's first start on a busy 2-core machine
c.Spawner.environment = {k: str(v) for k, v in (single.get("extraEnv") or {}).items()}
c.Spawner.cpu_limit = float(_setting(values, "singleuser.cpu.limit"))
c.Spawner.cpu_guarantee = float(_setting(values, "singleuser.cpu.guarantee"))
c.Spawner.mem_limit = _setting(values, "singleuser.memory.limit")
c.Spawner.mem_guarantee = _setting(values, "singleuser.memory.guarantee")
server_config = _setting(values, "singleuser.extraFiles", "jupyter_server_config.json", "data")
c.Spawner.args = [
    f"--{cls}.{key}={value}"
    for cls, traits in server_config.items()
    for key, value in traits.items()
]
if os.geteuid() == 0:  # a container run as root: Jupyter Server refuses root without it
    c.Spawner.args.append("--allow-root")

# --- the idle culler, as the chart runs it (its service and role), with the values' times
cull = _setting(values, "cull")
if cull.get("enabled"):
    c.JupyterHub.services = [
        {
            "name": "idle-culler",
            "command": [
                sys.executable, "-m", "jupyterhub_idle_culler",
                f"--timeout={int(cull['timeout'])}",
                f"--cull-every={int(cull['every'])}",
                f"--max-age={int(cull.get('maxAge') or 0)}",
                f"--cull-users={bool(cull.get('users'))}",
            ],
        }
    ]  # fmt: skip
    scopes = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
    if cull.get("users"):
        scopes.append("admin:users")
    c.JupyterHub.load_roles = [
        {"name": "idle-culler", "scopes": scopes, "services": ["idle-culler"]}
    ]
