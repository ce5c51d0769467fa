"""Say what is misconfigured on an RDMA cluster from the four checks run after setting it up.

After the drivers, limits, QoS and device plugins are in place, four outputs tell
whether the fabric works, from the bottom layer up (Lecture 4, section 6):

1. ``ibv_devinfo`` (:mod:`ddtk.net.ibv_devinfo`): is every port ``PORT_ACTIVE``, and on
   RoCE at an ``active_mtu`` of 4096?
2. ``ib_write_bw`` (:mod:`ddtk.net.perftest`): does one link alone reach its line rate?
3. ``nccl-tests`` (:mod:`ddtk.net.nccl_tests`): does the collective's busbw approach the
   NICs of a node together?
4. ``NCCL_DEBUG=INFO`` (:mod:`ddtk.net.nccl_log`): does NCCL run on InfiniBand/RoCE
   with GPUDirect RDMA, rather than on sockets or through host memory?

:func:`diagnose_rdma` reads the four texts (any of them may be missing) and returns
one :class:`Finding` per problem, bottom layer first, each with a key of
:data:`FIXES`: the fix that matches the cause. The per-layer functions take the parsed
outputs, so a check that already holds them (Lecture 4's exercise 6, its judge) uses the
same rules. ``min_fraction`` (0.8) is how close to its line rate a link, or a node's
NICs under nccl-tests, must come: NCCL's maintainers give "24GB/s ... per 200G NIC"
(nccl-tests #119), 96 % of the line rate.

A RoCE port at the RDMA MTU of a 1500-byte Ethernet MTU, and a container that cannot
see the NIC:

>>> ports = '''hca_id: mlx5_0
...         port:   1
...                 state:          PORT_ACTIVE (4)
...                 active_mtu:     1024 (3)
...                 link_layer:     Ethernet
... '''
>>> log = '''h1:70:70 [0] NCCL INFO NET/IB : No device found.
... h1:70:70 [0] NCCL INFO Using network Socket
... '''
>>> for f in diagnose_rdma(ibv_devinfo_text=ports, nccl_log_text=log, line_rate_gbps=400):
...     print(f"{f.where}: {f.key} ({f.problem})")
mlx5_0:1: jumbo frames (RoCE at active_mtu 1024)
nccl: expose the HCA (NCCL runs on sockets)
>>> link_findings(92.4, line_rate_gbps=400)[0].problem
'92.4 Gb/s is 23% of the 400 Gb/s line rate'
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtk.net import ibv_devinfo, nccl_log, nccl_tests, perftest

__all__ = [
    "FIXES", "MIN_FRACTION", "Finding", "busbw_findings", "diagnose_rdma", "link_findings",
    "nccl_findings", "port_findings",
]  # fmt: skip

MIN_FRACTION = 0.8
FIXES = {
    "no device": "load the RDMA drivers: MOFED/DOCA-OFED, or the distribution's rdma-core with "
    "mlx5_ib (`lsmod | grep mlx5_ib`); in a container, the device plugin's resource",
    "cable": "the port has no link: reseat or replace the cable or transceiver and check the "
    "switch port (`ibstat` phys state, `mlxlink -d <device>`)",
    "subnet manager": "an InfiniBand port in INIT has no subnet manager: run OpenSM or UFM on the "
    "fabric (`sminfo` finds it)",
    "jumbo frames": "RoCE below an active_mtu of 4096 runs on a 1500-byte Ethernet MTU: set MTU "
    "9000 on the netdev and on every switch port (`ip link set dev <netdev> mtu 9000`)",
    "link rate": "one link alone is slow: check the negotiated rate (`ibstat`), the PCIe link "
    "(`lspci -vvv`: LnkSta against LnkCap), the test's NUMA node, and on RoCE the pause and "
    "ECN counters (`ethtool -S <netdev>`): PFC or ECN is missing on the RDMA priority",
    "busbw": "the collective is slow although NCCL runs: check every link with ib_write_bw, "
    "then which NICs each rank uses (NCCL_IB_HCA, rails) in the NCCL_DEBUG=INFO log",
    "memlock": "ibv_reg_mr failed with 'Cannot allocate memory': raise the locked-memory limit "
    "(`ulimit -l unlimited`, LimitMEMLOCK=infinity for daemons, IPC_LOCK in containers)",
    "expose the HCA": "NCCL found no RDMA device and fell back to sockets: give the container "
    "/dev/infiniband (the RDMA or SR-IOV resource, IPC_LOCK), or fix an NCCL_IB_HCA that "
    "matches no device (`ibv_devinfo -l`)",
    "NCCL_IB_DISABLE": "NCCL_IB_DISABLE=1 is set in the job's environment: remove it",
    "peer memory": "IB without GPUDirect RDMA: load nvidia-peermem (`modprobe nvidia-peermem`) "
    "or use DMA-BUF (open GPU kernel modules, Linux 5.12 or later)",
    "no result": "ib_write_bw printed no result: start the server side first (`ib_write_bw -d "
    "<device>`), give the client the server's address, and read the error lines it printed",
    "PCIe path": "GPUDirect RDMA is off because GPU and NIC are far apart: check `nvidia-smi "
    "topo -m`; on bare metal disable PCIe ACS between them and boot with iommu=pt",
}


@dataclass(frozen=True)
class Finding:
    """One problem: ``where`` (``mlx5_0:1``, ``ibv_devinfo``, ``ib_write_bw``,
    ``nccl-tests``, ``nccl``), ``key`` (a key of :data:`FIXES`) and what was seen."""

    where: str
    key: str
    problem: str

    @property
    def fix(self) -> str:
        return FIXES[self.key]


def port_findings(ports: list[dict]) -> list[Finding]:
    """``ibv_devinfo.parse`` output: ports not up, RoCE ports below MTU 4096, no device."""
    if not ports:
        return [Finding("ibv_devinfo", "no device", "ibv_devinfo found no RDMA device")]
    found = []
    for p in ports:
        where, state = f"{p['device']}:{p['port']}", p["state"]
        if state == "PORT_DOWN":
            found.append(Finding(where, "cable", state))
        elif not ibv_devinfo.is_active(p):
            found.append(Finding(where, "subnet manager", state))
        elif p["link_layer"] == "Ethernet" and p["active_mtu"] < 4096:
            found.append(Finding(where, "jumbo frames", f"RoCE at active_mtu {p['active_mtu']}"))
    return found


def link_findings(write_bw_gbps: float | None, line_rate_gbps: float,
                  min_fraction: float = MIN_FRACTION) -> list[Finding]:  # fmt: skip
    """``ib_write_bw``'s average at its largest message, in Gb/s, against the line rate."""
    if line_rate_gbps <= 0:
        raise ValueError(f"line_rate_gbps must be positive, got {line_rate_gbps}")
    if write_bw_gbps is None or write_bw_gbps >= min_fraction * line_rate_gbps:
        return []
    share = write_bw_gbps / line_rate_gbps
    return [Finding("ib_write_bw", "link rate", f"{write_bw_gbps:.1f} Gb/s is {share:.0%} of the "
                    f"{line_rate_gbps:g} Gb/s line rate")]  # fmt: skip


def busbw_findings(parsed: dict, nics_per_node: int, line_rate_gbps: float,
                   min_fraction: float = MIN_FRACTION) -> list[Finding]:  # fmt: skip
    """``nccl_tests.parse`` output of an all-reduce over two or more nodes: the largest
    size's busbw (GB/s) against the NICs of one node together. One node tests NVLink,
    not the network, and output without the ``# Rank`` lines names no hosts: no finding."""
    if nics_per_node < 1:
        raise ValueError(f"nics_per_node must be at least 1, got {nics_per_node}")
    hosts = {d["host"] for d in parsed["devices"]}
    if len(hosts) < 2 or not parsed["rows"]:
        return []
    row = max(parsed["rows"], key=lambda r: r["size"])
    busbw = max(row["busbw"], row["inplace_busbw"])
    target = nics_per_node * line_rate_gbps / 8
    if busbw >= min_fraction * target:
        return []
    return [Finding("nccl-tests", "busbw", f"busbw {busbw:.1f} GB/s on {len(hosts)} nodes is "
                    f"{busbw / target:.0%} of {nics_per_node} x {line_rate_gbps:g} Gb/s = {target:.0f} GB/s")]  # fmt: skip


def nccl_findings(nccl: dict) -> list[Finding]:
    """``nccl_log.parse`` output: sockets instead of RDMA, IB without GPUDirect RDMA
    (by its reason), and memory registration refused by the locked-memory limit."""
    found = []
    if nccl["transport"] == "Socket":
        key = "NCCL_IB_DISABLE" if nccl["ib_disabled"] else "expose the HCA"
        found.append(Finding("nccl", key, "NCCL runs on sockets"))
    elif nccl["transport"] == "IB":
        distance = any("distance" in reason for reason in nccl["gdr_disabled"])
        why = "; ".join(nccl["gdr_disabled"]) or "no reason printed"
        found.append(Finding("nccl", "PCIe path" if distance else "peer memory",
                             f"NCCL runs on IB without GPUDirect RDMA ({why})"))  # fmt: skip
    if any("ibv_reg_mr" in w and "Cannot allocate memory" in w for w in nccl["warnings"]):
        found.append(Finding("nccl", "memlock", "ibv_reg_mr failed: Cannot allocate memory"))
    return found


def diagnose_rdma(*, ibv_devinfo_text: str | None = None, ib_write_bw_text: str | None = None,
                  nccl_tests_text: str | None = None, nccl_log_text: str | None = None,
                  line_rate_gbps: float, nics_per_node: int = 1,
                  min_fraction: float = MIN_FRACTION) -> list[Finding]:  # fmt: skip
    """Every problem the four outputs show, bottom layer first; an output left as None
    was not run. ``line_rate_gbps`` is one port's rate (200 for HDR, 400 for NDR);
    ``nics_per_node`` the RDMA NICs of a node, for the busbw target."""
    found = []
    if ibv_devinfo_text is not None:
        found += port_findings(ibv_devinfo.parse(ibv_devinfo_text))
    if ib_write_bw_text is not None:
        bw = perftest.parse(ib_write_bw_text)
        row = perftest.largest(bw)
        if row is None:
            key = "memlock" if any("allocate MR" in e for e in bw["errors"]) else "no result"
            found.append(
                Finding("ib_write_bw", key, "no result: " + ("; ".join(bw["errors"]) or "no row"))
            )
        else:
            found += link_findings(row["bw_average_gbps"], line_rate_gbps, min_fraction)
    if nccl_tests_text is not None:
        found += busbw_findings(nccl_tests.parse(nccl_tests_text), nics_per_node, line_rate_gbps,
                                min_fraction)  # fmt: skip
    if nccl_log_text is not None:
        found += nccl_findings(nccl_log.parse(nccl_log_text))
    return found
