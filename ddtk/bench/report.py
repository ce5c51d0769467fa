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
            format_bytes(r["nbytes"]), r["algorithm"], f"{r['time_median_s'] * 1e6:.0f}", f"{r['time_p10_s'] * 1e6:.0f}",
            f"{r['time_p90_s'] * 1e6:.0f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}",
            "" if r.get("peer_busbw_gbps") is None else f"{r['peer_busbw_gbps']:.3f}",
            "" if ratio is None else f"[{style}]{ratio:.2f}x[/{style}]",
        )  # fmt: skip
    return t


def fits(rows: list[dict], world_size: int) -> dict[str, dict[str, float]]:
    """Alpha (µs) and beta (as GB/s) fitted per algorithm from its measured times."""
    out = {}
    for algo in sorted({r["algorithm"] for r in rows} - {"memcpy", collectives.VALIDATED}):
        mine = [r for r in rows if r["algorithm"] == algo]
        if len(mine) < 2:
            continue
        a, b = fit_alpha_beta(
            algo, world_size, [r["nbytes"] for r in mine], [r["time_median_s"] for r in mine]
        )
        out[algo] = {
            "alpha_us": a * 1e6,
            "bandwidth_gbps": (1 / b / 1e9) if b > 0 else float("inf"),
        }
    return out


def summary(rows: list[dict]) -> dict[str, object]:
    """The two headline checks: large-message ring busbw vs peer, small-message best latency vs peer."""
    large = [
        r["ratio"]
        for r in rows
        if r["algorithm"] == "ring" and r["nbytes"] >= (4 << 20) and r["ratio"]
    ]
    small_sizes = sorted({r["nbytes"] for r in rows if r["nbytes"] <= (4 << 10)})
    worst_latency = None
    for size in small_sizes:
        at = [r for r in rows if r["nbytes"] == size]
        peer = next((r["time_median_s"] for r in at if r["algorithm"] == collectives.PEER), None)
        ours = [
            r["time_median_s"]
            for r in at
            if r["algorithm"] not in (collectives.PEER, "memcpy", collectives.VALIDATED)
        ]
        if peer and ours:
            worst_latency = max(worst_latency or 0.0, min(ours) / peer)
    return {
        "ring_busbw_ratio_min_ge_4MiB": min(large) if large else None,
        "best_small_latency_vs_peer_max_le_4KiB": worst_latency,
    }


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
        for algo in dict.fromkeys(r["algorithm"] for r in mine):
            pts = [r for r in mine if r["algorithm"] == algo]
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
                                         memcpy=True, validated_row=True, backend=args.backend)  # fmt: skip
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
    s = result["summary"]
    console.print(
        f"ring busbw / peer, messages >= 4 MiB (worst case): {_fmt(s['ring_busbw_ratio_min_ge_4MiB'])}  (target >= 0.90)"
    )
    console.print(
        f"best ddtk latency / peer, messages <= 4 KiB (worst case): {_fmt(s['best_small_latency_vs_peer_max_le_4KiB'])}  (target <= 2.00)"
    )
    return 0


def _fmt(v: object) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _save(result: dict, args: argparse.Namespace) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    if args.plot and result["rows"]:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(result["rows"], args.plot)
