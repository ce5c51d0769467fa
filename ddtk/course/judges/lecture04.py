"""Lecture 04 (NCCL and networking): the judged exercises 1 to 6.

Every exercise is a pure function, so each check calls it once in a worker on inputs
the judge builds from its secret seed, and compares with what it planted or computes
itself (see :mod:`ddtk.course.judging`):

1. **read an NCCL log**: seeded logs in NCCL's own format (hosts, ranks, channels,
   bootstrap interfaces drawn at random), one per situation: IB with and without
   GPUDirect RDMA, sockets because no IB device exists or because ``NCCL_IB_DISABLE``
   is set, one node only (which still prints ``Using network IB``), and a bootstrap on
   the Docker bridge in both of NCCL's spellings. The judge knows the transport and
   the fixes it planted.
2. **usable RDMA ports**: seeded ``ibstatus`` texts (InfiniBand, RoCE and both mixed,
   at 100, 200 or 400 Gb/s, device numbers past 10, dual-port HCAs) with healthy,
   unconfigured, down, slower and SM-less ports planted; the judge knows which ports
   are usable and the exact ``NCCL_IB_HCA`` value.
3. **place TP, PP and DP**: seeded job shapes; the judge checks the groups' structure
   itself: a partition per kind, groups of different kinds meet in one rank at most,
   TP groups on one node, and DP and PP groups that join the same TP shard (and DP
   groups the same stage): gradients averaged across different shards are wrong.
4. **cheapest fabric**: seeded presets, leaf sizes, collectives, message sizes,
   tolerances and oversubscription choices; the judge runs the network model itself.
5. **find the slow NIC**: seeded bandwidth matrices with slow NICs, slow paths and a
   degraded link planted near the seeded threshold.
6. **name the RDMA fixes**: seeded ``ibv_devinfo`` texts (ports down, in INIT, RoCE at
   MTU 1024, InfiniBand at 2048, healthy; and no device at all), ``ib_write_bw``
   averages just under and just over 80 % of 100, 200 or 400 Gb/s, and NCCL logs of
   every transport and cause (no module, distance, no IB device, ``NCCL_IB_DISABLE``,
   ``ibv_reg_mr`` refused), each parsed by ``ddtk.net``'s parsers as the lecture does;
   the judge's answer comes from ``ddtk.net.rdma_check``'s rules.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from ddtk.course.checks import CheckFailed, expect
from ddtk.course.judges._data import outcome, plain
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
_NET = ("ddtk.net",)


# ------------------------------------------------------------------ exercise 1


def probe_nccl_logs(ns: dict[str, Any], logs: list[str]) -> list[Any]:
    """``read_nccl_log`` on each of ``logs``."""
    return [plain(ns["read_nccl_log"](log)) for log in logs]


_SITUATIONS = ("IB+GDR", "IB", "Socket: no IB device", "Socket: IB disabled", "none")


def nccl_log(rng: random.Random, situation: str, docker: str | None) -> tuple[str, tuple]:
    """A seeded NCCL ``INFO`` log of ``situation``, with the bootstrap on the Docker bridge
    when ``docker`` is ``"Bootstrap"`` or ``"NET/Socket"`` (the line that says so);
    and the ``(transport, fixes)`` a correct reading gives."""
    host = f"{rng.choice(['gpu', 'node', 'worker', 'a100-', 'h100-'])}{rng.randint(1, 99):02d}"
    pid, ip = (
        rng.randint(1000, 99999),
        f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(2, 250)}",
    )
    gpus, nodes = 8, 1 if situation == "none" else rng.choice([2, 4])
    iface = rng.choice(["eth0", "ens5", "enp1s0f0", "bond0"])

    def line(text: str, gpu: int = 0) -> str:
        return f"{host}:{pid}:{pid + rng.randint(1, 60)} [{gpu}] NCCL INFO {text}"

    lines = [
        line(f"NCCL version 2.{rng.randint(18, 23)}.{rng.randint(1, 9)}+cuda12.{rng.randint(1, 6)}")
    ]
    boot = "docker0:172.17.0.1<0>" if docker == "Bootstrap" else f"{iface}:{ip}<0>"
    lines.append(line(f"Bootstrap : Using {boot}"))
    fixes: dict[str, str] = {}
    if situation == "Socket: IB disabled":
        lines.append(line("NCCL_IB_DISABLE set by environment to 1."))
        fixes["NCCL_IB_DISABLE"] = "0"
    if situation == "Socket: no IB device":
        lines.append(line("NET/IB : No device found."))
    socket_if = "docker0:172.17.0.1<0>" if docker == "NET/Socket" else f"{iface}:{ip}<0>"
    if situation.startswith("Socket"):
        lines.append(line(f"NET/Socket : Using [0]{socket_if}"))
        lines.append(line("Using network Socket"))
    else:
        hcas = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(rng.choice([1, 2, 4])))
        lines.append(line(f"NET/IB : Using {hcas} ; OOB {iface}:{ip}<0>"))
        lines.append(line("Using network IB"))
    rank0 = rng.randrange(nodes) * gpus
    lines.append(line(f"comm 0x{rng.getrandbits(28):x} rank {rank0} nRanks {nodes * gpus} nNodes {nodes} "
                      f"localRanks {gpus} localRank 0 MNNVL 0"))  # fmt: skip
    for c in range(rng.randint(2, 4)):
        a = rng.randrange(gpus)
        p2p = rng.choice(["P2P/CUMEM/read", "P2P/direct pointer/read", "P2P/IPC"])
        lines.append(
            line(
                f"Channel {c:02d}/0 : {rank0 + a}[{a}] -> {rank0 + (a + 1) % gpus}[{(a + 1) % gpus}] via {p2p}",
                a,
            )
        )
        if nodes > 1:
            peer = (rank0 + gpus + a) % (nodes * gpus)
            how = {"IB+GDR": f"NET/IB/{a % 4}/GDRDMA", "IB": f"NET/IB/{a % 4}"}.get(
                situation, f"NET/Socket/{a % 2}"
            )
            lines.append(
                line(f"Channel {c:02d}/0 : {rank0 + a}[{a}] -> {peer}[{a}] [send] via {how}", a)
            )
    # "IB" (no GPUDirect RDMA) has no fix in a variable: the causes are on the host
    if docker:
        fixes["NCCL_SOCKET_IFNAME"] = "^lo,docker"
    transport = situation.split(":")[0]
    return "\n".join(lines) + "\n", (transport, fixes)


def check_nccl_log(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = [(s, None) for s in _SITUATIONS]
    cases += [
        (rng.choice(["IB+GDR", "IB"]), "Bootstrap"),
        (rng.choice(_SITUATIONS[2:4]), "NET/Socket"),
    ]
    rng.shuffle(cases)
    made = [nccl_log(rng, situation, docker) for situation, docker in cases]
    got = ctx.worker().probe(f"{_P}:probe_nccl_logs", logs=[log for log, _ in made])
    for (situation, docker), (_log, want), found in zip(cases, made, got):
        what = f"a seeded log of {situation}" + (
            f", bootstrap on docker0 ({docker} line)" if docker else ""
        )
        found = list(found) if isinstance(found, list | tuple) else found
        expect(isinstance(found, list) and len(found) == 2, f"read_nccl_log on {what}",
               expected="a (transport, fixes) pair", got=found)  # fmt: skip
        expect(found[0] == want[0], f"the transport read_nccl_log finds in {what}",
               expected=want[0], got=found[0])  # fmt: skip
        expect(found[1] == want[1], f"the fixes read_nccl_log gives for {what}",
               expected=want[1], got=found[1])  # fmt: skip


# ------------------------------------------------------------------ exercise 2


def probe_ports(
    ns: dict[str, Any], texts: list[str], rates: list[int], lists: list[list[str]]
) -> dict:
    """``usable_ports`` on each text, ``nccl_ib_hca`` on the judge's lists and on ``[]``."""
    return {
        "ports": [plain(ns["usable_ports"](t, r)) for t, r in zip(texts, rates)],
        "hca": [outcome(lambda p=p: ns["nccl_ib_hca"](list(p))) for p in lists],
        "empty": outcome(lambda: ns["nccl_ib_hca"]([])),
    }


_SPEEDS = {100: "4X EDR", 200: "4X HDR", 400: "4X NDR"}


def ib_port(dev: str, number: int, *, state: str = "4: ACTIVE", phys: str = "5: LinkUp",
            rate: str = "200 Gb/sec (4X HDR)", lid: str = "0x22", layer: str = "InfiniBand") -> str:  # fmt: skip
    """One port in ``ibstatus``'s format."""
    sm = "0x0" if lid == "0x0" else "0x1"
    return (f"Infiniband device '{dev}' port {number} status:\n"
            f"\tdefault gid:\t fe80:0000:0000:0000:0c42:a103:00{number:02x}:{int(dev.split('_')[-1]):04x}\n"
            f"\tbase lid:\t {lid}\n\tsm lid:\t\t {sm}\n\tstate:\t\t {state}\n"
            f"\tphys state:\t {phys}\n\trate:\t\t {rate}\n\tlink_layer:\t {layer}\n\n")  # fmt: skip


def ibstatus(rng: random.Random, fabric: int, layers: tuple[str, ...]) -> tuple[str, list[str]]:
    """A seeded ``ibstatus`` output at ``fabric`` Gb/s, and the ports a correct reading keeps."""
    rate = f"{fabric} Gb/sec ({_SPEEDS[fabric]})"
    lower = [s for s in _SPEEDS if s < fabric]
    slower = f"{max(lower)} Gb/sec ({_SPEEDS[max(lower)]})" if lower else "40 Gb/sec (4X QDR)"
    devs = sorted(rng.sample(range(16), 9))
    kinds = [
        "healthy",
        "healthy",
        "no SM",
        "init",
        "down",
        "slower",
        "healthy",
        "disabled",
        "healthy",
    ]
    rng.shuffle(kinds)
    text, usable = "", []
    for i, (d, kind) in enumerate(zip(devs, kinds)):
        layer = layers[i % len(layers)]
        eth = layer == "Ethernet"
        lid = "0x0" if eth else f"0x{rng.randint(2, 0x3FF):x}"
        ports = [1, 2] if rng.random() < 0.3 else [1]
        for n in ports:
            kw: dict[str, str] = {"rate": rate, "lid": lid, "layer": layer}
            if kind == "no SM" and not eth:
                kw["lid"] = "0x0"
            elif kind == "init":
                kw.update(state="2: INIT", lid="0x0")
            elif kind == "down":
                kw.update(state="1: DOWN", phys="2: Polling")
            elif kind == "disabled":
                kw.update(state="1: DOWN", phys="3: Disabled")
            elif kind == "slower":
                kw["rate"] = slower
            text += ib_port(f"mlx5_{d}", n, **kw)
            if kind == "healthy" or (kind == "no SM" and eth):
                usable.append(f"mlx5_{d}:{n}")
    return text, usable


def check_ports(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    nodes = [("an InfiniBand node", ("InfiniBand",)), ("a RoCE node", ("Ethernet",)),
             ("a node with InfiniBand and RoCE ports", ("InfiniBand", "Ethernet"))]  # fmt: skip
    fabrics = [rng.choice(list(_SPEEDS)) for _ in nodes]
    made = [ibstatus(rng, f, layers) for f, (_, layers) in zip(fabrics, nodes)]
    lists = [usable for _, usable in made if usable] + [["mlx5_1:1", "mlx5_12:2"]]
    got = ctx.worker().probe(
        f"{_P}:probe_ports", texts=[t for t, _ in made], rates=fabrics, lists=lists
    )
    for (label, _), fabric, (_, want), found in zip(nodes, fabrics, made, got["ports"]):
        expect(found == want, f"usable_ports on a seeded ibstatus of {label} at {fabric} Gb/s "
               "(up, LinkUp, at the fabric's rate, with a LID on InfiniBand)", expected=want, got=found)  # fmt: skip
    for ports, found in zip(lists, got["hca"]):
        want = "=" + ",".join(ports)
        expect(found == want, f"nccl_ib_hca({ports}) (a leading '=' makes NCCL match exact names, "
               "so mlx5_1 does not also select mlx5_12)", expected=want, got=found)  # fmt: skip
    expect(got["empty"] == "ValueError", "nccl_ib_hca([]): no usable port", expected="ValueError",
           got=got["empty"])  # fmt: skip


# ------------------------------------------------------------------ exercise 3


def probe_groups(ns: dict[str, Any], shapes: list[list[int]]) -> list[Any]:
    """``parallel_groups`` for each ``(tp, pp, dp)``."""
    return [plain(ns["parallel_groups"](tp, pp, dp)) for tp, pp, dp in shapes]


def group_problems(got: Any, tp: int, pp: int, dp: int, gpus_per_node: int = 8) -> list[str]:
    """What is wrong with ``got`` as the TP, PP and DP groups of a ``tp x pp x dp`` job."""
    n, sizes = tp * pp * dp, {"tp": tp, "pp": pp, "dp": dp}
    if not isinstance(got, Mapping) or not all(
        isinstance(got.get(k), list) and all(isinstance(g, list) for g in got[k]) for k in sizes
    ):
        return [f'a dict of "tp", "pp" and "dp" lists of rank lists, got {str(got)[:120]}']
    for kind, size in sizes.items():
        ranks = sorted(r for g in got[kind] for r in g)
        if ranks != list(range(n)) or any(len(g) != size for g in got[kind]):
            return [f"the {kind} groups do not cover ranks 0..{n - 1} once each in groups of {size} "
                    f"(group sizes {[len(g) for g in got[kind]][:8]})"]  # fmt: skip
    problems = []
    for a, b in (("tp", "pp"), ("tp", "dp"), ("pp", "dp")):
        shared = max(len(set(g) & set(h)) for g in got[a] for h in got[b])
        if shared > 1:
            problems.append(f"a {a} group and a {b} group share {shared} ranks (at most one)")
    spread = [g for g in got["tp"] if len({r // gpus_per_node for r in g}) > 1]
    if spread:
        problems.append(f"TP group {spread[0][:8]} spans several nodes of {gpus_per_node} GPUs "
                        "(its 4 all-reduces per layer leave NVLink)")  # fmt: skip
    if problems:
        return problems
    shard = {r: i for g in got["tp"] for i, r in enumerate(g)}
    stage = {r: i for g in got["pp"] for i, r in enumerate(g)}
    for g in got["dp"]:
        if len({shard[r] for r in g}) > 1 or len({stage[r] for r in g}) > 1:
            return [f"DP group {g[:8]} joins ranks that hold different TP shards or pipeline stages "
                    "(their gradients are of different parameters)"]  # fmt: skip
    for g in got["pp"]:
        if len({shard[r] for r in g}) > 1:
            return [f"PP group {g[:8]} joins ranks that hold different TP shards"]
    return []


def check_groups(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    shapes = [[8, rng.choice([2, 3, 4]), rng.choice([2, 3, 4, 6])],
              [rng.choice([2, 4]), rng.choice([2, 3]), rng.choice([2, 3, 5])],
              [rng.choice([2, 4]), 1, rng.choice([3, 4, 8])], [1, rng.choice([2, 4]), rng.choice([2, 3])]]  # fmt: skip
    rng.shuffle(shapes)
    got = ctx.worker().probe(f"{_P}:probe_groups", shapes=shapes)
    for (tp, pp, dp), found in zip(shapes, got):
        problems = group_problems(found, tp, pp, dp)
        if problems:
            raise CheckFailed(f"parallel_groups({tp}, {pp}, {dp}), a shape this notebook never used: "
                              + "; ".join(problems))  # fmt: skip


# ------------------------------------------------------------------ exercise 4


def probe_fabric(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``cheapest_oversubscription`` on each case's cluster (a preset the probe builds)."""
    from ddtk.net.topology import preset

    out = []
    for c in cases:
        cluster = dataclasses.replace(preset(c["preset"], c["nodes"]), nodes_per_leaf=c["per_leaf"])
        fn = ns["cheapest_oversubscription"]
        out.append(
            plain(fn(cluster, c["collective"], c["nbytes"], tuple(c["choices"]), c["tolerance"]))
        )
    return out


def cheapest(case: Mapping[str, Any]) -> float:
    """The judge's answer for ``case``: the largest choice within the tolerance of non-blocking."""
    from ddtk.net.predict import predict
    from ddtk.net.topology import preset

    cluster = dataclasses.replace(
        preset(case["preset"], case["nodes"]), nodes_per_leaf=case["per_leaf"]
    )

    def busbw(over: float) -> float:
        return predict(dataclasses.replace(cluster, oversubscription=float(over)),
                       case["collective"], case["nbytes"]).busbw  # fmt: skip

    target = (1 - case["tolerance"]) * busbw(1)
    return max(o for o in case["choices"] if busbw(o) >= target)


def fabric_cases(rng: random.Random) -> list[dict]:
    """Seeded cases whose answers are not all the notebook's choices, tolerance or extreme."""
    from ddtk.net.topology import PRESETS

    def draw() -> dict:
        choices = [1, *rng.sample([2, 3, 4, 6, 8, 12, 16], 5)]
        rng.shuffle(choices)
        return {"preset": rng.choice(sorted(PRESETS)), "nodes": rng.choice([16, 32, 64]),
                "per_leaf": rng.choice([2, 4, 8]), "collective": rng.choice(["all_reduce", "all_gather", "all_to_all"]),
                "nbytes": 1 << rng.randint(20, 31), "choices": choices,
                "tolerance": rng.choice([0.05, 0.2, 0.3, 0.45, 0.6])}  # fmt: skip

    wanted = {"not a power of two": lambda c, a: a not in (1, 2, 4, 8),
              "not the tolerance of 0.1": lambda c, a: a != cheapest(c | {"tolerance": 0.1}),
              "between the extremes": lambda c, a: min(c["choices"]) < a < max(c["choices"])}  # fmt: skip
    cases: list[dict] = []
    for _ in range(300):
        if not wanted:
            break
        case = draw()
        answer = cheapest(case)
        hit = [k for k, test in wanted.items() if test(case, answer)]
        for k in hit:
            del wanted[k]
        if hit:
            cases.append(case)
    return [*cases, draw()]


def check_fabric(ctx: Context) -> None:
    cases = fabric_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_fabric", cases=cases)
    for case, found in zip(cases, got):
        want = cheapest(case)
        where = (f"{case['collective']} of {case['nbytes']} bytes, {case['nodes']} {case['preset']} nodes, "
                 f"{case['per_leaf']} per leaf, choices {case['choices']}, within {case['tolerance']:.0%}")  # fmt: skip
        expect(found == want, f"cheapest_oversubscription on {where} (the largest choice whose modelled "
               "busbw stays within the tolerance of non-blocking)", expected=want, got=found)  # fmt: skip


# ------------------------------------------------------------------ exercise 5


def probe_culprits(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``culprits`` on each case's matrix and threshold."""
    return [plain(ns["culprits"](c["bandwidth"], c["threshold"])) for c in cases]


def slow_matrix(rng: random.Random, n: int, threshold: float, nics: list[int],
                paths: list[tuple[int, int]], degraded: tuple[int, int] | None) -> list[list[float]]:  # fmt: skip
    """Bytes/s per link: healthy links at 80-100 % of the fastest, slow NICs and paths well
    under ``threshold``, and a ``degraded`` link between ``threshold`` and 0.5 of it."""
    base = rng.choice([1.25e8, 1.25e9, 1.25e10]) * rng.uniform(0.9, 1.1)
    bw = [[0.0 if s == d else base * rng.uniform(0.8, 1.0) for d in range(n)] for s in range(n)]
    healthy = [
        (s, d) for s in range(n) for d in range(n) if s != d and s not in nics and d not in nics
    ]
    s0, d0 = rng.choice([p for p in healthy if p not in paths and p != degraded])
    bw[s0][d0] = base  # the fastest link
    for r in nics:
        slow = base * threshold * rng.uniform(0.1, 0.5)
        for other in range(n):
            if other != r:
                bw[r][other] = bw[other][r] = slow * rng.uniform(0.9, 1.0)
    for s, d in paths:
        bw[s][d] = base * threshold * rng.uniform(0.3, 0.8)
    if degraded is not None:
        lo, hi = sorted((threshold, 0.5))
        bw[degraded[0]][degraded[1]] = base * (lo + (hi - lo) * rng.uniform(0.3, 0.7))
    return bw


def culprit_cases(rng: random.Random) -> list[dict]:
    """Seeded matrices: a slow NIC, two slow NICs, slow paths, one with a degraded link."""
    cases = []
    plans = [(4, [rng.randrange(4)], 0), (rng.choice([5, 6]), [], 2), (4, rng.sample(range(4), 2), 0),
             (rng.choice([6, 7]), [rng.randrange(6)], 1), (rng.choice([4, 5]), [], 1)]  # fmt: skip
    for i, (n, nics, n_paths) in enumerate(plans):
        threshold = (
            rng.choice([0.3, 0.35]) if i == len(plans) - 1 else rng.choice([0.3, 0.5, 0.6, 0.65])
        )
        free = [
            (s, d) for s in range(n) for d in range(n) if s != d and s not in nics and d not in nics
        ]
        paths = sorted(rng.sample(free, n_paths))
        degraded = rng.choice([p for p in free if p not in paths]) if i == len(plans) - 1 else None
        bw = slow_matrix(rng, n, threshold, nics, paths, degraded)
        want_paths = paths + ([list(degraded)] if degraded and threshold > 0.5 else [])
        cases.append({"bandwidth": bw, "threshold": threshold, "nics": sorted(nics),
                      "paths": sorted([list(p) for p in want_paths])})  # fmt: skip
    return cases


def check_culprits(ctx: Context) -> None:
    cases = culprit_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(
        f"{_P}:probe_culprits",
        cases=[{"bandwidth": c["bandwidth"], "threshold": c["threshold"]} for c in cases],
    )
    for case, found in zip(cases, got):
        n = len(case["bandwidth"])
        where = f"a seeded {n}-rank matrix, threshold {case['threshold']}"
        expect(isinstance(found, Mapping), f"culprits on {where}", expected='a dict with "nics" and "paths"',
               got=found)  # fmt: skip
        nics = found.get("nics")
        paths = found.get("paths")
        nics = sorted(nics) if isinstance(nics, list) else nics
        paths = sorted(list(p) for p in paths) if isinstance(paths, list) else paths
        expect(nics == case["nics"], f"slow NICs found on {where} (ranks with every link under "
               "threshold x the fastest link)", expected=case["nics"], got=nics)  # fmt: skip
        expect(paths == case["paths"], f"slow paths found on {where} (slow links no slow NIC explains, "
               "judged against the fastest link and the threshold given)", expected=case["paths"], got=paths)  # fmt: skip


# ------------------------------------------------------------------ exercise 6


def probe_rdma_fixes(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``rdma_fixes`` on each case's parsed outputs."""
    fn = ns["rdma_fixes"]
    return [
        plain(fn(c["ports"], c["write_bw_gbps"], c["line_rate_gbps"], c["nccl"])) for c in cases
    ]


# (state, active_mtu, link layer) of each kind of port the judge plants
_PORT_KINDS = {
    "healthy IB": ("PORT_ACTIVE (4)", "4096 (5)", "InfiniBand"),
    "healthy RoCE": ("PORT_ACTIVE (4)", "4096 (5)", "Ethernet"),
    "IB at MTU 2048": ("PORT_ACTIVE (4)", "2048 (4)", "InfiniBand"),
    "RoCE at MTU 1024": ("PORT_ACTIVE (4)", "1024 (3)", "Ethernet"),
    "down": ("PORT_DOWN (1)", "4096 (5)", None),
    "init": ("PORT_INIT (2)", "4096 (5)", "InfiniBand"),
    "armed": ("PORT_ARMED (3)", "4096 (5)", "InfiniBand"),
}


def _port_text(number: int, state: str, mtu: str, layer: str, lid: int) -> str:
    return (f"\t\tport:\t{number}\n\t\t\tstate:\t\t\t{state}\n\t\t\tmax_mtu:\t\t4096 (5)\n"
            f"\t\t\tactive_mtu:\t\t{mtu}\n\t\t\tsm_lid:\t\t\t{1 if lid else 0}\n\t\t\tport_lid:\t\t{lid}\n"
            f"\t\t\tport_lmc:\t\t0x00\n\t\t\tlink_layer:\t\t{layer}\n")  # fmt: skip


def devinfo_text(rng: random.Random, kinds: list[str]) -> str:
    """``ibv_devinfo`` output with one port of each of ``kinds``, on seeded device numbers;
    some HCAs are dual-port, a healthy port 1 before the planted port 2."""
    devs = sorted(rng.sample(range(18), len(kinds)))
    text = ""
    for d, kind in zip(devs, kinds):
        state, mtu, layer = _PORT_KINDS[kind]
        layer = layer or rng.choice(["InfiniBand", "Ethernet"])
        lid = 0 if layer == "Ethernet" or "INIT" in state else rng.randint(2, 900)
        dual = rng.random() < 0.3
        text += (f"hca_id:\tmlx5_{d}\n\ttransport:\t\t\tInfiniBand (0)\n"
                 f"\tfw_ver:\t\t\t\t28.{rng.randint(35, 43)}.1000\n\tphys_port_cnt:\t\t\t{1 + dual}\n")  # fmt: skip
        if dual:
            text += _port_text(1, "PORT_ACTIVE (4)", "4096 (5)", layer, lid and lid + 1)
        text += _port_text(1 + dual, state, mtu, layer, lid) + "\n"
    return text or "No IB devices found\n"


_NCCL_CAUSES = ("IB+GDR", "IB: no module", "IB: distance", "Socket: no IB device", "Socket: IB disabled",
                "none", "IB+GDR: memlock")  # fmt: skip


def nccl_case(rng: random.Random, cause: str) -> str:
    """A seeded NCCL log of ``cause`` (exercise 1's generator, with the lines that say why)."""
    situation = {"IB: no module": "IB", "IB: distance": "IB", "IB+GDR: memlock": "IB+GDR"}.get(
        cause, cause
    )
    log, _ = nccl_log(rng, situation, None)
    host = log.split(":", 1)[0]
    extra = {
        "IB: no module": "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)",
        "IB: distance": f"NET/IB : GPU Direct RDMA Disabled for GPU {rng.randrange(8)} / HCA {rng.randrange(4)} "
                        f"(distance {rng.choice([6, 7])} > 5)",
        "IB+GDR: memlock": "misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
    }.get(cause)  # fmt: skip
    if extra:
        level = "" if "WARN" in extra else "NCCL INFO "
        log += f"{host}:{rng.randint(1000, 9999)}:{rng.randint(1000, 9999)} [0] {level}{extra}\n"
    return log


def rdma_cases(rng: random.Random) -> list[dict]:
    """Seeded cases that together hold every port kind, a missing device, bandwidths on
    both sides of 80 % and no measurement, and every NCCL cause."""
    from ddtk.net import ibv_devinfo
    from ddtk.net.nccl_log import parse as parse_nccl

    kinds = list(_PORT_KINDS) * 2
    rng.shuffle(kinds)
    causes = list(_NCCL_CAUSES)
    rng.shuffle(causes)
    shares = [rng.uniform(0.74, 0.79), rng.uniform(0.81, 0.86), rng.uniform(0.2, 0.5), rng.uniform(0.9, 0.99),
              None, rng.uniform(0.77, 0.795), rng.uniform(0.805, 0.83)]  # fmt: skip
    rng.shuffle(shares)
    chunks = [
        [],
        *(kinds[j :: len(causes) - 1] for j in range(len(causes) - 1)),
    ]  # every kind, twice
    cases = []
    for i, cause in enumerate(causes):
        take = chunks[i]
        rate = rng.choice([100, 200, 400])
        share = shares[i]
        cases.append({"ports": ibv_devinfo.parse(devinfo_text(rng, take)),
                      "write_bw_gbps": None if share is None else round(share * rate, 2),
                      "line_rate_gbps": rate, "nccl": parse_nccl(nccl_case(rng, cause)), "cause": cause,
                      "kinds": take})  # fmt: skip
    return cases


def rdma_answer(case: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The judge's answer: ``ddtk.net.rdma_check``'s rules on the case's parsed outputs."""
    from ddtk.net import rdma_check

    found = (rdma_check.port_findings(case["ports"])
             + rdma_check.link_findings(case["write_bw_gbps"], case["line_rate_gbps"])
             + rdma_check.nccl_findings(case["nccl"]))  # fmt: skip
    return [(f.where, f.key) for f in found]


def _port_rule(p: Mapping[str, Any]) -> str:
    """What the rules say of one parsed ``ibv_devinfo`` port, and why."""
    where, state, mtu, layer = f"{p['device']}:{p['port']}", p["state"], p["active_mtu"], p["link_layer"]
    if state == "PORT_DOWN":
        return f"{where} is PORT_DOWN: no physical link, so 'cable'"
    if not str(state).startswith("PORT_ACTIVE"):
        return (f"{where} is {state}: the link is up, but no subnet manager has made the port "
                "active, so 'subnet manager'")  # fmt: skip
    if layer == "Ethernet" and mtu < 4096:
        return f"{where} is RoCE (link_layer Ethernet) at active_mtu {mtu}: 'jumbo frames'"
    if mtu < 4096:
        return (f"{where} is {layer} at active_mtu {mtu}: the MTU rule is for RoCE "
                "(link_layer Ethernet) only, so no fix")  # fmt: skip
    return f"{where} is active at active_mtu {mtu}: no fix"


def _nccl_rule(nccl: Mapping[str, Any]) -> str:
    """What the rules say of one parsed NCCL log, and why."""
    memlock = any("ibv_reg_mr" in w and "Cannot allocate memory" in w for w in nccl["warnings"])
    tail = "; a WARN says ibv_reg_mr failed with 'Cannot allocate memory': 'memlock'" if memlock else ""
    if nccl["transport"] == "Socket":
        if nccl["ib_disabled"]:
            return "NCCL runs on sockets and the log says NCCL_IB_DISABLE was set: 'NCCL_IB_DISABLE'" + tail
        return "NCCL runs on sockets without NCCL_IB_DISABLE: 'expose the HCA'" + tail
    if nccl["transport"] == "IB":
        reasons = "; ".join(nccl["gdr_disabled"]) or "none printed"
        if any("distance" in r for r in nccl["gdr_disabled"]):
            return (f"NCCL runs on IB without GPUDirect RDMA and the reason names a distance "
                    f"({reasons}): the GPU and NIC are too far apart, 'PCIe path'" + tail)  # fmt: skip
        return (f"NCCL runs on IB without GPUDirect RDMA, reason: {reasons}; no distance, "
                "so 'peer memory'" + tail)  # fmt: skip
    return f"NCCL runs on {nccl['transport']}: nothing to fix there" + tail


def why_fixes_differ(ports: list[dict], write_bw_gbps: float | None, line_rate_gbps: float,
                     nccl: Mapping[str, Any], want: list, found: Any) -> str:  # fmt: skip
    """The rule behind the first pair that ``found`` lacks or has too many of, against ``want``
    (the same arguments as the exercise's ``rdma_fixes``); empty when they agree."""
    if found == want:
        return ""
    if not isinstance(found, list) or not all(isinstance(f, tuple) and len(f) == 2 for f in found):
        return "rdma_fixes must return a list of (where, fix) pairs"
    if sorted(map(str, found)) == sorted(map(str, want)):
        return "the right pairs in the wrong order: ports in the order listed, then the link, then NCCL"
    differ = [*(w for w in want if w not in found), *(f for f in found if f not in want)]
    if not differ:
        return "the right pairs, but some more than once: each problem once"
    where = differ[0][0]
    if where == "ibv_devinfo":
        return "ibv_devinfo listed no port at all: 'no device'" if not ports else "there are ports"
    if where == "ib_write_bw":
        if write_bw_gbps is None:
            return "ib_write_bw was not run (None): nothing to judge"
        share = write_bw_gbps / line_rate_gbps
        side = "below 80 %: 'link rate'" if share < 0.8 else "at least 80 %: no fix"
        return (f"ib_write_bw's {write_bw_gbps:g} Gb/s is {share:.1%} of the {line_rate_gbps:g} Gb/s "
                f"line rate (both in Gb/s), {side}")  # fmt: skip
    if where == "nccl":
        return _nccl_rule(nccl)
    port = next((p for p in ports if f"{p['device']}:{p['port']}" == where), None)
    if port is None:
        return f"no port {where} in the ibv_devinfo output"
    return _port_rule(port)


def check_rdma_fixes(ctx: Context) -> None:
    cases = rdma_cases(random.Random(ctx.seed))
    keys = ("ports", "write_bw_gbps", "line_rate_gbps", "nccl")
    got = ctx.worker().probe(
        f"{_P}:probe_rdma_fixes", cases=[{k: c[k] for k in keys} for c in cases]
    )
    for case, found in zip(cases, got):
        want = rdma_answer(case)
        found = (
            [tuple(f) if isinstance(f, list | tuple) else f for f in found]
            if isinstance(found, list)
            else found
        )
        bw = (
            "no ib_write_bw"
            if case["write_bw_gbps"] is None
            else f"ib_write_bw {case['write_bw_gbps']} Gb/s"
        )
        where = (f"ports {case['kinds'] or 'none (no device)'}, {bw} on a {case['line_rate_gbps']} Gb/s "
                 f"fabric, NCCL log: {case['cause']}")  # fmt: skip
        why = why_fixes_differ(*(case[k] for k in keys), want, found)
        expect(found == want, f"rdma_fixes on seeded outputs ({where}): {why}; (where, fix) for ports "
               "in order, then the link, then NCCL", expected=want, got=found)  # fmt: skip


JUDGE = LabJudge(
    lab="04-nccl-and-networking",
    setup=(),
    exercises={
        1: Exercise(1, "read an NCCL log", ("27eacbee",), check_nccl_log, _NET),
        2: Exercise(2, "usable RDMA ports", ("1907ac93",), check_ports, _NET),
        3: Exercise(3, "place TP, PP and DP", ("80032d0a",), check_groups,
                    ("ddtk.net", "ddtk.parallel", "ddtk.frameworks", "torch.distributed")),
        4: Exercise(4, "cheapest fabric", ("8389e1bf",), check_fabric, _NET,
                    ("ddtk.net.predict.predict", "ddtk.net.topology.Cluster")),
        5: Exercise(5, "find the slow NIC", ("898be430",), check_culprits, _NET),
        6: Exercise(6, "name the RDMA fixes", ("l04-ex6",), check_rdma_fixes, _NET),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge", "why_fixes_differ"]
