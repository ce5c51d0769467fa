"""Kernel traffic shaping: each rank in its own network namespace, behind a rate-limited link.

:class:`~ddtk.net.emulate.EmulatedNetwork` delays ddtk's own messages inside its
transport. This module shapes *every* socket instead, gloo's own all-reduce and
``iperf3`` included, the way a slow NIC would: it needs root (``CAP_NET_ADMIN``).

::

    with ShapedNetwork(4, rate="1Gbit", slow={3: "200Mbit"}) as net:
        print(net.iperf3(0, 1))                       # the raw link, measured
        ddtk.launch(work, 4, network=net)             # ranks 0..3 in namespaces

What it builds (``ip`` and ``tc`` from iproute2, nothing else):

* one network namespace per rank (``ddtk<pid>-<rank>``), with an interface
  ``eth0`` at ``10.<net>.0.<rank+1>``, and ``lo``;
* a bridge in this namespace at ``10.<net>.0.254``; each rank's ``eth0`` is one
  end of a ``veth`` pair whose other end is a port of the bridge. The launcher's
  rendezvous store listens on the bridge, which every rank reaches;
* a ``tbf`` (token bucket filter) qdisc on both ends of every pair: the rank's
  end limits what it sends, the bridge's end what it receives. So every rank has
  a full-duplex "NIC" of ``rate``, and ``slow`` gives some ranks a slower one.

The kernel of this course's machines has ``tbf`` and ``htb`` but not ``netem``,
so this shapes **bandwidth only**: latency stays what veth and the bridge give
(tens of microseconds). Use the emulator for latency.

Ranks join their namespace as their first act (``DDTK_NETNS``, see
:mod:`ddtk._rank`), use ``GLOO_SOCKET_IFNAME=eth0``, and take ``transport="tcp"``:
shared memory would go around the shaped links. Leaving the ``with`` block
deletes everything; namespaces of a dead process are removed by the next
:class:`ShapedNetwork` (:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import string
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddtk.comm.shm import pid_alive
from ddtk.net.units import format_rate, parse_rate

NETNS_ENV = "DDTK_NETNS"
NETNS_DIR = Path("/var/run/netns")
PREFIX = "ddtk"
IFNAME = "eth0"
_CLONE_NEWNET = 0x40000000
_available: str | bool | None = False  # False: not checked yet


class ShapingUnavailable(RuntimeError):
    """This machine cannot shape traffic with namespaces and tbf; the message says why."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why kernel shaping cannot run here (not Linux, not root, no ``ip``/``tc``, no tbf), or None."""
    global _available
    if _available is not False:
        return _available  # type: ignore[return-value]
    reason = _probe()
    _available = reason
    return reason


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"network namespaces are a Linux feature; this is {sys.platform}"
    if os.geteuid() != 0:
        return "creating network namespaces and qdiscs needs root (CAP_NET_ADMIN)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (Debian package iproute2)"
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", name)
        _run("ip", "-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "p0", "root", "tbf",
             "rate", "1gbit", "burst", "64kb", "latency", "100ms")  # fmt: skip
    except RuntimeError as exc:
        return f"this kernel or container refused: {exc}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


def join_namespace(name: str) -> None:
    """Move this process into network namespace ``name`` (``/var/run/netns/<name>``).

    Called by a rank before it opens any socket. Linux ``setns(2)`` through libc,
    since ``os.setns`` only exists from Python 3.12.
    """
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _owner(name: str) -> int | None:
    """The process id in a name this module made (``ddtk<pid><letter>...``), or None."""
    if not name.startswith(PREFIX):
        return None
    digits = re.match(r"\d+", name[len(PREFIX) :])
    return int(digits.group()) if digits else None


def sweep_stale() -> list[str]:
    """Delete namespaces and bridges left by ShapedNetworks whose process is gone; return their names."""
    removed = []
    names = _run("ip", "netns", "list", check=False).stdout.split()
    bridges = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    names += [
        line.split(":")[1].strip().split("@")[0] for line in bridges.splitlines() if ":" in line
    ]
    for name in names:
        pid = _owner(name)
        if pid is None or pid_alive(pid):
            continue
        if "-" in name:  # a namespace, ddtk<pid><letter>-<rank>
            _run("ip", "netns", "del", name, check=False)
        else:  # a bridge, ddtk<pid><letter>b
            _run("ip", "link", "del", name, check=False)
        removed.append(name)
    return removed


_instances = itertools.count()


class ShapedNetwork:
    """``world_size`` namespaces on one bridge, each behind a ``tbf`` of ``rate`` (see the module docstring).

    Args:
        world_size: how many ranks (namespaces) the network has.
        rate: every rank's link speed, both directions (``"1Gbit"``, or bytes/s).
        slow: rank -> a lower rate for that rank's link (a NIC that negotiated down).
        subnet: the second octet of ``10.<subnet>.0.0/24`` (default: from this process's id).
    """

    def __init__(
        self,
        world_size: int,
        rate: float | str,
        slow: Mapping[int, float | str] | None = None,
        subnet: int | None = None,
    ):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        self.world_size = world_size
        self.rate = parse_rate(rate)
        self.slow = {int(r): parse_rate(v) for r, v in dict(slow or {}).items()}
        bad = [r for r in self.slow if not 0 <= r < world_size]
        if bad:
            raise ValueError(f"slow names rank(s) {bad}; the network has ranks 0..{world_size - 1}")
        # Names carry this process's id (for sweep_stale) and a letter per instance: the
        # kernel removes a deleted namespace's links asynchronously, so the next network of
        # this process must not reuse them. Interface names have at most 15 characters.
        tag = f"{os.getpid()}{string.ascii_lowercase[next(_instances) % 26]}"
        self.subnet = subnet if subnet is not None else 100 + os.getpid() % 150
        self.bridge = f"{PREFIX}{tag}b"
        self.namespaces = [f"{PREFIX}{tag}-{r}" for r in range(world_size)]
        self._ports = [f"{PREFIX}{tag}p{r}" for r in range(world_size)]
        self.up = False

    # -- addresses and rates ------------------------------------------------------------
    @property
    def bridge_ip(self) -> str:
        """The launcher's side of the network, where the rendezvous store listens."""
        return f"10.{self.subnet}.0.254"

    def ip(self, rank: int) -> str:
        """Rank ``rank``'s address on its ``eth0``."""
        return f"10.{self.subnet}.0.{rank + 1}"

    def rate_of(self, rank: int) -> float:
        """Bytes/s of rank ``rank``'s link, each direction."""
        return self.slow.get(rank, self.rate)

    def __str__(self) -> str:
        slow = "".join(f"; rank {r}: {format_rate(v)}" for r, v in self.slow.items())
        return f"shaped links (tbf): {format_rate(self.rate)} per rank{slow}"

    # -- life cycle ---------------------------------------------------------------------
    def __enter__(self) -> ShapedNetwork:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        """Build the namespaces, the bridge, the veth pairs and their qdiscs."""
        reason = unavailable_reason()
        if reason:
            raise ShapingUnavailable(f"kernel traffic shaping is not available here: {reason}")
        sweep_stale()
        self.up = True  # from here on, destroy() has something to remove
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for rank in range(self.world_size):
                self._add_rank(rank)
        except BaseException:
            self.destroy()
            raise

    def _add_rank(self, rank: int) -> None:
        ns, port = self.namespaces[rank], self._ports[rank]
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
        _run("ip", "link", "set", port, "master", self.bridge)
        _run("ip", "link", "set", port, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.ip(rank)}/24", "dev", IFNAME)
        _run("ip", "-n", ns, "link", "set", IFNAME, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        rate = self.rate_of(rank)
        _tbf(port, rate)  # what the rank receives
        _tbf(IFNAME, rate, ns)  # what the rank sends

    def destroy(self) -> None:
        """Remove the veth pairs, the namespaces and the bridge."""
        if not self.up:
            return
        for port in self._ports:  # at once: a namespace's own links go when the kernel gets to it
            _run("ip", "link", "del", port, check=False)
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        self.up = False

    # -- running things inside ------------------------------------------------------------
    def prepare(self, world_size: int, transport: str) -> tuple[str, str, list[dict[str, str]]]:
        """What :func:`ddtk.launch` needs: the store's host, the transport, per-rank environment."""
        if not self.up:
            raise RuntimeError(
                "the ShapedNetwork is not up: use it in a `with` block (or call create())"
            )
        if world_size != self.world_size:
            raise ValueError(
                f"this ShapedNetwork has {self.world_size} namespaces, the launch asks for "
                f"{world_size} ranks"
            )
        if transport == "shm":
            raise ValueError(
                "transport='shm' would move ddtk's messages through shared memory, around the "
                "shaped links; use transport='tcp' (or 'auto') with a ShapedNetwork"
            )
        # TORCH_CPP_LOG_LEVEL: c10d warns on every connection that a namespace without DNS
        # cannot name the peer's address; nothing else is lost at that level.
        envs = [
            {NETNS_ENV: ns, "GLOO_SOCKET_IFNAME": IFNAME, "MASTER_ADDR": self.bridge_ip,
             "TORCH_CPP_LOG_LEVEL": "ERROR"}
            for ns in self.namespaces
        ]  # fmt: skip
        return self.bridge_ip, "tcp", envs

    def wrap(self, comm: Any, rank: int) -> Any:
        """The rank's transport, unchanged: the kernel shapes its sockets already."""
        return comm

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside rank ``rank``'s namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]

    def iperf3(self, src: int, dst: int, seconds: float = 1.0, port: int = 5201) -> dict[str, Any]:
        """Measure the raw link from rank ``src`` to rank ``dst`` with ``iperf3`` (TCP, one stream).

        Returns ``bits_per_second`` (received), ``bytes_per_second``, ``retransmits`` and
        the command. Needs the ``iperf3`` program (Debian package iperf3).
        """
        return iperf3(self.command(dst, []), self.command(src, []), self.ip(dst), seconds, port)


def _tbf(dev: str, rate: float, ns: str | None = None) -> None:
    """A token bucket filter of ``rate`` bytes/s as the root qdisc of ``dev``.

    The bucket (burst) holds 2 ms of traffic, at least 64 KiB, so that segmentation
    offload's large packets fit; packets wait at most 200 ms in the queue.
    """
    burst = max(64 << 10, int(rate * 2e-3))
    prefix = ["ip", "netns", "exec", ns] if ns else []
    _run(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
         "rate", f"{int(rate * 8)}bit", "burst", str(burst), "latency", "200ms")  # fmt: skip


def iperf3(
    server_prefix: Sequence[str],
    client_prefix: Sequence[str],
    server_ip: str,
    seconds: float = 1.0,
    port: int = 5201,
) -> dict[str, Any]:
    """Run an ``iperf3`` server (one test) and a client against it; the received rate.

    ``server_prefix`` and ``client_prefix`` wrap the two commands (``ip netns exec ns``,
    or nothing on this host). The server is always stopped.
    """
    if shutil.which("iperf3") is None:
        raise FileNotFoundError(
            "iperf3 is not installed (Debian package iperf3: apt-get install iperf3)"
        )
    server = subprocess.Popen(
        [*server_prefix, "iperf3", "-s", "-1", "-p", str(port), "-B", server_ip],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        argv = [
            *client_prefix,
            "iperf3",
            "-c",
            server_ip,
            "-p",
            str(port),
            "-t",
            str(seconds),
            "-J",
        ]
        result, error = None, ""
        for _ in range(50):  # the server needs a moment to listen
            done = subprocess.run(argv, capture_output=True, text=True)
            with contextlib.suppress(json.JSONDecodeError):
                report = json.loads(done.stdout)
                error = report.get("error", "")
                if done.returncode == 0 and "sum_received" in report.get("end", {}):
                    result = report["end"]
                    break
            time.sleep(0.1)
        if result is None:
            raise RuntimeError(f"iperf3 client failed: {error or done.stderr[-500:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.kill()
        server.wait()
    received = result["sum_received"]["bits_per_second"]
    return {
        "bits_per_second": received,
        "bytes_per_second": received / 8,
        "retransmits": result.get("sum_sent", {}).get("retransmits"),
        "seconds": seconds,
        "command": " ".join(argv[len(client_prefix) :]),
    }


def loopback_iperf3(seconds: float = 1.0, port: int = 5201) -> dict[str, Any]:
    """``iperf3`` over this host's loopback: the ceiling of any TCP transport between local ranks."""
    return iperf3([], [], "127.0.0.1", seconds, port)
