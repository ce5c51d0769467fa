"""A GPU cluster as data: GPUs per node, the fabric inside a node, NICs, switches.

:class:`Cluster` holds what decides how fast a collective can be, and nothing
else. Every rate is **per direction**, in bytes per second (datasheets give
NVLink as "bidirectional per GPU": 600 GB/s for A100 is 300 GB/s each way).

* ``intra``: the link from one GPU into the node's fabric (NVLink into NVSwitch,
  or PCIe into the host), and its ``kind`` (``"nvlink"``, ``"pci"``, ``"loopback"``).
* ``nic`` and ``nics_per_node``: the network cards of a node (a GPU-to-NIC *rail*
  each when ``rail_optimized``).
* ``nodes_per_leaf`` and ``oversubscription``: the switches. Nodes under one
  leaf switch talk at full speed; traffic between leaves climbs to the spine,
  whose uplinks carry ``1 / oversubscription`` of what the leaf's ports could send.
* ``nvls`` (NVLink SHARP: the NVSwitch reduces) and ``sharp`` (InfiniBand SHARP:
  the network switches reduce).
* ``reduce_rate``: bytes per second one rank sums (``a += b``), the gamma term of
  Thakur, Rabenseifner and Gropp (2005). None where reductions hide behind the
  links (a GPU reduces far faster than NVLink delivers); on a CPU they do not.
* ``protocols``: what software gets from the wire. For NCCL the three protocols
  LL, LL128 and Simple, each with a share of the link bandwidth and a latency
  per hop (:data:`NCCL_PROTOCOLS`); for this machine's gloo a single one.
* ``gpu_arch`` (compute capability x 10: 70, 80, 90) and ``gpu_nic_path`` (how
  NCCL classifies the PCIe path from a GPU to its NIC: ``"PIX"``, ``"PXB"``,
  ``"PXN"``, ``"PHB"``, ``"SYS"``) decide whether NCCL enables LL128
  (:func:`ll128_enabled`); ``net_protocols`` names the protocols a network
  plugin leaves on (None: all), e.g. aws-ofi-nccl's ``NCCL_PROTO=simple``.

The presets (:data:`PRESETS`) name the source of every number in ``sources``.
Predictions are in :mod:`ddtk.net.predict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ddtk.net.units import format_rate, parse_rate, parse_time

KINDS = ("nvlink", "pci", "net", "loopback")
PCI_PATHS = ("PIX", "PXB", "PXN", "PHB", "SYS")
"""NCCL's path types from a GPU to a NIC, nearest first (``PATH_PIX`` < ... < ``PATH_SYS``)."""


@dataclass(frozen=True)
class Link:
    """One kind of link, one direction: line rate (bytes/s), latency added per hop (s), and its kind."""

    bandwidth: float
    kind: str
    latency: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", parse_rate(self.bandwidth))
        object.__setattr__(self, "latency", parse_time(self.latency))
        if self.kind not in KINDS:
            raise ValueError(f"link kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind} {format_rate(self.bandwidth)}"


@dataclass(frozen=True)
class Protocol:
    """How a communication library uses a link: the share of its bandwidth, and latencies.

    ``efficiency[kind]`` is the fraction of a link's line rate the protocol delivers;
    ``hop[kind]`` the latency of one algorithm step over that kind of link (s);
    ``base`` the fixed cost of one collective call (s); ``tree_hop`` the latency of one
    tree step, where it differs from a ring step (NCCL's Simple tree moves 256 KiB chunks).
    """

    name: str
    efficiency: MappingProxyType
    hop: MappingProxyType
    base: float
    tree_hop: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def bandwidth(self, link: Link) -> float:
        """Bytes/s this protocol gets from ``link``."""
        return link.bandwidth * self.efficiency.get(link.kind, 0.0)

    def latency(self, link: Link, tree: bool = False) -> float:
        """Seconds per algorithm step over ``link``: the protocol's cost plus the link's own."""
        table = self.tree_hop if tree and link.kind in self.tree_hop else self.hop
        return table.get(link.kind, 0.0) + link.latency


def _table(**values: float) -> MappingProxyType:
    return MappingProxyType(dict(values))


_US = 1e-6
_SIMPLE = {"nvlink": 0.80, "pci": 24 / 31.5, "net": 0.96}
NCCL_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol(
        "LL",
        efficiency=_table(**{k: v / 4 for k, v in _SIMPLE.items()}),
        hop=_table(nvlink=0.47 * _US, pci=1.0 * _US, net=2.7 * _US),
        tree_hop=_table(nvlink=0.52 * _US, pci=1.0 * _US, net=5.0 * _US),
        base=3.6 * _US,
    ),
    Protocol(
        "LL128",
        efficiency=_table(nvlink=_SIMPLE["nvlink"] * 0.92, net=_SIMPLE["net"] * 0.92),
        hop=_table(nvlink=1.9 * _US, pci=2.5 * _US, net=4.0 * _US),
        tree_hop=_table(nvlink=1.2 * _US, pci=1.9 * _US, net=8.5 * _US),
        base=10.0 * _US,
    ),
    Protocol(
        "Simple",
        efficiency=_table(**_SIMPLE),
        hop=_table(nvlink=3.4 * _US, pci=5.7 * _US, net=9.6 * _US),
        tree_hop=_table(nvlink=28 * _US, pci=28 * _US, net=50 * _US),
        base=8.4 * _US,
    ),
)
"""NCCL's three protocols, with sources.

* Simple gets about 80 % of NVLink: "With the protocol overhead (~20%) NCCL can get an
  effective NVLink bandwidth of 370GB/s" of H100's 450 GB/s line rate (S. Jeaugey,
  NVIDIA/nccl-tests #212); 96 % of a NIC: "24GB/s is the peak performance per 200G NIC"
  (nccl-tests #119); 24 GB/s of a PCIe 4.0 x16 link, NCCL's ``PCI[24.0]`` in its topology
  dump (NVIDIA/nccl #1053), against 31.5 GB/s line rate.
* LL carries 4 B of data in every 8 B store, "which makes LL maximum bandwidth 50% of the
  peak", and LL128 120 B per 128 B line (S. Jeaugey, NVIDIA/nccl #281). NCCL's tuner
  counts LL ring at a quarter of the Simple bandwidth and LL128 at 0.92 of it (120/128),
  on NVLink and on the network alike; the efficiencies here are those. LL128 has no
  PCIe efficiency: NCCL never enables it without NVLink inside the node. Where NCCL
  enables it is :func:`ll128_enabled` (src/graph/tuning.cc; nccl #786).
* Latencies (base per call, per hop by link kind, tree hops apart): NCCL's tuning model,
  src/graph/tuning.cc (NVIDIA/nccl, commit 01afd20a), tables ``baseLat`` and ``hwLat``.
"""


@dataclass(frozen=True)
class Cluster:
    """A cluster of identical nodes (see the module docstring); ``with_nodes`` resizes it."""

    name: str
    gpus_per_node: int
    intra: Link
    nic: Link | None = None
    nics_per_node: int = 0
    nodes: int = 1
    rail_optimized: bool = True
    nodes_per_leaf: int | None = None
    oversubscription: float = 1.0
    switch_latency: float = 0.0
    nvls: bool = False
    sharp: bool = False
    protocols: tuple[Protocol, ...] = NCCL_PROTOCOLS
    sources: tuple[str, ...] = ()
    reduce_rate: float | None = None
    gpu_arch: int | None = None
    gpu_nic_path: str = "PXB"
    net_protocols: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.nodes > 1 and (self.nic is None or self.nics_per_node < 1):
            raise ValueError(f"{self.name}: {self.nodes} nodes need a nic and nics_per_node >= 1")
        if self.oversubscription < 1:
            raise ValueError(
                f"oversubscription is down:up bandwidth, >= 1; got {self.oversubscription}"
            )
        if self.nodes_per_leaf is not None and self.nodes_per_leaf < 1:
            raise ValueError(f"nodes_per_leaf must be >= 1 or None, got {self.nodes_per_leaf}")
        object.__setattr__(self, "switch_latency", parse_time(self.switch_latency))
        if not self.protocols:
            raise ValueError("a cluster needs at least one protocol")
        if self.gpu_nic_path not in PCI_PATHS:
            raise ValueError(
                f"gpu_nic_path must be one of {', '.join(PCI_PATHS)}, got {self.gpu_nic_path!r}"
            )

    def enabled_protocols(self) -> tuple[Protocol, ...]:
        """The protocols NCCL would enable on this cluster (see :func:`ll128_enabled`)."""
        out = []
        for proto in self.protocols:
            if proto.name == "LL128" and not ll128_enabled(self):
                continue
            plugin_off = self.net_protocols is not None and proto.name not in self.net_protocols
            if plugin_off and self.nodes > 1:  # the network plugin switched it off
                continue
            out.append(proto)
        return tuple(out)

    @property
    def ranks(self) -> int:
        """GPUs (ranks) in the whole cluster."""
        return self.nodes * self.gpus_per_node

    @property
    def leaves(self) -> int:
        """Leaf switches the nodes span (1 when every node sits under one switch)."""
        if self.nodes_per_leaf is None or self.nodes <= self.nodes_per_leaf:
            return 1
        return -(-self.nodes // self.nodes_per_leaf)

    def with_nodes(self, nodes: int) -> Cluster:
        """The same cluster with ``nodes`` nodes."""
        return replace(self, nodes=nodes)

    def describe(self) -> str:
        """One paragraph: what the cluster is made of."""
        text = (
            f"{self.name}: {self.nodes} node(s) x {self.gpus_per_node} GPUs, GPU link {self.intra}"
        )
        if self.nic is not None and self.nics_per_node:
            text += f", {self.nics_per_node} x {self.nic} per node"
            if self.rail_optimized:
                text += " (rail-optimised)"
        if self.leaves > 1:
            text += (
                f", {self.leaves} leaf switches of {self.nodes_per_leaf} nodes, "
                f"{self.oversubscription:g}:1 oversubscribed"
            )
        extras = [
            name for name, on in (("NVLink SHARP", self.nvls), ("IB SHARP", self.sharp)) if on
        ]
        return text + (f", {' and '.join(extras)}" if extras else "")


def ll128_enabled(c: Cluster) -> bool:
    """Whether NCCL enables LL128 by default on ``c``: its rule in src/graph/tuning.cc.

    NCCL's ``ncclTopoTuneModel`` turns LL128 on only where it has tested it: NVLink
    inside the node (``typeIntra <= PATH_NVB``), a GPU-NIC path no longer than
    ``PATH_PXB`` (or ``PATH_PXN`` on Hopper, compute capability 9.0), all GPUs of one
    architecture, and that architecture Volta, Ampere or Hopper ("Other cases are not
    tested and may cause silent data corruption"). Recent NCCL adds Blackwell (100, 120)
    to the list; 8.9 (Ada) and other architectures stay off. On one node the network path does
    not matter. A DGX H100 (NVLink, each GPU and its NIC behind one PCIe switch) meets
    it across nodes, so multi-node rings and trees run LL128 at medium sizes.
    ``gpu_arch`` None means "one of those", as in the presets that predate the field.
    """
    if c.intra.kind != "nvlink":
        return False
    if c.gpu_arch is not None and c.gpu_arch not in (70, 80, 90, 100, 120):
        return False
    if c.nodes == 1:
        return True
    rank = PCI_PATHS.index(c.gpu_nic_path)
    hopper = c.gpu_arch is not None and c.gpu_arch >= 90
    return rank <= PCI_PATHS.index("PXB") or (hopper and rank <= PCI_PATHS.index("PXN"))


# -- presets ---------------------------------------------------------------------------------
_NVLINK3 = (
    "NVLink 3: 12 links, 600 GB/s per A100 in total, 300 GB/s each way (nvidia.com NVLink page)"
)
_NVLINK4 = (
    "NVLink 4: 900 GB/s bidirectional per H100, 450 GB/s each way (NVIDIA Hopper "
    "architecture page); 'NVLink SHARP' in third-generation NVSwitch (same page)"
)
_HDR = (
    "InfiniBand HDR: 200 Gb/s per port, 'rate: 200 Gb/sec (4X HDR)' in ibstatus (NVIDIA/nccl #1412)"
)
_LL128 = (
    "LL128 across nodes: NVLink inside, GPU and NIC behind one PCIe switch (PXB), which "
    "NCCL's src/graph/tuning.cc requires before it enables LL128"
)
_OFI = (
    "aws-ofi-nccl sets NCCL_PROTO=simple when the EFA endpoint cannot guarantee 128-byte "
    "in-order stores (force_proto_simple for p4d/p4de in its platform table)"
)
_NDR = (
    "InfiniBand NDR: 400 Gb/s per ConnectX-7 port, 'Rate: 400' in ibstat (deepseek-ai/DeepEP #303)"
)

DGX_A100 = Cluster(
    "DGX A100",
    gpus_per_node=8,
    intra=Link("300GB/s", "nvlink"),
    nic=Link("200Gbit", "net"),
    nics_per_node=8,
    gpu_arch=80,
    gpu_nic_path="PXB",
    sources=(
        _NVLINK3,
        "8 single-port ConnectX-6 HDR NICs for the compute fabric (NVIDIA DGX A100 datasheet, 2020)",
        _HDR,
        _LL128,
    ),
)
DGX_H100 = Cluster(
    "DGX H100",
    gpus_per_node=8,
    intra=Link("450GB/s", "nvlink"),
    nic=Link("400Gbit", "net"),
    nics_per_node=8,
    nvls=True,
    gpu_arch=90,
    gpu_nic_path="PXB",
    sources=(
        _NVLINK4,
        _LL128,
        "'Four OSFP ports serving eight single-port NVIDIA ConnectX-7 VPI ... up to 400 Gb/s "
        "InfiniBand/Ethernet' (NVIDIA DGX BasePOD reference architecture, core components)",
        _NDR,
    ),
)
PCIE_8GPU = Cluster(
    "8-GPU PCIe server",
    gpus_per_node=8,
    intra=Link("31.5GB/s", "pci"),
    nic=Link("100Gbit", "net"),
    nics_per_node=1,
    sources=(
        "PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s each way (PCIe 4.0 base spec)",
        "one 100 Gb/s NIC per server, a common configuration (an assumption, not a product)",
        "on PCIe boxes 'the performance you get is usually determined by the bandwidth your CPU "
        "and memory can deliver' (S. Jeaugey, NVIDIA/nccl #1639): the model does not see that",
    ),
)
CLOUD_EFA_P4D = Cluster(
    "AWS p4d (8 x A100, EFA)",
    gpus_per_node=8,
    intra=Link("300GB/s", "nvlink"),
    nic=Link("100Gbit", "net"),
    nics_per_node=4,
    gpu_arch=80,
    net_protocols=("Simple",),
    sources=(
        _NVLINK3,
        _OFI,
        "'8 x 40 GB NVIDIA Tesla A100 GPUs with NVSwitch and 400 Gbps Elastic Fabric Adapter' "
        "(AWS Compute blog, 'Amazon EC2 P4d instances deep dive'): 4 x 100 Gb/s EFA",
    ),
)
CLOUD_EFA_P5 = Cluster(
    "AWS p5 (8 x H100, EFA)",
    gpus_per_node=8,
    intra=Link("450GB/s", "nvlink"),
    nic=Link("400Gbit", "net"),
    nics_per_node=8,
    nvls=True,
    gpu_arch=90,
    net_protocols=("Simple",),
    sources=(
        _NVLINK4,
        _OFI,
        "'P5 ... support up to 32 network cards and can provide up to 3,200 Gbps' (AWS EC2 user "
        "guide, p5 EFA page): modelled as 8 x 400 Gb/s, one rail per GPU",
    ),
)
CLOUD_ETHERNET = Cluster(
    "cloud VM, 8 x A100, 100 GbE (TCP)",
    gpus_per_node=8,
    intra=Link("300GB/s", "nvlink"),
    nic=Link("100Gbit", "net"),
    nics_per_node=1,
    rail_optimized=False,
    gpu_nic_path="SYS",
    sources=(
        _NVLINK3,
        "one 100 Gb/s Ethernet NIC without RDMA: 'Ethernet has no GPU Direct RDMA, so everything "
        "has to go through the CPU' (S. Jeaugey, NVIDIA/nccl #601); an assumption, not a product",
    ),
)

PRESETS: MappingProxyType = MappingProxyType(
    {
        "dgx-a100": DGX_A100,
        "dgx-h100": DGX_H100,
        "pcie-8gpu": PCIE_8GPU,
        "aws-p4d": CLOUD_EFA_P4D,
        "aws-p5": CLOUD_EFA_P5,
        "cloud-ethernet": CLOUD_ETHERNET,
    }
)


def preset(name: str, nodes: int = 1) -> Cluster:
    """A preset by name (see :data:`PRESETS`), with ``nodes`` nodes."""
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name].with_nodes(nodes)


def loopback(
    ranks: int, bandwidth: float | str, latency: float | str, reduce_rate: float | None = None
) -> Cluster:
    """This machine's ranks as a cluster: one rank per "node", each with one loopback link.

    ``bandwidth`` and ``latency`` are measured here (``iperf3`` over loopback, a
    ping-pong), so the model reduces to the alpha-beta model of a flat ring, plus the
    time to sum what arrives when ``reduce_rate`` (bytes/s, measured) is given.
    """
    link = Link(parse_rate(bandwidth), "loopback")
    proto = Protocol(
        "tcp",
        efficiency=_table(loopback=1.0),
        hop=_table(loopback=parse_time(latency)),
        base=0.0,
    )
    return Cluster(
        "this machine (loopback TCP)",
        gpus_per_node=1,
        intra=link,
        nic=link,
        nics_per_node=1,
        nodes=ranks,
        protocols=(proto,),
        sources=("bandwidth, latency and reduction rate measured on this machine",),
        reduce_rate=reduce_rate,
    )
