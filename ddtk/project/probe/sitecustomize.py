"""The checker's probe in every rank of a project run (loaded by Python at start-up).

``ddtk project check`` puts this folder first on ``PYTHONPATH`` and names a folder in
``DDTK_PROBE_DIR``. In a torchrun worker (``LOCAL_RANK`` is set) it registers a global
``torch.optim`` step hook: after every optimizer step of any optimizer it appends one
JSON line to ``DDTK_PROBE_DIR/rank-<RANK>-<pid>.jsonl`` with what the checker needs
and the program does not report itself: the optimizer's step count, the bytes of the
parameters it updates and of its state (Adam's moments: 1/N per rank when the state is
sharded), a digest of those parameters, and the bytes this process has handed to
communication so far (``torch.distributed``'s Python calls and ddtk's transports,
shared memory included; traffic that bypasses Python, such as DDP's C++ reducer over
gloo, the checker counts on the network itself). The checker stamps each line with
its own clock as it arrives, so it times the steps itself.

It changes nothing the program computes, and does nothing outside a torchrun worker
(the launcher, a plain ``python``, or when ``DDTK_PROBE_DIR`` is unset).
"""

import os

_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single",
                "send", "recv", "isend", "irecv", "gather", "scatter")  # fmt: skip


def _tensor_bytes(obj: object) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


def _count_calls(owner: object, name: str, sent: list, skip: int) -> None:
    """Wrap ``owner.name`` so the bytes of its first tensor argument are added to ``sent``."""
    import functools

    original = getattr(owner, name, None)
    if original is None or getattr(original, "_ddtk_probe", False):
        return

    @functools.wraps(original)
    def counted(*args, **kwargs):
        first = args[skip] if len(args) > skip else next(iter(kwargs.values()), None)
        sent[0] += _tensor_bytes(first)
        return original(*args, **kwargs)

    counted._ddtk_probe = True
    setattr(owner, name, counted)


def _count_communication(sent: list) -> None:
    import importlib

    import torch.distributed as dist

    for name in _COLLECTIVES:
        _count_calls(dist, name, sent, 0)
    for module, cls in (("ddtk.comm.transport", "Transport"),
                        ("ddtk.comm.shm_transport", "ShmTransport")):  # fmt: skip
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue
        _count_calls(owner, "isend", sent, 1)


def _install(folder: str, rank: str) -> None:
    import hashlib
    import json

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    sent = [0]
    _count_communication(sent)
    names: dict[int, int] = {}
    counts: dict[int, int] = {}
    sink: list = []

    def line(event: dict) -> None:
        if not sink or sink[0][0] != os.getpid():  # a forked child gets a file of its own
            path = os.path.join(folder, f"rank-{rank}-{os.getpid()}.jsonl")
            sink[:] = [(os.getpid(), open(path, "a", buffering=1, encoding="utf-8"))]  # noqa: SIM115 (open for the process's life)
        sink[0][1].write(json.dumps(event) + "\n")

    def tensor_bytes(t: torch.Tensor) -> memoryview:
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")

    @torch.no_grad()
    def after_step(optimizer: torch.optim.Optimizer, _args: tuple, _kwargs: dict) -> None:
        key = id(optimizer)
        index = names.setdefault(key, len(names))
        counts[key] = counts.get(key, 0) + 1
        digest = hashlib.blake2b(digest_size=16)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for p in params:
            digest.update(tensor_bytes(p))
        state = sum(
            t.nbytes for s in optimizer.state.values() for t in s.values()
            if isinstance(t, torch.Tensor)
        )  # fmt: skip
        line({"rank": int(rank), "pid": os.getpid(), "optimizer": index, "step": counts[key],
              "param_bytes": sum(p.nbytes for p in params), "state_bytes": state,
              "digest": digest.hexdigest(), "sent_bytes": sent[0]})  # fmt: skip

    register_optimizer_step_post_hook(after_step)


if os.environ.get("DDTK_PROBE_DIR") and "LOCAL_RANK" in os.environ:
    import contextlib

    with contextlib.suppress(ImportError):  # no torch here: nothing to observe, the checker says so
        _install(os.environ["DDTK_PROBE_DIR"], os.environ.get("RANK", "0"))
