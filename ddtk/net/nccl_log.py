"""Read what an ``NCCL_DEBUG=INFO`` log says about the network NCCL chose.

NCCL prints, once per communicator, the network plugin it loaded and the devices it
found, then one line per channel and peer naming the transport. The lines that matter
for the network (formats of NCCL's ``src/transport/net_ib``, ``net_socket`` and
``init.cc``; hosts, pids and addresses vary)::

    node1:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.11<0>
    node1:100:100 [0] NCCL INFO Using network IB
    node1:100:120 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
    node1:100:100 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)
    node1:100:100 [0] NCCL INFO NET/IB : No device found.
    node1:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.11<0>
    node1:100:100 [0] NCCL INFO Using network Socket
    node1:100:130 [0] misc/ibvwrap.cc:153 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory

:func:`parse` reduces a log to the inter-node ``transport``, named as Lecture 4's
exercise 1 names it: ``"IB+GDR"`` when a channel runs ``via NET/IB/<n>/GDRDMA``
(GPUDirect RDMA: the NIC reads and writes GPU memory), ``"IB"`` for ``via NET/IB/<n>``
without it (every chunk staged in host memory), ``"Socket"`` when NCCL uses its TCP
transport, and ``"none"`` when no channel crosses a network (one node). It also keeps
why: no IB device, ``NCCL_IB_DISABLE`` set, the reason GPUDirect RDMA was disabled
(``no module``: neither ``nvidia-peermem`` nor DMA-BUF; ``distance 7 > 5``: the GPU and
the NIC are too far apart on PCIe), and the ``WARN`` lines. A channel of an InfiniBand
net plugin loaded in place of NCCL's own (``via NET/IBext_v8/2``, the SHARP plugin of
HPC-X and NVIDIA's containers) counts as IB.

A job whose inter-node channels stage every chunk in host memory, and why:

>>> log = parse('''\
... node1:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.11<0>
... node1:100:100 [0] NCCL INFO Using network IB
... node1:100:100 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)
... node1:100:120 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0
... ''')
>>> log["transport"], log["gdr_disabled"], log["ib_devices"][0], log["net_channels"]
('IB', ['no module'], ('mlx5_0', 1, 'IB'), {'IB': 1})
>>> parse("n1:1:2 [0] NCCL INFO Channel 01/0 : 2[2] -> 10[2] [send] via NET/IBext_v8/1/GDRDMA")["transport"]
'IB+GDR'
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["parse"]

_NCCL = re.compile(r"\bNCCL (INFO|WARN)\b")
_CHANNEL = re.compile(r"via NET/(IB\w*|Socket)/\d+(/GDRDMA)?")  # IB, or a plugin: IBext_v8
_IB_DEVICES = re.compile(r"NET/IB : Using (.*?)(?:;|$)")
_IB_DEVICE = re.compile(r"\[\d+\]([\w.-]+):(\d+)/(IB|RoCE)")
_GDR_OFF = re.compile(r"GPU Direct RDMA Disabled for (.*?)\s*\(([^)]*)\)\s*$")
_GDR_ON = re.compile(r"GPU Direct RDMA (?:\(DMABUF\) )?[Ee]nabled for (.*?)\s*$")
_COMM = re.compile(r"\bnRanks (\d+) nNodes (\d+)")
_NETWORK = re.compile(r"Using network (\S+)")


def _transport(channels: Counter, network: str | None) -> str:
    """The inter-node transport, as exercise 1 of Lecture 4 defines it."""
    if channels["IB+GDR"]:
        return "IB+GDR"
    if channels["IB"]:
        return "IB"
    if channels["Socket"] or network == "Socket":
        return "Socket"
    return "none"


def parse(log: str) -> dict:
    """What a log says about the network: ``transport``, ``network`` (the plugin NCCL
    loaded), ``ib_devices`` (``(device, port, "IB" or "RoCE")``), ``net_channels``
    (channel lines per transport), ``gdr_enabled`` and ``gdr_disabled`` (the reasons in
    parentheses), ``no_ib_device``, ``ib_disabled``, ``nranks``, ``nnodes``, ``warnings``.

    ``ValueError`` when the text holds no NCCL line at all (NCCL_DEBUG was not set).
    """
    if not isinstance(log, str):
        raise TypeError(f"an NCCL log must be text, got {type(log).__name__}")
    lines = [line for line in log.splitlines() if _NCCL.search(line)]
    if not lines:
        raise ValueError("no 'NCCL INFO' or 'NCCL WARN' line: run the job with NCCL_DEBUG=INFO")
    channels: Counter = Counter()
    out: dict = {"network": None, "ib_devices": [], "gdr_enabled": [], "gdr_disabled": [],
                 "no_ib_device": False, "ib_disabled": False, "nranks": None, "nnodes": None,
                 "warnings": []}  # fmt: skip
    for line in lines:
        if m := _CHANNEL.search(line):
            channels["Socket" if m[1] == "Socket" else "IB+GDR" if m[2] else "IB"] += 1
        elif m := _IB_DEVICES.search(line):
            out["ib_devices"] = [(d, int(p), kind) for d, p, kind in _IB_DEVICE.findall(m[1])]
        elif m := _GDR_OFF.search(line):
            out["gdr_disabled"].append(m[2])
        elif m := _GDR_ON.search(line):
            out["gdr_enabled"].append(m[1])
        elif m := _COMM.search(line):
            out["nranks"], out["nnodes"] = int(m[1]), int(m[2])
        elif m := _NETWORK.search(line):
            out["network"] = m[1]
        out["no_ib_device"] |= "NET/IB : No device found" in line
        out["ib_disabled"] |= bool(re.search(r"NCCL_IB_DISABLE set by environment to 1", line))
        if " NCCL WARN " in line:
            out["warnings"].append(line.split(" NCCL WARN ", 1)[1].strip())
    out["net_channels"] = dict(channels)
    out["transport"] = _transport(channels, out["network"])
    return out
