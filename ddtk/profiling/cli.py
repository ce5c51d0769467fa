"""``ddtk profile``: run a named example job under the profiler, print the breakdown and the diagnosis.

    ddtk profile --list                    the jobs and what each plants
    ddtk profile slow -n 2                 profile the job on 2 ranks, print table + diagnosis
    ddtk profile straggler -n 3 --plot timeline.png --json profile.json
    ddtk profile --traces DIR              analyse traces you collected elsewhere
                                           (torchrun, Ray Train: one rank<r>.json per rank)
    ddtk profile slow --flamegraph job.svg also sample the job's Python with py-spy

Traces are kept (``--out``, default ``build/profile/<job>``): open them in
https://ui.perfetto.dev or ``chrome://tracing``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROFILE_HELP = "profile a distributed job: step-time breakdown, stragglers, diagnosis"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``ddtk profile``."""
    p = subparsers.add_parser("profile", help=PROFILE_HELP, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("job", nargs="?", help="a job name (see --list)")
    p.add_argument("-n", "--world-size", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--list", action="store_true", help="list the jobs and exit")
    p.add_argument(
        "--traces", metavar="DIR", help="analyse existing traces instead of running a job"
    )
    p.add_argument("--out", metavar="DIR", help="where the traces go (default build/profile/<job>)")
    p.add_argument("--json", metavar="PATH", help="write the breakdown and the findings as JSON")
    p.add_argument("--plot", metavar="PATH", help="write the timeline (ranks on one clock) as PNG")
    p.add_argument(
        "--flamegraph", metavar="SVG", help="also run the job under py-spy (--subprocesses)"
    )
    p.add_argument("--backend", default="auto", help="auto, gloo or nccl (default auto)")
    p.set_defaults(func=run)


def _list() -> int:
    from ddtk.profiling.jobs import JOBS

    width = max(map(len, JOBS))
    for name, cfg in JOBS.items():
        print(f"  {name:<{width}}  {cfg.description}")
    return 0


def run(args: argparse.Namespace) -> int:
    """The handler of ``ddtk profile``; returns the exit code."""
    from ddtk.profiling.jobs import JOBS

    if args.list:
        return _list()
    if bool(args.job) == bool(args.traces):
        print(
            "ddtk profile: give a job name (see --list) or --traces DIR, not both", file=sys.stderr
        )
        return 2
    if args.job and args.job not in JOBS:
        print(
            f"ddtk profile: unknown job {args.job!r}; choose from {', '.join(JOBS)}",
            file=sys.stderr,
        )
        return 2
    if args.world_size < 1:
        print(f"ddtk profile: --world-size must be >= 1, got {args.world_size}", file=sys.stderr)
        return 2
    return _profile(args)


def _profile(args: argparse.Namespace) -> int:
    from ddtk.profiling.report import analyse
    from ddtk.profiling.trace import TraceError

    if args.traces:
        trace_dir = Path(args.traces)
    else:
        from ddtk.profiling.jobs import run_job

        trace_dir = Path(args.out or f"build/profile/{args.job}")
        print(
            f"running {args.job!r} on {args.world_size} rank(s), profiling into {trace_dir}/ ...",
            flush=True,
        )
        result = run_job(args.job, args.world_size, trace_dir, backend=args.backend)
        print(f"unprofiled: {result.samples_per_s:.0f} samples/s, {result.step_ms:.1f} ms per step; "
              f"peak RSS per rank {max(result.peak_rss_mib):.0f} MiB")  # fmt: skip
    try:
        analysis = analyse(trace_dir)
    except TraceError as exc:
        print(f"ddtk profile: {exc}", file=sys.stderr)
        return 2
    print(analysis.text())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(analysis.as_dict(), indent=1, default=str))
        print(f"wrote {args.json}")
    if args.plot:
        _plot(analysis, args.plot)
    if args.flamegraph and args.job:
        from ddtk.profiling.pyspy import py_spy_record

        cmd = [sys.executable, "-m", "ddtk.profiling.jobs", args.job, "-n", str(args.world_size)]
        print(f"sampling the job's Python with py-spy into {args.flamegraph} ...", flush=True)
        py_spy_record(cmd, args.flamegraph)
        print(f"wrote {args.flamegraph}")
    return 0


def _plot(analysis, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from ddtk.profiling.timeline import plot_timeline

    ax = plot_timeline(analysis.traces)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ax.figure.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")
