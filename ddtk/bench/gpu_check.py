"""``make gpu-check``: every GPU path of the kit, run once on a machine with NVIDIA GPUs.

The CPU suite proves the algorithms; it cannot prove the NCCL, CUDA-AMP and
GPU-profiler branches, which only run where a GPU is. This script runs each of them
once, small, in about eight minutes on one H100, and records what it measured:

========== ==================================================================
step       what runs
========== ==================================================================
tests      every test marked ``gpu`` (NCCL tensor parallelism, fp16 with
           ``GradScaler`` against ddtk's loss scaler, FSDP2 on CUDA, pinned
           checkpoint snapshots, CUDA peak memory); a skip counts as a failure
collectives ``ddtk bench collectives --backend nccl``: ddtk's algorithms against
           ``torch.distributed`` NCCL, one rank per GPU (two ranks on one GPU
           where the machine has one: NCCL's answer is recorded either way)
precision  ``ddtk bench precision --device cuda``: fp32, bf16, fp16 step time and
           peak memory
memory     the memory calculator against ``torch.cuda.max_memory_allocated``
           over one Adam step of a small transformer
profiler   ``ddtk.profiling.jobs`` under ``torchrun`` with NCCL, traced with
           CUDA kernels, then broken down by :func:`ddtk.profiling.analyse`
deepspeed  ZeRO stages 1, 2 and 3 of ``ddtk.examples.cnn_deepspeed`` on NCCL
notebooks  the notebooks whose parameters take ``use_gpu``/``backend``, at their
           small defaults with ``use_gpu=True`` and ``backend="nccl"``
========== ==================================================================

Each step runs in a process of its own, under what is left of the total time
limit, with its output in ``OUT/<step>.log``; its verdict is its exit status.
The results go to ``OUT/gpu-check.json``; ``--record`` also writes
``docs/benchmarks-gpu.json`` and the GPU section of ``docs/benchmarks.md``,
naming the device.

Without a CUDA device it runs nothing and exits with status 3 at once, so that a
``make gpu-check`` on a laptop says plainly why it did nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

NO_GPU = 3  # the exit status without a CUDA device
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- gpu-check: begin -->", "<!-- gpu-check: end -->"
# lectures first (their GPU parameters need one GPU); the labs need as many GPUs as ranks
NOTEBOOKS = ("01", "04", "05", "07", "03", "06", "02")


@dataclass
class StepResult:
    """What one step did: its verdict, its time, where its log is, and what it measured."""

    name: str
    status: str  # "pass", "fail", "timeout" or "not run"
    seconds: float = 0.0
    log: str = ""
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Device:
    """The GPUs this run found."""

    count: int
    name: str
    torch: str
    cuda: str | None


def find_device() -> Device | None:
    """The CUDA devices torch sees, or None when there are none."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return Device(torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.__version__,
                  torch.version.cuda)  # fmt: skip


def no_gpu_message() -> str:
    """Why nothing ran, with what torch says about CUDA."""
    import torch

    build = torch.version.cuda or "none (a CPU build of torch)"
    return (f"gpu-check needs an NVIDIA GPU, and torch {torch.__version__} sees none "
            f"(torch.cuda.is_available() is False; CUDA build: {build}). Nothing was run. "
            "Run it on a GPU machine, with the CUDA build of torch from deploy/images/.")  # fmt: skip


def _torchrun(gpus: int, module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={gpus}", "-m", module, *args]  # fmt: skip


def commands(dev: Device, out: Path, notebooks: list[str]) -> dict[str, list[list[str]]]:
    """The command lines of every subprocess step (the in-process ones run this module)."""
    py, ddtk = sys.executable, [sys.executable, "-m", "ddtk"]
    ranks = ",".join(str(n) for n in (2, 4, 8) if n <= max(dev.count, 2))
    self = [py, "-m", "ddtk.bench.gpu_check", "--out", str(out), "--inner"]
    return {
        "tests": [[py, "-m", "pytest", "-m", "gpu", str(ROOT / "tests"), "-q", "-rs",
                   "-p", "no:cacheprovider", f"--junitxml={out / 'tests.xml'}"]],
        "collectives": [[*ddtk, "bench", "collectives", "--backend", "nccl", "-n", ranks,
                         "--max-bytes", "256M", "--transports", "shm", "--no-launch-overhead",
                         "--json", str(out / "collectives.json"), "--plot", str(out / "collectives.png")]],
        "precision": [[*ddtk, "bench", "precision", "--device", "cuda", "--steps", "30",
                       "--json", str(out / "precision.json"), "--plot", str(out / "precision.png")]],
        "memory": [[*self, "memory"]],
        "profiler": [_torchrun(dev.count, "ddtk.profiling.jobs", "baseline", "--trace-dir",
                               str(out / "traces")), [*self, "profiler"]],
        "deepspeed": [_torchrun(dev.count, "ddtk.examples.cnn_deepspeed", "--zero-stage", str(s),
                                "--epochs", "1", "--json", str(out / f"deepspeed-zero{s}.json"))
                      for s in (1, 2, 3)],
        "notebooks": [[*ddtk, "course", "run", name, "--out", str(out / "notebooks"), "--timeout", "300",
                       *_gpu_parameters(name, dev.count)] for name in notebooks],
    }  # fmt: skip


def _gpu_parameters(name: str, gpus: int) -> list[str]:
    """``-p`` options for the GPU parameters that this notebook's parameters cell declares."""
    import nbformat

    from ddtk.course import catalog
    from ddtk.course.notebooks import parameter_names

    nb = nbformat.read(catalog.find(name).file, as_version=4)
    cell = next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)
    declared = (parameter_names(cell.source) if cell is not None else None) or set()
    ranks = str(max(gpus, 1))  # NCCL refuses two ranks on one GPU
    wanted = {"use_gpu": "true", "backend": "nccl", "world_size": ranks, "num_workers": ranks,
              "ray_workers": ranks, "np": ranks}
    return [a for k, v in wanted.items() if k in declared for a in ("-p", f"{k}={v}")]


def run_step(name: str, argvs: list[list[str]], out: Path, seconds_left: float) -> StepResult:
    """Run the step's commands in order, each under what is left of ``seconds_left``."""
    log = out / f"{name}.log"
    start = time.monotonic()
    status = "pass"
    with log.open("w") as f:
        for argv in argvs:
            left = seconds_left - (time.monotonic() - start)
            if left <= 1:
                status = "timeout"
                break
            f.write(f"$ {' '.join(argv)}\n")
            f.flush()
            try:
                code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=left,
                                      cwd=ROOT, start_new_session=True).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                status = "timeout"
                break
            if code != 0:
                status = "fail"
                f.write(f"[exit status {code}]\n")
    result = StepResult(name, status, round(time.monotonic() - start, 1), str(log))
    if name == "tests":
        result.detail = junit_counts(out / "tests.xml")
        if result.detail.get("skipped"):
            result.status = "fail"  # a skipped GPU test proved nothing
    for path in sorted(out.glob(f"{name}*.json")):
        result.detail[path.stem] = json.loads(path.read_text())
    return result


def junit_counts(path: Path) -> dict:
    """Tests, failures, errors and skips from pytest's JUnit XML (empty if it was not written)."""
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return {}
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


# ------------------------------------------------------------------ in-process steps


def memory_step(out: Path) -> dict:
    """The calculator's bytes against ``torch.cuda.max_memory_allocated`` for one Adam step."""
    import torch
    from torch.nn import functional as F

    from ddtk.memory import calculator as calc
    from ddtk.models import TinyTransformer

    cfg = calc.TransformerConfig(layers=8, hidden=512, heads=8, seq_len=256, micro_batch=8, vocab=1024)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = TinyTransformer(cfg.vocab, cfg.seq_len, cfg.hidden, cfg.heads, cfg.layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq_len), device=dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):  # the second step holds the optimizer state the first created
        loss = F.cross_entropy(model(tokens).reshape(-1, cfg.vocab), tokens.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    est = calc.estimate(cfg)
    measured = torch.cuda.max_memory_allocated()
    row = {"config": asdict(cfg), "predicted": est.as_dict(), "predicted_total": est.total,
           "measured_peak": measured, "ratio": measured / est.total}  # fmt: skip
    (out / "memory.json").write_text(json.dumps(row, indent=1))
    if not 0.5 <= row["ratio"] <= 2.0:  # a factor of two is a unit error, not allocator slack
        raise SystemExit(f"measured peak {measured} B is {row['ratio']:.2f}x the predicted {est.total} B")
    return row


def profiler_step(out: Path) -> dict:
    """Break the traced NCCL job down; its traces must hold CUDA kernels."""
    from ddtk.profiling import analyse

    a = analyse(out / "traces", skip_first=1)
    on_device = [t.rank for t in a.traces if t.on_device]
    row = {"ranks": len(a.traces), "ranks_with_kernels": on_device,
           "backends": sorted({str(t.backend) for t in a.traces}),
           "per_rank": a.breakdown.per_rank(),
           "findings": [str(f) for f in a.findings]}  # fmt: skip
    (out / "profiler.json").write_text(json.dumps(row, indent=1, default=str))
    if not a.traces or len(on_device) != len(a.traces):
        raise SystemExit(f"traces without CUDA kernels: ranks {sorted({t.rank for t in a.traces} - set(on_device))}")
    return row


INNER: dict[str, Callable[[Path], dict]] = {"memory": memory_step, "profiler": profiler_step}


# ------------------------------------------------------------------ the record


def markdown(dev: Device, results: list[StepResult], total: float) -> str:
    """The GPU section of docs/benchmarks.md: the device, each step's verdict and time."""
    lines = [BEGIN, "## GPU check (`make gpu-check`)", "",
             f"Device: {dev.count} x {dev.name}, torch {dev.torch}, CUDA {dev.cuda}; "
             f"{total:.0f} s in all. Measurements: `docs/benchmarks-gpu.json`.", "",
             "| step | verdict | seconds |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {r.name} | {r.status} | {r.seconds:.0f} |" for r in results]
    return "\n".join([*lines, "", END])


def record(dev: Device, results: list[StepResult], total: float) -> None:
    """Write docs/benchmarks-gpu.json and replace (or append) the GPU section of the doc."""
    data = {"device": asdict(dev), "seconds": total, "steps": [asdict(r) for r in results]}
    (DOC.parent / "benchmarks-gpu.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    text, section = DOC.read_text(), markdown(dev, results, total)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOC.write_text(text)


# ------------------------------------------------------------------ command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddtk.bench.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check", help="logs and JSON (default build/gpu-check)")
    p.add_argument("--only", default=None, help=f"comma-separated steps (default all: {', '.join(STEPS)})")
    p.add_argument("--time-limit", type=float, default=480.0, help="seconds for every step together (default 480)")
    p.add_argument("--notebooks", default=",".join(NOTEBOOKS), help="catalog names for the notebooks step, in order")
    p.add_argument("--record", action="store_true", help="write docs/benchmarks-gpu.json and the doc's GPU section")
    p.add_argument("--inner", default=None, choices=sorted(INNER), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = STEPS if args.only is None else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        p.error(f"unknown step(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(STEPS)}")
    if not args.time_limit > 0:
        p.error(f"--time-limit must be a positive number of seconds, got {args.time_limit:g}")
    from ddtk.course import catalog

    names = [n.strip() for n in args.notebooks.split(",") if n.strip()]
    missing = [n for n in names if not _known(catalog, n)]
    if missing:
        p.error(f"unknown notebook(s) {', '.join(missing)} for --notebooks")
    args.steps, args.notebook_names = steps, names
    return args


def _known(catalog, name: str) -> bool:
    try:
        catalog.find(name)
    except ValueError:
        return False
    return True


STEPS = ["tests", "collectives", "precision", "memory", "profiler", "deepspeed", "notebooks"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.inner:
        INNER[args.inner](args.out)
        return 0
    dev = find_device()
    if dev is None:
        print(no_gpu_message(), file=sys.stderr)
        return NO_GPU
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"gpu-check on {dev.count} x {dev.name} (torch {dev.torch}, CUDA {dev.cuda}); logs in {args.out}")
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    argvs = commands(dev, args.out, args.notebook_names)
    start, results = time.monotonic(), []
    for name in args.steps:
        left = args.time_limit - (time.monotonic() - start)
        result = run_step(name, argvs[name], args.out, left) if left > 1 else StepResult(name, "not run")
        results.append(result)
        print(f"  {name:<12} {result.status:<8} {result.seconds:6.1f} s  {result.log}", flush=True)
    total = time.monotonic() - start
    summary = {"device": asdict(dev), "seconds": total, "steps": [asdict(r) for r in results]}
    (args.out / "gpu-check.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    if args.record:
        record(dev, results, total)
    return 0 if all(r.status == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
