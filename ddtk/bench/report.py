"""Run the collectives benchmark and present it: rich table, alpha-beta fit, JSON, PNG.

Partial results are kept: the JSON is rewritten after every world size, and
Ctrl-C still prints and saves what was measured.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ddtk.bench import collectives
from ddtk.bench.timing import format_bytes
from ddtk.comm.costmodel import fit_alpha_beta

console = Console(width=None if Console().is_terminal else 132)


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Attach ``peer_busbw_gbps`` and ``ratio`` (ddtk busbw / peer busbw) to every row."""
    peer = {(r["world_size"], r["nbytes"]): r for r in rows if r["algorithm"] == collectives.PEER}
    for r in rows:
        p = peer.get((r["world_size"], r["nbytes"]))
        r["peer_busbw_gbps"] = p["busbw_gbps"] if p else None
        r["ratio"] = r["busbw_gbps"] / p["busbw_gbps"] if p and r["algorithm"] != "memcpy" else None
    return rows


def table(rows: list[dict], world_size: int) -> Table:
    t = Table(title=f"all_reduce, {world_size} ranks (float32; time of the slowest rank)")
    for col in (
        "size",
        "algorithm",
        "median µs",
        "p10 µs",
        "p90 µs",
        "algbw GB/s",
        "busbw GB/s",
        "peer busbw",
        "ratio",
    ):
        t.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in rows:
        ratio = r.get("ratio")
        style = (
            ""
            if ratio is None
            else ("green" if ratio >= 0.9 else "yellow" if ratio >= 0.5 else "red")
        )
        t.add_row(
            format_bytes(r["nbytes"]), collectives.label(r), f"{r['time_median_s'] * 1e6:.0f}", f"{r['time_p10_s'] * 1e6:.0f}",
            f"{r['time_p90_s'] * 1e6:.0f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}",
            "" if r.get("peer_busbw_gbps") is None else f"{r['peer_busbw_gbps']:.3f}",
            "" if ratio is None else f"[{style}]{ratio:.2f}x[/{style}]",
        )  # fmt: skip
    return t


def fits(rows: list[dict], world_size: int) -> dict[str, dict[str, float]]:
    """Alpha (µs) and beta (as GB/s) fitted per algorithm from its measured times."""
    out = {}
    names = {collectives.label(r): r["algorithm"] for r in rows}
    for name in sorted(set(names) - {"memcpy"}):
        algo = names[name]
        if algo == collectives.VALIDATED:
            continue
        mine = [r for r in rows if collectives.label(r) == name]
        if len(mine) < 2:
            continue
        a, b = fit_alpha_beta(
            algo, world_size, [r["nbytes"] for r in mine], [r["time_median_s"] for r in mine]
        )
        out[name] = {
            "alpha_us": a * 1e6,
            "bandwidth_gbps": (1 / b / 1e9) if b > 0 else float("inf"),
        }
    return out


def summary(rows: list[dict]) -> dict[str, object]:
    """The headline checks, per world size and transport.

    * ``ring_busbw_ratio_min_ge_4MiB``: worst ring busbw / peer over messages >= 4 MiB (tcp
      transport; the foundation target is >= 0.9);
    * ``shm_ring_busbw_ratio_min_1_64MiB``: worst ring busbw / peer from 1 to 64 MiB, shm;
    * ``best_small_latency_vs_peer_max_le_4KiB``: worst (best ddtk time / peer time) <= 4 KiB;
    * ``shm_smallest_latency_vs_peer``: best shm time / peer time at the smallest size;
    * ``shm_best_vs_peer_min``: worst over every size of peer time / best shm time
      (above 1: shared memory beats gloo at every size);
    * ``shm_ring_vs_memcpy_max``: how close the shm ring's busbw gets to memcpy's.
    """
    out: dict[str, object] = {}
    for n in sorted({r["world_size"] for r in rows}):
        at_n = [r for r in rows if r["world_size"] == n]
        out[str(n)] = {
            "ring_busbw_ratio_min_ge_4MiB": _worst(at_n, "tcp", 4 << 20, 1 << 62),
            "shm_ring_busbw_ratio_min_1_64MiB": _worst(at_n, "shm", 1 << 20, 64 << 20),
            "best_small_latency_vs_peer_max_le_4KiB": _latency(at_n, None, 4 << 10),
            "shm_smallest_latency_vs_peer": _latency(at_n, "shm", min(r["nbytes"] for r in at_n)),
            "shm_best_vs_peer_min": _inverse(_latency(at_n, "shm", 1 << 62)),
            "shm_ring_vs_memcpy_max": _vs_memcpy(at_n),
        }
    return out


def _worst(rows: list[dict], transport: str, lo: int, hi: int) -> float | None:
    ratios = [
        r["ratio"] for r in rows
        if r["algorithm"] == "ring" and r.get("transport") == transport and lo <= r["nbytes"] <= hi
        and r["ratio"]
    ]  # fmt: skip
    return min(ratios) if ratios else None


def _latency(rows: list[dict], transport: str | None, hi: int) -> float | None:
    """Worst over sizes <= ``hi`` of (fastest ddtk algorithm's time / the peer's time)."""
    worst = None
    for size in sorted({r["nbytes"] for r in rows if r["nbytes"] <= hi}):
        at = [r for r in rows if r["nbytes"] == size]
        peer = next((r["time_median_s"] for r in at if r["algorithm"] == collectives.PEER), None)
        ours = [
            r["time_median_s"] for r in at
            if r["algorithm"] not in (collectives.PEER, "memcpy", collectives.VALIDATED)
            and (transport is None or r.get("transport") == transport)
        ]  # fmt: skip
        if peer and ours:
            worst = max(worst or 0.0, min(ours) / peer)
    return worst


def _inverse(v: float | None) -> float | None:
    return 1 / v if v else None


def _vs_memcpy(rows: list[dict]) -> float | None:
    copy = {r["nbytes"]: r["busbw_gbps"] for r in rows if r["algorithm"] == "memcpy"}
    ratios = [
        r["busbw_gbps"] / copy[r["nbytes"]] for r in rows
        if r["algorithm"] == "ring" and r.get("transport") == "shm" and copy.get(r["nbytes"])
    ]  # fmt: skip
    return max(ratios) if ratios else None


def save_figure(fig, path: str) -> None:
    """Lay out, write as PNG (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(path: str, env: dict, args: argparse.Namespace, rows: list[dict]) -> None:
    """Write a benchmark's rows with the environment and the command-line arguments they came from."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    record = {
        "environment": env,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "rows": rows,
    }
    Path(path).write_text(json.dumps(record, indent=1, default=str))


def publish(
    console, rows: list[dict], env: dict, args: argparse.Namespace, table_fn, plot_fn
) -> int:
    """Print a benchmark's table and write its JSON and PNG when asked; 1 when nothing was measured.

    ``table_fn(rows)`` builds the rich table and ``plot_fn(rows, path)`` writes the figure.
    """
    if not rows:
        return 1
    console.print(table_fn(rows))
    if args.json:
        write_json(args.json, env, args, rows)
    if args.plot:
        plot_fn(rows, args.plot)
    return 0


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes_by_world = sorted({r["world_size"] for r in rows})
    fig, axes = plt.subplots(
        1, len(sizes_by_world), figsize=(6 * len(sizes_by_world), 4.2), squeeze=False
    )
    for ax, n in zip(axes[0], sizes_by_world):
        mine = [r for r in rows if r["world_size"] == n]
        for algo in dict.fromkeys(collectives.label(r) for r in mine):
            pts = [r for r in mine if collectives.label(r) == algo]
            style = {"linestyle": "--", "color": "black"} if algo == collectives.PEER else {}
            ax.plot(
                [r["nbytes"] for r in pts],
                [r["busbw_gbps"] for r in pts],
                marker="o",
                ms=3,
                label=algo,
                **style,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"all_reduce, {n} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def run_collectives(
    world_sizes: Sequence[int],
    sizes: Sequence[int],
    algorithms: Sequence[str],
    args: argparse.Namespace,
    transports: Sequence[str] = ("shm", "tcp"),
) -> int:
    env = collectives.environment()
    console.print(f"[bold]ddtk bench collectives[/bold]  cores={env['cores']} backend={env['backend']} torch={env['torch']} "
                  f"threads/rank=1  sizes {format_bytes(sizes[0])}..{format_bytes(sizes[-1])}")  # fmt: skip
    result: dict = {"environment": env, "rows": [], "fits": {}, "launch_overhead": None}
    try:
        if not args.no_launch_overhead:
            result["launch_overhead"] = collectives.launch_overhead(4)
            lo = result["launch_overhead"]
            console.print(
                f"ddtk.launch start-up (spawn + rendezvous + exit), 4 ranks: median {lo['time_median_s']:.2f} s"
            )
        for n in world_sizes:
            with console.status(f"measuring {n} ranks ..."):
                rows = collectives.sweep(n, sizes, algorithms, iters=args.iters, warmup=args.warmup,
                                         memcpy=True, validated_row=True, backend=args.backend,
                                         transports=transports)  # fmt: skip
            rows = ratio_rows(rows)
            result["rows"] += rows
            result["fits"][n] = fits(rows, n)
            console.print(table(rows, n))
            for algo, f in result["fits"][n].items():
                console.print(
                    f"  fit {algo:>20s}: alpha = {f['alpha_us']:8.1f} µs   1/beta = {f['bandwidth_gbps']:6.2f} GB/s"
                )
            _save(result, args)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: keeping the results measured so far[/yellow]")
    result["summary"] = summary(result["rows"])
    _save(result, args)
    for n, s in result["summary"].items():
        console.print(f"[bold]{n} ranks[/bold]")
        for key, text, target in _HEADLINES:
            console.print(f"  {text}: {_fmt(s[key])}  (target {target})")
    return 0


_HEADLINES = (
    ("shm_ring_busbw_ratio_min_1_64MiB", "ring/shm busbw / peer, 1-64 MiB (worst)", ">= 3.00x at 2 ranks, >= 1.00x at 4"),
    ("shm_smallest_latency_vs_peer", "best shm latency / peer at the smallest size", "<= 0.10x at 2 ranks"),
    ("shm_best_vs_peer_min", "peer time / best shm time, every size (worst)", ">= 1.00x at 4 ranks"),
    ("shm_ring_vs_memcpy_max", "ring/shm busbw / memcpy busbw (best)", "memcpy is the ceiling"),
    ("ring_busbw_ratio_min_ge_4MiB", "ring/tcp busbw / peer, >= 4 MiB (worst)", ">= 0.90x"),
    ("best_small_latency_vs_peer_max_le_4KiB", "best ddtk latency / peer, <= 4 KiB (worst)", "<= 2.00x"),
)  # fmt: skip


def _fmt(v: object) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _save(result: dict, args: argparse.Namespace) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    if args.plot and result["rows"]:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(result["rows"], args.plot)
