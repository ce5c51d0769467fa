"""Lecture 03's framework comparison: the same model, data and steps under every framework.

:func:`run_comparison` runs, for each world size, one ``horovodrun`` job in which
DDP, Horovod, DeepSpeed ZeRO-1/2/3 and ddtk's ``DataParallel`` train the same
ResNet-style CNN from the same weights on the same batches, interleaved round by
round in the same processes (:mod:`ddtk.frameworks.compare_job`), then the
TensorFlow ``MultiWorkerMirroredStrategy`` recipe in its own processes
(:mod:`ddtk.frameworks.tf_mwms`). Each row has the measured samples/s, the
scaling efficiency against the same framework at 1 rank, the ratio to DDP at the
same world size, the model-state bytes a rank holds after backward, the lines
the recipe changes from single-process code (:mod:`ddtk.frameworks.recipes`)
and its launcher. With ``memory=True`` every torch framework also runs alone in
its own job, so the peak RSS per rank belongs to it (the benchmark does this).

TensorFlow's row is measured differently and says so: Keras ``fit`` over whole
epochs (its own input pipeline and step function), its variables' bytes (no
persistent gradients), its own 1-worker run for the efficiency.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ddtk.frameworks.compare_job import TORCH_FRAMEWORKS
from ddtk.frameworks.launchers import horovodrun_command, run_command
from ddtk.frameworks.recipes import LAUNCHER_NAMES, lines_changed

FRAMEWORKS = (*TORCH_FRAMEWORKS, "tf-mwms")


def _recipe_of(framework: str) -> str:
    return "deepspeed" if framework.startswith("deepspeed") else framework


def _torch_job(world: int, frameworks: Sequence[str], steps: int, rounds: int, batch_size: int,
               echo: bool, timeout: float) -> dict:  # fmt: skip
    """One horovodrun job of compare_job; its rank 0's JSON."""
    with tempfile.TemporaryDirectory(prefix="ddtk-compare-") as folder:
        out = Path(folder) / "result.json"
        script = ["-m", "ddtk.frameworks.compare_job", "--frameworks", ",".join(frameworks),
                  "--steps", str(steps), "--rounds", str(rounds), "--batch-size", str(batch_size),
                  "--json", str(out)]  # fmt: skip
        run_command(horovodrun_command(world, script), echo=echo, timeout=timeout)
        return json.loads(out.read_text())


def tf_rows(
    world_sizes: Sequence[int], epochs: int = 3, batch_size: int = 64, echo: bool = False,
    timeout: float = 180.0,
) -> list[dict]:  # fmt: skip
    """TensorFlow MWMS rows, one per world size; ``reports`` keeps every worker's own report."""
    from ddtk.frameworks.tf_mwms import run_workers

    rows = []
    for world in world_sizes:
        reports = run_workers(world, epochs=epochs, batch_size=batch_size, echo=echo, timeout=timeout)
        rows.append({
            "framework": "tf-mwms", "world_size": world,
            "samples_per_s": reports[0]["images_per_s"],
            "state_bytes_per_rank": max(r["state_bytes"] for r in reports),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in reports),
            "last_loss": reports[0]["train_loss"][-1],
            "reports": reports,
        })  # fmt: skip
    return rows


def run_comparison(
    world_sizes: Sequence[int] = (1, 2),
    frameworks: Sequence[str] = FRAMEWORKS,
    steps: int = 20,
    rounds: int = 3,
    batch_size: int = 64,
    tf_epochs: int = 3,
    memory: bool = False,
    echo: bool = False,
    timeout: float = 600.0,
) -> list[dict]:
    """Measure every framework at every world size; one row per (framework, world size)."""
    unknown = set(frameworks) - set(FRAMEWORKS)
    if unknown:
        raise ValueError(f"unknown framework(s) {sorted(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    if not world_sizes or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in world_sizes):
        raise ValueError(f"world_sizes must be integers >= 1, got {list(world_sizes)}")
    torch_fw = [f for f in frameworks if f != "tf-mwms"]
    rows: list[dict] = []
    for world in world_sizes:
        if torch_fw:
            rows += _torch_job(world, torch_fw, steps, rounds, batch_size, echo, timeout)["rows"]
            if memory:
                for row in rows[-len(torch_fw):]:
                    alone = _torch_job(world, [row["framework"]], 3, 1, batch_size, echo, timeout)
                    row["peak_rss_bytes"] = alone["peak_rss_bytes"]
    if "tf-mwms" in frameworks:
        rows += tf_rows(world_sizes, tf_epochs, batch_size, echo)
    return add_derived(rows)


def add_derived(rows: list[dict]) -> list[dict]:
    """Efficiency (vs the same framework at 1 rank), ratio to DDP, lines changed and launcher.

    Rows measured apart (the torch job, :func:`tf_rows`) are joined by calling it
    again on their concatenation.
    """
    by = {(r["framework"], r["world_size"]): r for r in rows}
    for r in rows:
        one = by.get((r["framework"], 1))
        ddp = by.get(("ddp", r["world_size"]))
        r["efficiency"] = r["samples_per_s"] / (r["world_size"] * one["samples_per_s"]) if one else None
        r["ratio_to_ddp"] = r["samples_per_s"] / ddp["samples_per_s"] if ddp else None
        r["lines_changed"] = lines_changed(_recipe_of(r["framework"]))
        r["launcher"] = LAUNCHER_NAMES[_recipe_of(r["framework"])]
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(rows: list[dict], title: str = "Frameworks, same model and data"):
    """A rich Table of the rows (prints in a notebook or a terminal)."""
    from rich.table import Table

    t = Table(title=title)
    has_rss = all("peak_rss_bytes" in r for r in rows)  # only when every row was measured alone
    for col in ("framework", "ranks", "samples/s", "efficiency", "vs DDP", "state KiB/rank",
                *(("peak RSS MiB",) if has_rss else ()), "lines changed", "launcher"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("framework", "launcher") else "right")
    for r in rows:
        rss = r.get("peak_rss_bytes")
        t.add_row(
            r["framework"], str(r["world_size"]), f"{r['samples_per_s']:,.0f}",
            _fmt(r["efficiency"], ".2f"), _fmt(r["ratio_to_ddp"], ".2f"),
            f"{r['state_bytes_per_rank'] / 1024:,.1f}",
            *((_fmt(rss / 2**20 if rss else None, ",.0f"),) if has_rss else ()),
            str(r["lines_changed"]), r["launcher"],
        )  # fmt: skip
    return t


def plot(rows: list[dict], title: str = ""):
    """Samples/s per framework and world size, and model-state bytes per rank (a matplotlib Figure)."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["framework"] for r in rows))
    worlds = sorted({r["world_size"] for r in rows})
    by = {(r["framework"], r["world_size"]): r for r in rows}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(worlds)
    for i, w in enumerate(worlds):
        xs = [j + i * width for j, n in enumerate(names) if (n, w) in by]
        ax1.bar(xs, [by[(n, w)]["samples_per_s"] for n in names if (n, w) in by], width, label=f"{w} rank(s)")
        ax2.bar(xs, [by[(n, w)]["state_bytes_per_rank"] / 1024 for n in names if (n, w) in by], width,
                label=f"{w} rank(s)")  # fmt: skip
    for ax, label in ((ax1, "throughput (samples/s)"), (ax2, "model state per rank (KiB)")):
        ax.set_xticks([j + width * (len(worlds) - 1) / 2 for j in range(len(names))], names, rotation=30)
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title or "Same ResNet-style CNN and batches under each framework")
    fig.tight_layout()
    return fig
