"""``ddtk bench ...``: command-line front of the benchmarks."""

from __future__ import annotations

import argparse

BENCH_HELP = "benchmarks that compare ddtk with the production peer"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench``; its own parser is built only when it runs.

    The benchmark modules import torch and matplotlib, so ``ddtk --help`` and the
    other commands would pay for them if every benchmark registered up front.
    """
    bench = subparsers.add_parser("bench", help=BENCH_HELP, add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    """Parse ``ddtk bench ARGS`` with the full benchmark parser and run the benchmark."""
    bench_args = bench_parser().parse_args(args.rest)
    return int(bench_args.func(bench_args) or 0)


def bench_parser() -> argparse.ArgumentParser:
    """The ``ddtk bench`` parser with every benchmark registered."""
    bench = argparse.ArgumentParser(prog="ddtk bench", description=BENCH_HELP)
    sub = bench.add_subparsers(dest="bench", metavar="BENCHMARK")
    p = sub.add_parser(
        "collectives",
        help="all-reduce busbw by message size, ddtk algorithms vs torch.distributed (nccl-tests style)",
        description=__import__("ddtk.bench.collectives", fromlist=["x"]).__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-n", "--world-sizes", default="2,4", help="comma-separated world sizes (default 2,4)"
    )
    p.add_argument("--min-bytes", default="1K", help="smallest message (default 1K)")
    p.add_argument("--max-bytes", default="64M", help="largest message (default 64M)")
    p.add_argument(
        "--step", type=int, default=4, help="size multiplier between rows, a power of 2 (default 4)"
    )
    p.add_argument("--algorithms", default="ring,tree,recursive_doubling,naive,hierarchical,hierarchical_rs",
                   help="comma-separated ddtk algorithms (default: all)")  # fmt: skip
    p.add_argument(
        "--iters",
        type=int,
        default=10,
        help="timed repetitions per size (x5 below 64 KiB; default 10)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions first (default 2)")
    p.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    p.add_argument("--transports", default="shm,tcp",
                   help="ddtk transports to time, comma-separated: shm, tcp (default both)")  # fmt: skip
    p.add_argument(
        "--json", metavar="PATH", help="write every measurement and the environment as JSON"
    )
    p.add_argument("--plot", metavar="PATH", help="write a PNG of busbw against message size")
    p.add_argument(
        "--no-launch-overhead", action="store_true", help="skip measuring ddtk.launch start-up"
    )
    p.set_defaults(func=_run_collectives)
    from ddtk.bench import (
        checkpoint,
        compression,
        dp,
        frameworks,
        memory,
        network,
        pipeline,
        precision,
        profiler,
        tp,
        zero,
    )

    for module in (dp, compression, tp, pipeline, zero, precision, memory, checkpoint, frameworks,
                   profiler, network):  # fmt: skip
        module.register(sub)
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])
    return bench


def _run_collectives(args: argparse.Namespace) -> int:
    from ddtk.bench import report
    from ddtk.bench.timing import parse_size

    try:
        world_sizes = [int(w) for w in args.world_sizes.split(",") if w.strip()]
        lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
        if args.step < 2 or args.step & (args.step - 1):
            raise ValueError(f"--step must be a power of two >= 2, got {args.step}")
        if not world_sizes or min(world_sizes) < 2:
            raise ValueError(
                "--world-sizes needs integers >= 2 (one rank has nothing to communicate)"
            )
        if lo < 4 or hi < lo:
            raise ValueError(f"need 4 <= --min-bytes <= --max-bytes, got {lo} and {hi}")
        algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        from ddtk.comm.context import ALL_REDUCE_ALGORITHMS

        transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        if not transports or set(transports) - {"shm", "tcp"}:
            raise ValueError(f"--transports takes shm and/or tcp, got {args.transports!r}")

        unknown = [a for a in algorithms if a not in ALL_REDUCE_ALGORITHMS or a == "torch"]
        if unknown:
            raise ValueError(
                f"unknown algorithm(s) {', '.join(unknown)}; choose from {', '.join(ALL_REDUCE_ALGORITHMS[:-1])}"
            )
    except ValueError as exc:
        print(f"ddtk bench collectives: {exc}")
        return 2
    sizes = []
    size = lo
    while size <= hi:
        sizes.append(size)
        size *= args.step
    return report.run_collectives(world_sizes, sizes, algorithms, args, transports)
