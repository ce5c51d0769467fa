"""``ddtk bench network``: the network models against measurements, published and local.

Four tables, each a model next to what was measured:

1. **Published**: the topology model (:mod:`ddtk.net.predict`) against nccl-tests
   results of real clusters (:mod:`ddtk.net.published`), with the error of each.
2. **Loopback**: the same model reduced to this machine (each rank behind a loopback
   link whose latency and bandwidth are gloo's measured point-to-point exchange)
   against ddtk's ring over that point-to-point and gloo's own all-reduce, in the
   same run; ``iperf3`` (when installed) gives loopback's raw TCP ceiling.
3. **Emulation**: links of :class:`ddtk.net.emulate.EmulatedNetwork` measured by
   ping-pong and fitted, against the bandwidth and latency asked for.
4. **Crossover**: where ddtk's tree all-reduce stops beating its ring on emulated
   networks, measured, against :mod:`ddtk.comm.costmodel`'s prediction.

    ddtk bench network                              # all four, about a minute
    ddtk bench network --only published,crossover --json build/bench/network.json
"""

from __future__ import annotations

import argparse
from typing import Any

PARTS = ("published", "loopback", "emulation", "crossover")
EMULATED = (("1Gbit", "500us"), ("1Gbit", "5ms"))
ACCURACY = (("100MB/s", "1ms"), ("1GB/s", "200us"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench network``."""
    p = subparsers.add_parser("network", help="topology model vs published nccl-tests, loopback gloo, emulated links",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts (default {','.join(PARTS)})"
    )
    p.add_argument(
        "-n", "--world-size", type=int, default=4, help="ranks for the crossover (default 4)"
    )
    p.add_argument("--json", metavar="PATH", help="write every result and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG: measured against predicted")
    p.set_defaults(func=_run)


def _published() -> dict[str, Any]:
    from ddtk.net import published

    checks = published.validate()
    rows = [
        {"system": c.published.system, "nbytes": c.published.nbytes,
         "algorithm": c.prediction.algorithm, "protocol": c.prediction.protocol,
         "measured_gbps": c.published.busbw_gbps, "predicted_gbps": c.prediction.busbw / 1e9,
         "error": c.error, "bottleneck": c.prediction.bottleneck,
         "calibration": bool(c.published.calibrates), "source": c.published.source}
        for c in checks
    ]  # fmt: skip
    return {"rows": rows, "summary": published.summary(checks)}


def _emulation() -> list[dict[str, Any]]:
    import ddtk
    from ddtk.net.emulate import EmulatedNetwork
    from ddtk.net.measure import fit_link, link_times

    rows = []
    sizes = [4, 64 << 10, 512 << 10, 1 << 20, 2 << 20]
    for bandwidth, latency in ACCURACY:
        net = EmulatedNetwork(bandwidth, latency)
        times = ddtk.launch(link_times, 2, args=(sizes, 7), network=net)[0]
        got_latency, got_bandwidth = fit_link(times)
        rows.append({"network": str(net), "asked_bandwidth": net.bandwidth, "asked_latency": net.latency,
                     "bandwidth": got_bandwidth, "latency": got_latency})  # fmt: skip
    return rows


def _crossover(world_size: int) -> list[dict[str, Any]]:
    from ddtk.net.emulate import EmulatedNetwork
    from ddtk.net.measure import emulated_crossover

    return [emulated_crossover(EmulatedNetwork(b, lat), world_size) for b, lat in EMULATED]


def _print(console: Any, result: dict[str, Any]) -> None:
    from rich.table import Table

    from ddtk.bench.timing import format_bytes
    from ddtk.net.units import format_rate, format_time

    if "published" in result:
        t = Table(title="topology model vs published nccl-tests all_reduce (busbw)")
        for col in ("system", "size", "algorithm", "measured", "predicted", "error", "limited by"):
            t.add_column(col)
        for r in result["published"]["rows"]:
            t.add_row(r["system"], format_bytes(r["nbytes"]), f"{r['algorithm']}/{r['protocol']}",
                      f"{r['measured_gbps']:.1f}", f"{r['predicted_gbps']:.1f}",
                      f"{r['error']:+.0%}" + (" (cal.)" if r["calibration"] else ""), r["bottleneck"])  # fmt: skip
        console.print(t)
        s = result["published"]["summary"]
        console.print(f"independent rows >= 128 MB: mean |error| {s['large_mean_abs_error_pct']:.1f} %, "
                      f"worst {s['large_worst_abs_error_pct']:.1f} % ({s['large']} rows); "
                      f"every size: mean {s['all_mean_abs_error_pct']:.1f} %")  # fmt: skip
    if "loopback" in result:
        lb = result["loopback"]
        iperf = lb["iperf3"]
        console.print(f"\nloopback link: gloo point-to-point latency {format_time(lb['gloo_latency_s'])}, "
                      f"bandwidth {format_rate(lb['gloo_bandwidth_Bps'])}"
                      + (f"; iperf3 {format_rate(iperf['bytes_per_second'])}" if iperf else "; no iperf3"))  # fmt: skip
        t = Table(
            title="all_reduce on this machine vs the loopback model (ring of measured exchanges)"
        )
        for col in ("ranks", "size", "contender", "measured", "model", "error"):
            t.add_column(col)
        for r in lb["rows"]:
            t.add_row(str(r["world_size"]), format_bytes(r["nbytes"]), r["contender"],
                      format_time(r["measured_s"]), format_time(r["predicted_s"]), f"{r['error']:+.0%}")  # fmt: skip
        console.print(t)
    if "emulation" in result:
        t = Table(title="emulated links, ping-pong fitted (t = latency + bytes / bandwidth)")
        for col in ("asked", "measured bandwidth", "ratio", "measured latency", "excess"):
            t.add_column(col)
        for r in result["emulation"]:
            t.add_row(r["network"], format_rate(r["bandwidth"]), f"{r['bandwidth'] / r['asked_bandwidth']:.3f}",
                      format_time(r["latency"]), format_time(r["latency"] - r["asked_latency"]))  # fmt: skip
        console.print(t)
    if "crossover" in result:
        t = Table(title="tree vs ring all_reduce on emulated links: crossover size")
        for col in ("network", "ranks", "measured", "cost model"):
            t.add_column(col)
        for r in result["crossover"]:
            m, p = r["measured_crossover"], r["predicted_crossover"]
            t.add_row(r["network"], str(r["world_size"]), format_bytes(m) if m else "none in range",
                      format_bytes(p) if p else "none")  # fmt: skip
        console.print(t)


def _plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddtk.bench.report import save_figure

    panels = [k for k in ("published", "crossover") if k in result]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, key in zip(axes[0], panels):
        if key == "published":
            rows = result["published"]["rows"]
            ax.scatter([r["measured_gbps"] for r in rows], [r["predicted_gbps"] for r in rows])
            top = max(max(r["measured_gbps"], r["predicted_gbps"]) for r in rows) * 1.1
            ax.plot([0, top], [0, top], "k--", lw=1, label="prediction = measurement")
            ax.set_xlabel("published busbw (GB/s)")
            ax.set_ylabel("predicted busbw (GB/s)")
            ax.set_title("topology model vs nccl-tests")
            ax.legend()
        else:
            for r in result["crossover"]:
                for algo, style in (("tree", "o-"), ("ring", "s-")):
                    ax.loglog(r["sizes"], [t * 1e3 for t in r["measured_s"][algo]], style,
                              label=f"{algo}, {r['network'].split(': ')[1]}")  # fmt: skip
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel("all_reduce time (ms)")
            ax.set_title(
                f"ddtk tree vs ring, emulated links, {result['crossover'][0]['world_size']} ranks"
            )
            ax.legend(fontsize=7)
    save_figure(fig, path)


def run(parts: tuple[str, ...], world_size: int = 4) -> dict[str, Any]:
    """Every requested part's results, as plain data."""
    from ddtk.net.measure import loopback_check

    result: dict[str, Any] = {}
    if "published" in parts:
        result["published"] = _published()
    if "loopback" in parts:
        result["loopback"] = loopback_check()
    if "emulation" in parts:
        result["emulation"] = _emulation()
    if "crossover" in parts:
        result["crossover"] = _crossover(world_size)
    return result


def _run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from ddtk.bench.collectives import environment

    parts = tuple(p.strip() for p in args.only.split(",") if p.strip())
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        print(f"ddtk bench network: unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
        return 2
    if args.world_size < 2:
        print("ddtk bench network: --world-size must be >= 2")
        return 2
    result = run(parts, args.world_size)
    _print(Console(), result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"environment": environment(), **result}, indent=1, default=str)
        )
    if args.plot:
        _plot(result, args.plot)
    return 0
