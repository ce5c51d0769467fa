"""``ddtk bench frameworks``: DDP, Horovod, DeepSpeed ZeRO-1/2/3, ddtk DataParallel and TF MWMS, side by side.

    ddtk bench frameworks                                  # 1 and 2 ranks
    ddtk bench frameworks -n 1,2,4 --steps 40 --json build/bench/frameworks.json --plot build/bench/frameworks.png

The torch frameworks train the same ResNet-style CNN from the same weights on
the same batches, interleaved round by round in the same ``horovodrun`` job per
world size (:mod:`ddtk.frameworks.compare_job`); then each runs alone for a few
steps so that its peak RSS per rank is its own. TensorFlow's
MultiWorkerMirroredStrategy recipe runs in its own worker processes (Keras
``fit``; its samples/s are of whole epochs). Columns: samples/s (weak scaling:
the per-rank batch is fixed), scaling efficiency against the same framework at
1 rank, the ratio to DDP at the same world size, the model-state bytes a rank
holds after backward, the peak RSS per rank, the lines the recipe changes from
single-process code, and the launcher.
"""

from __future__ import annotations

import argparse

from ddtk.bench.report import publish, save_figure


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ddtk bench frameworks``."""
    p = subparsers.add_parser("frameworks", help="DDP, Horovod, DeepSpeed, ddtk, TF MWMS: samples/s and memory",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("-n", "--world-sizes", default="1,2", help="comma-separated world sizes (default 1,2)")
    p.add_argument("--frameworks", default=None, help="comma-separated subset (default: all)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed round (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per framework (default 5)")
    p.add_argument("--tf-epochs", type=int, default=3, help="epochs of the TensorFlow run (default 3)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of samples/s and memory per rank")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ddtk.bench.collectives import environment
    from ddtk.frameworks.compare import FRAMEWORKS, plot, run_comparison, table
    from ddtk.frameworks.launchers import LauncherError

    console = Console()
    try:
        world_sizes = sorted({int(w) for w in args.world_sizes.split(",") if w.strip()})
        frameworks = args.frameworks.split(",") if args.frameworks else list(FRAMEWORKS)
        if not world_sizes or world_sizes[0] < 1:
            raise ValueError("--world-sizes needs positive integers")
        if min(args.batch, args.steps, args.rounds, args.tf_epochs) < 1:
            raise ValueError("--batch, --steps, --rounds and --tf-epochs must be positive")
        if set(frameworks) - set(FRAMEWORKS):
            raise ValueError(f"unknown framework(s) {sorted(set(frameworks) - set(FRAMEWORKS))}; "
                             f"choose from {', '.join(FRAMEWORKS)}")  # fmt: skip
    except ValueError as exc:
        console.print(f"ddtk bench frameworks: {exc}")
        return 2
    env = environment()
    console.print(f"[bold]ddtk bench frameworks[/bold]  cores={env['cores']} torch={env['torch']} "
                  f"batch/rank={args.batch} steps/round={args.steps} rounds={args.rounds}")  # fmt: skip
    try:
        with console.status("running the frameworks (horovodrun jobs, then TensorFlow workers) ..."):
            rows = run_comparison(world_sizes, frameworks, args.steps, args.rounds, args.batch,
                                  args.tf_epochs, memory=True)  # fmt: skip
    except LauncherError as exc:
        console.print(f"ddtk bench frameworks: a job failed: {exc}")
        return 1
    title = f"{env['cores']} cores, gloo, world sizes {world_sizes}"
    return publish(console, rows, env, args, lambda r: table(r, f"Frameworks ({title})"),
                   lambda r, path: save_figure(plot(r, f"Frameworks on {title}"), path))  # fmt: skip
