"""How long a collective takes on a :class:`~ddtk.net.topology.Cluster`, and which link limits it.

The model, in one sentence: a collective costs the **latency of its steps** (a
protocol's per-hop latency times the number of sequential steps on each kind of
link, plus a fixed cost per call) plus the **time its busiest link needs to carry
its bytes**. Bytes are counted per link for each algorithm, following how NCCL
and ddtk move them (``S`` is the buffer in bytes, ``P`` ranks, ``N`` nodes of
``G`` GPUs with ``k`` NICs each):

==================  ==========================  ==========================  ===================
all_reduce          steps (intra / inter)       bytes per GPU link          bytes per NIC
==================  ==========================  ==========================  ===================
ring (flat)         2(P-1) - 2(N-1) / 2(N-1)    2(P-1)/P S (G-1)/G          2(P-1)/P S / k
tree (double bin.)  2(G-1) / 2 ceil(log2 N)     2S                          2S/k (S/k if N = 2)
hierarchical_rs     2(G-1) / 2(N-1), in phases  2(G-1)/G S                  2(N-1)/N S / k
hierarchical        2 ceil(log2 G) / 2(N-1)     2 ceil(log2 G) S (leader)   2(N-1)/N S (one NIC)
nvls (NVSwitch)     2 / tree across nodes       S (1 + 1/G)                 as tree
in_network (SHARP)  2(G-1) / 2                  2S                          S/k
==================  ==========================  ==========================  ===================

Ring, tree, NVLS and in-network reduction are pipelined, so their links work at
the same time and the slowest one sets the pace. The two hierarchical forms run
their phases one after the other: ``hierarchical_rs`` (Horovod's
``HOROVOD_HIERARCHICAL_ALLREDUCE``, ddtk's ``algorithm="hierarchical_rs"``) is a
reduce-scatter inside the node, G all-reduces of S/G across nodes (one per GPU and
its NIC) and an all-gather inside the node; ``hierarchical`` (ddtk's
``algorithm="hierarchical"``) is a binomial-tree reduce to one leader per node, a
ring all-reduce of the whole buffer among the leaders (one NIC each) and a
broadcast. NCCL builds neither, so neither is among the algorithms ``predict``
chooses from by itself (:data:`NCCL_ALGORITHMS`); ask for them by name.

Traffic that leaves a leaf switch also crosses its spine uplinks,
which an oversubscribed fabric makes slower than the NICs. all_gather and
reduce_scatter use a ring (half the all-reduce's steps and bytes); all_to_all
sends ``S/P`` to every peer at once, each GPU through its own NIC.

For each algorithm the protocol (NCCL: LL, LL128, Simple) with the lowest time
is chosen, as NCCL's tuner does, among the protocols NCCL enables on the cluster
(:meth:`~ddtk.net.topology.Cluster.enabled_protocols`: LL128 needs NVLink and a
near GPU-NIC path). ``busbw`` follows nccl-tests' convention
(algbw x 2(n-1)/n for all_reduce, (n-1)/n for the others), so predictions and
published measurements compare directly.

With ``Cluster.reduce_rate`` set (CPU ranks), the time to sum what arrives is added
(the gamma term of Thakur, Rabenseifner and Gropp): one thread per rank cannot
overlap it. What it leaves out, on purpose: kernel launch and host overheads below the
protocol's base latency, the ramp-up of NCCL's channels at medium sizes, CPU
and memory limits of PCIe boxes, congestion from other jobs, and adaptive
routing. ``ddtk.net.published`` measures what that costs against real runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddtk.net.topology import Cluster, Link, Protocol

COLLECTIVES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical", "hierarchical_rs", "nvls", "in_network"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("direct",),
}
NCCL_ALGORITHMS: tuple[str, ...] = ("ring", "tree", "nvls", "in_network", "direct")
"""What NCCL itself runs (in_network is CollNet, direct the all-to-all): ``predict``'s default choice."""
_BUS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


@dataclass(frozen=True)
class _Phase:
    """One stretch of an algorithm whose links work at the same time."""

    steps: dict[str, float]  # link name -> sequential steps over it
    nbytes: dict[str, float]  # link name -> bytes the busiest such link carries
    tree: bool = False
    reduced: float = 0.0  # bytes one rank sums in this phase (the gamma term)


@dataclass(frozen=True)
class Prediction:
    """The predicted cost of one collective call, and where it goes."""

    collective: str
    algorithm: str
    protocol: str
    nbytes: int
    ranks: int
    time: float
    latency: float
    transfer: float
    bottleneck: str
    link_times: dict[str, float] = field(default_factory=dict)

    @property
    def algbw(self) -> float:
        """Bytes per second the caller sees: nbytes / time."""
        return self.nbytes / self.time if self.time > 0 else math.inf

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth: algbw times the collective's factor."""
        return self.algbw * _BUS[self.collective](self.ranks) if self.ranks > 1 else 0.0


def _links(c: Cluster) -> dict[str, Link]:
    """The links an algorithm may load: GPU link, NIC, and the spine uplinks when they matter."""
    links = {"gpu": c.intra}
    if c.nodes > 1:
        assert c.nic is not None
        hops = 1 if c.leaves == 1 else 3  # leaf, or leaf - spine - leaf
        nic = Link(c.nic.bandwidth, c.nic.kind, c.nic.latency + hops * c.switch_latency)
        links["nic"] = nic
        if c.leaves > 1:
            links["uplink"] = nic  # same rate per byte; the bytes carry the oversubscription
    return links


def _uplink_share(c: Cluster, collective: str) -> float:
    """Bytes crossing the spine per byte a NIC sends, times the oversubscription (0: no spine)."""
    if c.leaves == 1:
        return 0.0
    npl = c.nodes_per_leaf or c.nodes
    if collective == "all_to_all":  # uniform traffic: the share of peers under other leaves
        return (c.nodes - npl) / (c.nodes - 1) * c.oversubscription
    return c.oversubscription / npl  # a ring leaves each leaf once per rail


def _ring(c: Cluster, collective: str, S: float) -> list[_Phase]:
    P, N, G, k = c.ranks, c.nodes, c.gpus_per_node, max(c.nics_per_node, 1)
    twice = 2 if collective == "all_reduce" else 1
    inter = twice * (N - 1)
    moved = twice * (P - 1) / P * S
    nbytes = {"gpu": moved * ((G - 1) / G if N > 1 else 1.0) if G > 1 else 0.0}
    if N > 1:
        nbytes["nic"] = moved / k
        nbytes["uplink"] = moved / k * _uplink_share(c, collective)
    reduced = (P - 1) / P * S if collective in ("all_reduce", "reduce_scatter") else 0.0
    return [_Phase({"gpu": twice * (P - 1) - inter, "nic": inter}, nbytes, reduced=reduced)]


def _tree(c: Cluster, S: float, gpu_bytes: float | None = None) -> list[_Phase]:
    N, G, k = c.nodes, c.gpus_per_node, max(c.nics_per_node, 1)
    depth = math.ceil(math.log2(N)) if N > 1 else 0
    nbytes = {"gpu": 2 * S if gpu_bytes is None else gpu_bytes}
    if N > 1:
        nbytes["nic"] = (S if N == 2 else 2 * S) / k
        nbytes["uplink"] = nbytes["nic"] * _uplink_share(c, "all_reduce")
    return [_Phase({"gpu": 2 * (G - 1), "nic": 2 * depth}, nbytes, tree=True, reduced=2 * S)]


def _hierarchical_leader(c: Cluster, S: float) -> list[_Phase]:
    """ddtk's form: binomial reduce to one leader per node, leaders' ring, binomial broadcast."""
    N, G = c.nodes, c.gpus_per_node
    depth = math.ceil(math.log2(G)) if G > 1 else 0
    reduce = _Phase({"gpu": depth}, {"gpu": depth * S}, reduced=depth * S)
    bcast = _Phase({"gpu": depth}, {"gpu": depth * S})
    if N == 1:
        return [reduce, bcast]
    inter_bytes = 2 * (N - 1) / N * S  # the leader's NIC alone carries the node's traffic
    inter = _Phase(
        {"nic": 2 * (N - 1)},
        {"nic": inter_bytes, "uplink": inter_bytes * _uplink_share(c, "all_reduce")},
        reduced=(N - 1) / N * S,
    )
    return [reduce, inter, bcast] if G > 1 else [inter]


def _hierarchical(c: Cluster, S: float) -> list[_Phase]:
    N, G, k = c.nodes, c.gpus_per_node, max(c.nics_per_node, 1)
    scatter = _Phase({"gpu": G - 1}, {"gpu": (G - 1) / G * S}, reduced=(G - 1) / G * S)
    gather = _Phase({"gpu": G - 1}, {"gpu": (G - 1) / G * S})
    if N == 1:
        return [scatter, gather]
    inter_bytes = 2 * (N - 1) / N * S / k
    inter = _Phase(
        {"nic": 2 * (N - 1)},
        {"nic": inter_bytes, "uplink": inter_bytes * _uplink_share(c, "all_reduce")},
        reduced=(N - 1) / N * S / G,
    )
    return [scatter, inter, gather] if G > 1 else [inter]


def _nvls(c: Cluster, S: float) -> list[_Phase]:
    G = c.gpus_per_node
    if c.nodes == 1:  # each GPU sends its buffer into the switch once, gets the sum back
        return [_Phase({"gpu": 2}, {"gpu": S * (1 + 1 / G)})]
    (tree,) = _tree(c, S, gpu_bytes=S * (1 + 1 / G))  # NVLS inside the node, a tree across
    return [_Phase({"gpu": 2, "nic": tree.steps["nic"]}, tree.nbytes, tree=True)]


def _in_network(c: Cluster, S: float) -> list[_Phase]:
    k = max(c.nics_per_node, 1)
    nic = S / k
    return [
        _Phase(
            {"gpu": 2 * (c.gpus_per_node - 1), "nic": 2},
            {"gpu": 2 * S, "nic": nic, "uplink": nic * _uplink_share(c, "all_reduce")},
        )
    ]


def _all_to_all(c: Cluster, S: float) -> list[_Phase]:
    P, G, k = c.ranks, c.gpus_per_node, max(c.nics_per_node, 1)
    nbytes = {"gpu": (G - 1) / P * S}
    if c.nodes > 1:
        per_nic = (P - G) / P * S * max(1.0, G / k)  # each GPU sends through one NIC
        nbytes["nic"] = per_nic
        nbytes["uplink"] = per_nic * _uplink_share(c, "all_to_all")
    return [_Phase({"gpu": 1 if G > 1 else 0, "nic": 1 if c.nodes > 1 else 0}, nbytes)]


def applicable(c: Cluster, collective: str) -> tuple[str, ...]:
    """The algorithms of ``collective`` that ``c`` can run (NVLS needs NVSwitch, SHARP a fabric)."""
    if collective not in COLLECTIVES:
        raise ValueError(
            f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}"
        )
    out = []
    for a in COLLECTIVES[collective]:
        if (a == "nvls" and not c.nvls) or (a == "in_network" and (not c.sharp or c.nodes == 1)):
            continue
        if a in ("tree", "hierarchical", "hierarchical_rs") and c.ranks < 2:
            continue
        out.append(a)
    return tuple(out)


def _phases(c: Cluster, collective: str, algorithm: str, S: float) -> list[_Phase]:
    if algorithm not in applicable(c, collective):
        raise ValueError(
            f"{algorithm!r} cannot run {collective} on {c.name} ({c.nodes} node(s)); "
            f"choose one of {', '.join(applicable(c, collective))}"
        )
    if collective == "all_to_all":
        return _all_to_all(c, S)
    builders = {
        "ring": lambda: _ring(c, collective, S),
        "tree": lambda: _tree(c, S),
        "hierarchical": lambda: _hierarchical_leader(c, S),
        "hierarchical_rs": lambda: _hierarchical(c, S),
        "nvls": lambda: _nvls(c, S),
        "in_network": lambda: _in_network(c, S),
    }
    return builders[algorithm]()


def _cost(
    c: Cluster, phases: list[_Phase], proto: Protocol
) -> tuple[float, float, str, dict[str, float]] | None:
    """(latency, transfer, bottleneck, per-link seconds) under ``proto``; None if it cannot run."""
    links = _links(c)
    latency, transfer, per_link = proto.base, 0.0, {}
    for phase in phases:
        slowest = 0.0
        for link_name, steps in phase.steps.items():
            if steps and link_name in links:
                latency += steps * proto.latency(links[link_name], tree=phase.tree)
        for link_name, nbytes in phase.nbytes.items():
            if nbytes <= 0 or link_name not in links:
                continue
            rate = proto.bandwidth(links[link_name])
            if rate <= 0:
                return None
            seconds = nbytes / rate
            per_link[link_name] = per_link.get(link_name, 0.0) + seconds
            slowest = max(slowest, seconds)
        transfer += slowest
        if c.reduce_rate and phase.reduced:  # one thread sums what arrives: not overlapped
            per_link["reduce"] = per_link.get("reduce", 0.0) + phase.reduced / c.reduce_rate
            transfer += phase.reduced / c.reduce_rate
    worst = max(per_link, key=per_link.__getitem__) if per_link else ""
    return latency, transfer, worst, per_link


def _describe(c: Cluster, link_name: str) -> str:
    if link_name == "gpu":
        return f"GPU link ({c.intra})"
    if link_name == "nic":
        return f"NICs ({c.nics_per_node} x {c.nic})"
    if link_name == "uplink":
        return f"spine uplinks ({c.oversubscription:g}:1 oversubscribed)"
    if link_name == "reduce":
        return "the reduction (summing what arrives)"
    return "latency"


def predict(
    cluster: Cluster,
    collective: str,
    nbytes: int,
    algorithm: str | None = None,
    protocol: str | None = None,
) -> Prediction:
    """The predicted time of one ``collective`` of ``nbytes`` on ``cluster``.

    ``algorithm`` None takes the fastest applicable one that NCCL runs
    (:data:`NCCL_ALGORITHMS`); ``protocol`` None the fastest protocol NCCL enables
    for it (NVLS runs Simple only; LL128 see :func:`~ddtk.net.topology.ll128_enabled`). ``nbytes`` follows nccl-tests: the buffer
    for all_reduce, the whole output for all_gather, the whole input for
    reduce_scatter, and what each rank sends in total for all_to_all.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or nbytes < 0:
        raise ValueError(f"nbytes must be a number of bytes >= 0, got {nbytes!r}")
    if algorithm is not None:
        algorithms: tuple[str, ...] = (algorithm,)
    else:
        algorithms = tuple(a for a in applicable(cluster, collective) if a in NCCL_ALGORITHMS)
    best: Prediction | None = None
    for a in algorithms:
        phases = _phases(cluster, collective, a, float(nbytes))
        for proto in cluster.enabled_protocols():
            if protocol is not None and proto.name != protocol:
                continue
            if a == "nvls" and proto.name != "Simple" and len(cluster.protocols) > 1:
                continue
            cost = _cost(cluster, phases, proto)
            if cost is None:
                continue
            latency, transfer, worst, per_link = cost
            time = latency + transfer if cluster.ranks > 1 else 0.0
            bottleneck = _describe(cluster, worst) if transfer > latency else "latency"
            guess = Prediction(collective, a, proto.name, int(nbytes), cluster.ranks, time,
                               latency, transfer, bottleneck, per_link)  # fmt: skip
            if best is None or guess.time < best.time:
                best = guess
    if best is None:
        raise ValueError(
            f"no protocol of {cluster.name} can run {collective}"
            + (f" with protocol {protocol!r}" if protocol else "")
        )
    return best


def crossover(
    cluster: Cluster, collective: str, first: str, second: str, lo: int = 1, hi: int = 1 << 36
) -> float | None:
    """The message size (bytes) at which ``second`` becomes faster than ``first``, or None.

    Found by bisection on a log scale, assuming one crossing in ``[lo, hi]``.
    """

    def ahead(size: float) -> bool:
        return (
            predict(cluster, collective, size, second).time
            < predict(cluster, collective, size, first).time
        )

    if ahead(lo) == ahead(hi):
        return None
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = (a + b) / 2
        if ahead(math.exp(mid)) == ahead(lo):
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)
