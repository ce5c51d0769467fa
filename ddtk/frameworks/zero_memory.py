"""DeepSpeed ZeRO stages 1, 2, 3: the model-state bytes each rank really holds.

Run under ``torchrun`` (or the ``deepspeed`` launcher; ``--local_rank`` is accepted)::

    torchrun --nproc-per-node 2 -m ddtk.frameworks.zero_memory --stages 1,2,3 --json zero.json

In one process per rank it builds a DeepSpeed engine per stage
(``deepspeed.initialize`` with the JSON config of :func:`ds_config`, gloo on
CPU), trains the digits ResNet for a few steps, and then measures, from the
tensors the engine and its optimizer hold, the bytes per rank of:

* ``parameters``: the model's parameters (stage 3: the rank's ``ds_tensor`` partition);
* ``master``: DeepSpeed's fp32 partition of the weights that the optimizer updates
  (``single_partition_of_fp32_groups``, stage 3 ``fp32_partitioned_groups_flat``);
* ``gradients``: the gradient partition the optimizer step reads
  (``averaged_gradients``, or the offloaded fp32 ``.grad``);
* ``optimizer_state``: Adam's ``exp_avg`` and ``exp_avg_sq`` (and ``step``).

Overlapping tensors (views into one flat buffer) are counted once.
:func:`run_zero_memory` starts the job through :mod:`ddtk.frameworks.launchers`
and adds the paper's formula (:func:`ddtk.parallel.zero.zero_memory_per_param`,
fp32) and ddtk's own :class:`~ddtk.parallel.zero.ZeroOptimizer` on the same model.

>>> ds_config(3)["zero_optimization"]["stage"]
3
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ddtk.frameworks.deepspeed_shm import remove_shm_buffers

__all__ = ["covered_bytes", "ddtk_zero_rows", "ds_config", "main", "run_zero_memory"]


def ds_config(stage: int, micro_batch: int = 16, offload: bool = False) -> dict:
    """The DeepSpeed JSON config: Adam (torch's), ZeRO ``stage``, optional CPU optimizer offload.

    ``stage3_param_persistence_threshold: 0`` makes stage 3 partition every
    parameter; by default DeepSpeed keeps parameters under 100k elements whole,
    which on a 20k-parameter model would be all of them.
    """
    zero: dict[str, Any] = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def _tensors(x: Any) -> Iterator[Any]:
    import torch

    if torch.is_tensor(x):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def covered_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of memory the tensors cover, counting overlapping views once.

    >>> import torch
    >>> flat = torch.zeros(10)
    >>> covered_bytes([flat[:6], flat[4:], torch.zeros(3)])
    52
    """
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for t in tensors
        if t is not None and t.numel() > 0
    )
    total, end = 0, -1
    for a, b in spans:
        if a >= end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def _measure(engine: Any, stage: int) -> dict:
    """Model-state bytes this rank holds, by role, right after backward (before the step)."""
    opt = engine.optimizer
    params = list(engine.module.parameters())
    if stage == 3:
        param_t = [p.ds_tensor for p in params]
        master = list(_tensors(opt.fp32_partitioned_groups_flat))
    else:
        param_t = [p.data for p in params]
        master = list(_tensors(opt.single_partition_of_fp32_groups))
    grads = list(_tensors(getattr(opt, "averaged_gradients", {}))) + [m.grad for m in master]
    state = list(_tensors([dict(s) for s in opt.optimizer.state.values()]))
    parts = {
        "parameters": covered_bytes(param_t),
        "master": covered_bytes(master),
        "gradients": covered_bytes(grads),
        "optimizer_state": covered_bytes(state),
    }
    parts["total"] = covered_bytes(param_t + master + grads + state)
    return parts


def _run_stage(stage: int, steps: int, offload: bool) -> dict:
    import deepspeed
    import torch
    import torch.distributed as dist

    from ddtk.data import load_dataset
    from ddtk.models import build_model

    model = build_model("resnet", seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config(stage, offload=offload)
    )
    ds = load_dataset("digits")
    rank, world = dist.get_rank(), dist.get_world_size()
    for i in range(steps):
        idx = torch.arange(16) + 16 * (i * world + rank)
        loss = torch.nn.functional.cross_entropy(engine(ds.x[idx]), ds.y[idx])
        engine.backward(loss)
        if i == steps - 1:
            parts = _measure(engine, stage)
        engine.step()
    row = {"framework": "deepspeed", "stage": stage, "offload": offload, "world_size": world,
           "parameters_count": n_params, "seconds": time.perf_counter() - start,
           "loss": loss.item(), "optimizer": type(engine.optimizer).__name__, **parts}  # fmt: skip
    engine.destroy()
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    """Entry point under torchrun/deepspeed: every stage in this process group, rank 0 writes JSON."""
    import deepspeed
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="1,2,3")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--offload", action="store_true", help="offload_optimizer to the CPU")
    p.add_argument("--json", default=None)
    p.add_argument("--local_rank", "--local-rank", type=int, default=0, help="set by `deepspeed`")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rows = [_run_stage(int(s), args.steps, args.offload) for s in args.stages.split(",")]
    if dist.get_rank() == 0:
        for r in rows:
            print(json.dumps(r), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    # Leave together and take the process group down before the interpreter exits: a rank
    # that exits with gloo's threads still running can abort ("terminate called without an
    # active exception", SIGABRT), which torchrun reports as a failed job.
    dist.barrier()
    dist.destroy_process_group()
    remove_shm_buffers()  # DeepSpeed's CPU all-reduce segments, which it never unlinks
    return rows


def ddtk_zero_rows(world_size: int = 2, stages: Iterable[int] = (0, 1, 2)) -> list[dict]:
    """ddtk's :class:`~ddtk.parallel.zero.ZeroOptimizer` (Adam) on the same model: bytes per rank."""
    import ddtk

    def job(ctx: Any, stages: tuple[int, ...]) -> list[dict]:
        import torch

        from ddtk.data import load_dataset
        from ddtk.models import build_model
        from ddtk.parallel.zero import ZeroOptimizer

        ds = load_dataset("digits")
        out = []
        for stage in stages:
            model = build_model("resnet", seed=0)
            opt = ZeroOptimizer(ctx, model, torch.optim.Adam, stage=stage, lr=1e-3)
            idx = torch.arange(16) + 16 * ctx.rank
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(ds.x[idx]), ds.y[idx]).backward()
            opt.step()
            grads = (
                opt.gradient_bytes()
            )  # the reduced gradient it keeps: full, or the stage-2 shard
            out.append({"framework": "ddtk ZeroOptimizer", "stage": stage, "world_size": ctx.world_size,
                        "parameters": opt.parameter_bytes(), "gradients": grads,
                        "optimizer_state": opt.state_bytes()})  # fmt: skip
            out[-1]["total"] = out[-1]["parameters"] + grads + out[-1]["optimizer_state"]
        return out

    return ddtk.launch(
        job, world_size, args=(tuple(stages),), backend="gloo", echo=False, timeout=120
    )[0]


def run_zero_memory(
    world_size: int = 2, stages: Iterable[int] = (1, 2, 3), steps: int = 3, offload: bool = False,
    timeout: float = 240.0, echo: bool | Any = True, launcher: str = "torchrun",
) -> list[dict]:  # fmt: skip
    """Run :func:`main` under ``torchrun`` (or ``deepspeed``) and return rank 0's rows.

    Each row gains ``formula``: fp32 bytes per rank from
    :func:`~ddtk.parallel.zero.zero_memory_per_param` times the parameter count.
    """
    import tempfile

    from ddtk.frameworks.launchers import free_port, run_command, tool, torchrun_command
    from ddtk.parallel.zero import zero_memory_per_param

    with tempfile.TemporaryDirectory(prefix="zero-mem-") as folder:
        out = Path(folder) / "zero.json"
        script = ["-m", "ddtk.frameworks.zero_memory", "--stages", ",".join(map(str, stages)),
                  "--steps", str(steps), "--json", str(out)] + (["--offload"] if offload else [])  # fmt: skip
        if launcher == "deepspeed":
            cmd = [tool("deepspeed"), "--num_gpus", str(world_size), "--master_port", str(free_port()),
                   "--module", *script[1:]]  # fmt: skip
        else:
            cmd = torchrun_command(world_size, script, master_port=free_port())
        run_command(cmd, timeout=timeout, echo=echo)
        rows = json.loads(out.read_text())
    for r in rows:
        per = zero_memory_per_param(r["stage"], r["world_size"], mixed_precision=False)
        r["formula"] = per["total"] * r["parameters_count"]
    return rows


if __name__ == "__main__":
    main()
