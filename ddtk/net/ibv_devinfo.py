"""Read the output of ``ibv_devinfo`` (rdma-core's libibverbs) into one record per port.

``ibv_devinfo`` is the first check after an RDMA driver is installed: it lists every
device the verbs library can open, and for each port its state, MTU, LIDs and link
layer. The format, as rdma-core's ``libibverbs/examples/devinfo.c`` prints it::

    hca_id:     mlx5_0
        transport:                      InfiniBand (0)
        fw_ver:                         20.31.1014
        vendor_part_id:                 4123
        phys_port_cnt:                  1
                port:   1
                        state:                  PORT_ACTIVE (4)
                        max_mtu:                4096 (5)
                        active_mtu:             4096 (5)
                        sm_lid:                 1
                        port_lid:               3
                        port_lmc:               0x00
                        link_layer:             InfiniBand

What a port needs before NCCL can use it: ``state`` PORT_ACTIVE (PORT_INIT on
InfiniBand means no subnet manager has configured it), and on RoCE (``link_layer:
Ethernet``) an ``active_mtu`` of 4096, which needs a jumbo Ethernet MTU; LIDs are zero
on RoCE and non-zero on a managed InfiniBand fabric. With ``-v`` the tool also prints
each port's GID table (``GID[  3]: ::ffff:10.0.0.11, RoCE v2``), from which
``NCCL_IB_GID_INDEX`` is chosen on RoCE; :func:`parse` keeps those lines too. Tabs or
spaces (a copy from a terminal or a web page) read the same.

A RoCE port that is up but runs at the RDMA MTU of a 1500-byte Ethernet MTU:

>>> text = '''hca_id: mlx5_0
...         transport:                      InfiniBand (0)
...         fw_ver:                         28.39.1002
...                 port:   1
...                         state:                  PORT_ACTIVE (4)
...                         max_mtu:                4096 (5)
...                         active_mtu:             1024 (3)
...                         port_lid:               0
...                         link_layer:             Ethernet
... '''
>>> (port,) = parse(text)
>>> port["device"], port["port"], port["state"], port["active_mtu"], port["link_layer"]
('mlx5_0', 1, 'PORT_ACTIVE', 1024, 'Ethernet')
>>> is_active(port), port["fw_ver"], parse("No IB devices found")
(True, '28.39.1002', [])
"""

from __future__ import annotations

import re

__all__ = ["NO_DEVICES", "is_active", "parse"]

NO_DEVICES = "No IB devices found"  # what ibv_devinfo prints when the verbs library sees no device
_HCA = re.compile(r"^hca_id:\s*(\S+)\s*$")
_PORT = re.compile(r"^\s+port:\s*(\d+)\s*$")
_FIELD = re.compile(r"^\s+([a-z_]+):\s*(.*?)\s*$")
_GID = re.compile(r"^\s+GID\[\s*(\d+)\]:\s*([0-9a-fA-F:.]+)(?:,\s*(.+?))?\s*$")
_PORT_INTS = ("max_mtu", "active_mtu", "sm_lid", "port_lid")
_DEVICE_FIELDS = ("transport", "fw_ver", "node_guid", "vendor_id", "vendor_part_id", "board_id")


def _value(key: str, text: str) -> int | str:
    """``PORT_ACTIVE (4)`` -> ``PORT_ACTIVE``; ``4096 (5)`` -> 4096; LIDs -> int."""
    head = text.split(" (")[0].strip()
    if key in _PORT_INTS:
        try:
            return int(head, 16) if head.lower().startswith("0x") else int(head, 10)
        except ValueError:
            raise ValueError(f"ibv_devinfo: {key} is not a number: {text!r}") from None
    return head


def parse(text: str) -> list[dict]:
    """One dict per port, in the order listed: ``device``, ``port``, ``state``,
    ``link_layer``, ``active_mtu``, ``max_mtu``, ``sm_lid``, ``port_lid``, the device's
    ``fw_ver`` and ``vendor_part_id``, and ``gids`` (``(index, gid, type)``, with ``-v``).

    An empty list when the tool found no device (:data:`NO_DEVICES`); ``ValueError``
    for text that is not ``ibv_devinfo`` output at all.
    """
    if not isinstance(text, str):
        raise TypeError(f"ibv_devinfo output must be text, got {type(text).__name__}")
    ports: list[dict] = []
    device: dict | None = None
    port: dict | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if m := _HCA.match(line):
            device, port = {"device": m[1]}, None
        elif device is None:
            continue  # a libibverbs warning or a shell prompt before the first device
        elif m := _PORT.match(line):
            port = {"device": device["device"], "port": int(m[1]), "gids": []}
            port.update({k: device[k] for k in _DEVICE_FIELDS if k in device})
            ports.append(port)
        elif (m := _GID.match(line)) and port is not None:
            port["gids"].append((int(m[1]), m[2], m[3] or ""))
        elif m := _FIELD.match(line):
            target = port if port is not None else device
            target[m[1]] = _value(m[1], m[2]) if port is not None else m[2].split(" (")[0]
    if not text.strip():
        raise ValueError(
            "empty ibv_devinfo output: with no device it prints 'No IB devices found' on "
            "stderr, so capture both streams (ibv_devinfo > out.txt 2>&1)"
        )
    if not ports and device is None and NO_DEVICES not in text:
        raise ValueError(
            "not ibv_devinfo output: no 'hca_id:' line and no 'No IB devices found'; "
            f"got {text.strip()[:80]!r}"
        )
    for p in ports:
        missing = [k for k in ("state", "active_mtu", "link_layer") if k not in p]
        if missing:
            raise ValueError(
                f"ibv_devinfo: {p['device']} port {p['port']} has no {', '.join(missing)}"
            )
    return ports


def is_active(port: dict) -> bool:
    """The port is up and configured (``PORT_ACTIVE``, or ``PORT_ACTIVE_DEFER``)."""
    return str(port.get("state", "")).startswith("PORT_ACTIVE")
