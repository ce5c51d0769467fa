"""DistributedContext: messages, validation across ranks, statistics, clear errors, from_env."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ddtk
from ddtk import RankError, ReduceOp
from ddtk.comm import CollectiveMismatchError
from ddtk.comm.validation import describe_mismatch

pytestmark = pytest.mark.distributed


def _messages(ctx):
    n, r = ctx.world_size, ctx.rank
    # ring of objects with distinct tags, then everyone sends to rank 0, received from any source
    ctx.send({"from": r, "data": [r] * 3}, (r + 1) % n, tag=5)
    ctx.send(torch.arange(r + 1, dtype=torch.float64).view(-1, 1), (r + 1) % n, tag=6)
    got_obj = ctx.recv((r - 1) % n, tag=5)
    got_t = ctx.recv((r - 1) % n, tag=6)
    out = {"obj": (got_obj.src, got_obj.tag, got_obj.payload), "tensor": got_t.payload, "empty": None}
    if r != 0:
        ctx.send(f"hello from {r}", 0, tag=9)
        ctx.send(torch.empty(0, 3), 0, tag=10)
    else:
        out["any"] = sorted((m.src, m.payload) for m in (ctx.recv(None, tag=9) for _ in range(n - 1)))
        out["empty"] = [ctx.recv(src, tag=10).payload for src in range(1, n)]
    return out


def test_point_to_point_messages() -> None:
    n = 3
    res = ddtk.launch(_messages, n, timeout=60)
    for r, out in enumerate(res):
        prev = (r - 1) % n
        assert out["obj"] == (prev, 5, {"from": prev, "data": [prev] * 3})
        torch.testing.assert_close(out["tensor"], torch.arange(prev + 1, dtype=torch.float64).view(-1, 1))
    assert res[0]["any"] == [(1, "hello from 1"), (2, "hello from 2")]
    assert [t.shape for t in res[0]["empty"]] == [(0, 3), (0, 3)]


def _unreceived(ctx):
    if ctx.rank == 1:
        ctx.send("nobody listens", 0, tag=3)
    return ctx.rank


def test_message_never_received_is_reported_not_hung() -> None:
    with pytest.raises(RankError, match="rank 1 finished with messages that were never received: to rank 0 with tag 3"):
        ddtk.launch(_unreceived, 2, timeout=60)


def _mismatch(ctx, kind):
    if kind == "shape":
        ctx.all_reduce(torch.ones(10 + ctx.rank))
    elif kind == "dtype":
        ctx.all_reduce(torch.ones(4, dtype=torch.float64 if ctx.rank == 2 else torch.float32))
    elif kind == "collective":
        if ctx.rank == 0:
            ctx.broadcast(torch.ones(3))
        else:
            ctx.all_reduce(torch.ones(3))
    elif kind == "algorithm":
        ctx.all_reduce(torch.ones(3), algorithm="tree" if ctx.rank else "ring")


@pytest.mark.parametrize(
    ("kind", "pattern"),
    [
        ("shape", r"shape: rank 0: \(10,\); rank 1: \(11,\); rank 2: \(12,\)"),
        ("dtype", r"dtype: ranks 0,1: 'torch.float32'; rank 2: 'torch.float64'"),
        ("collective", r"collective: rank 0: 'broadcast'; ranks 1,2: 'all_reduce'"),
        ("algorithm", r"algorithm: rank 0: 'ring'; ranks 1,2: 'tree'"),
    ],
)
def test_mismatched_collectives_raise_instead_of_hanging(kind, pattern) -> None:
    with pytest.raises(RankError, match="CollectiveMismatchError") as info:
        ddtk.launch(_mismatch, 3, args=(kind,), timeout=60)
    assert __import__("re").search(pattern, info.value.traceback), info.value.traceback


def test_describe_mismatch_names_only_differing_fields() -> None:
    text = describe_mismatch([{"collective": "reduce", "root": 0, "op": "SUM"}, {"collective": "reduce", "root": 1, "op": "SUM"}])
    assert "root: rank 0: 0; rank 1: 1" in text and "op" not in text.split("\n", 1)[1]
    assert issubclass(CollectiveMismatchError, RuntimeError)


def _bad_calls(ctx):
    errors = {}
    calls = {
        "avg_int": lambda: ctx.all_reduce(torch.ones(3, dtype=torch.int64), op=ReduceOp.AVERAGE),
        "bad_algo": lambda: ctx.all_reduce(torch.ones(3), algorithm="butterfly"),
        "bad_op": lambda: ctx.all_reduce(torch.ones(3), op="median"),
        "not_tensor": lambda: ctx.all_reduce([1, 2, 3]),
        "bad_root": lambda: ctx.reduce(torch.ones(3), root=ctx.world_size),
        "self_send": lambda: ctx.send(1, ctx.rank),
        "bad_tag": lambda: ctx.send(1, (ctx.rank + 1) % ctx.world_size, tag=-1),
        "scatter_count": lambda: ctx.scatter([torch.ones(1)], root=ctx.rank),
        "rs_scalar": lambda: ctx.reduce_scatter(torch.tensor(1.0)),
        "group_size": lambda: ctx.all_reduce(torch.ones(3), algorithm="ring", group_size=2),
    }
    for name, call in calls.items():
        try:
            call()
        except (TypeError, ValueError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    ctx.barrier()  # nothing above sent a message: the ranks are still in step
    return errors


def test_bad_calls_raise_clear_errors_locally_without_sending() -> None:
    errors = ddtk.launch(_bad_calls, 2, timeout=60)[0]
    assert errors["avg_int"].startswith("TypeError: ReduceOp.AVERAGE needs a floating-point tensor")
    assert "unknown all_reduce algorithm 'butterfly'" in errors["bad_algo"]
    assert "unknown reduce op 'median'" in errors["bad_op"]
    assert errors["not_tensor"] == "TypeError: all_reduce expects a torch.Tensor, got list"
    assert "root must be a rank in [0, 2), got 2" in errors["bad_root"]
    assert "cannot send to or receive from itself" in errors["self_send"]
    assert "tag must be an int" in errors["bad_tag"]
    assert "needs 2 chunks" in errors["scatter_count"]
    assert "at least one dimension" in errors["rs_scalar"]
    assert "only applies to algorithm='hierarchical'" in errors["group_size"]


def _stats(ctx, numel):
    ctx.stats.reset()
    ctx.all_reduce(torch.ones(numel), algorithm="ring")
    after_ring = ctx.stats.as_dict()
    ctx.stats.reset()
    ctx.all_reduce(torch.ones(numel), algorithm="naive")
    return after_ring, ctx.stats.as_dict()


def test_stats_count_the_bytes_the_cost_model_predicts() -> None:
    n, numel = 4, 1000  # 4000 bytes, divisible by n
    for ring, naive in ddtk.launch(_stats, n, args=(numel,), validate=False, timeout=60):
        # ring: every rank sends 2(n-1) chunks of numel/n elements
        assert ring["bytes_sent"] == ring["bytes_received"] == 2 * (n - 1) * numel // n * 4
        entry = ring["per_collective"]["all_reduce[ring]"]
        assert entry["calls"] == 1 and entry["seconds"] > 0 and entry["bytes_sent"] == ring["bytes_sent"]
        assert naive["per_collective"]["all_reduce[naive]"]["calls"] == 1
    root_naive = ddtk.launch(_stats, n, args=(numel,), validate=False, timeout=60)[0][1]
    assert root_naive["bytes_sent"] == root_naive["bytes_received"] == (n - 1) * numel * 4


def test_from_env_without_a_launcher_explains_what_to_do() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    code = "from ddtk import DistributedContext as D\ntry:\n    D.from_env()\nexcept RuntimeError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "Start the script with torchrun" in out.stdout, out.stderr


def test_from_env_under_torchrun(tmp_path) -> None:
    """The same ddtk code runs under torchrun, as on a real cluster."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from ddtk import DistributedContext
        ctx = DistributedContext.from_env()
        out = ctx.all_reduce(torch.full((4,), float(ctx.rank + 1)), algorithm="recursive_doubling")
        print(f"rank {ctx.rank}/{ctx.world_size} {ctx.backend} sum={out.tolist()}")
    """))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nnodes=1", "--nproc-per-node=3", str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    for r in range(3):
        assert f"rank {r}/3 gloo sum=[6.0, 6.0, 6.0, 6.0]" in out.stdout
