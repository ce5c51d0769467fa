"""Sharded checkpoints: per-rank shards, commit by rank 0, resharding to other world sizes,
ZeRO and data-parallel helpers, crashes, failed writes, corrupt and missing shards."""

from __future__ import annotations

import errno
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import ddtk
from ddtk.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    CorruptCheckpointError,
    ResumableSampler,
    checkpoint_dirs,
    latest,
    load,
    read_manifest,
)
from ddtk.checkpoint.sharded import (
    ShardedState,
    ShardedTensor,
    ShardWriteError,
    dp_state,
    load_dp,
    load_sharded,
    load_zero,
    save_sharded,
    zero_state,
)
from ddtk.faults import corrupt_file, crash_during
from ddtk.parallel.zero import ZeroOptimizer

pytestmark = pytest.mark.distributed

TIMEOUT = 120


class _Solo:
    """A one-rank context for single-process loads and argument checks (no collectives needed)."""

    rank, world_size = 0, 1

    def barrier(self) -> None:
        pass

    def flush(self) -> None:
        pass


def _full() -> dict[str, torch.Tensor]:
    """The global tensors every test saves: non-divisible, tiny (numel < world), empty, float64."""
    return {
        "w": torch.arange(10, dtype=torch.float32) * 1.5,
        "tiny": torch.tensor([7, 9], dtype=torch.int64),
        "empty": torch.zeros(0),
        "big": torch.randn(37, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
    }


def _expected_range(numel: int, world: int, rank: int) -> tuple[int, int]:
    """Contiguous chunks of ceil(numel / world) elements, written out independently here."""
    chunk = -(-numel // world)
    return min(rank * chunk, numel), min(rank * chunk + chunk, numel)


def _piece(ctx, full: torch.Tensor) -> ShardedTensor:
    lo, hi = _expected_range(full.numel(), ctx.world_size, ctx.rank)
    return ShardedTensor(full[lo:hi].clone(), lo, full.numel())


def _save_run(ctx, run: str) -> dict:
    """Save steps 1, 2, 3 with keep_last=2, then reload at the same world size."""
    for step in (1, 2, 3):
        state = ShardedState(
            flat={k: _piece(ctx, v * step) for k, v in _full().items()},
            replicated={"sched": {"last_epoch": step, "lrs": [0.1]}, "count": torch.tensor(step)},
            per_rank={"tag": torch.full((2,), 10 * ctx.rank + step)},
            meta={"note": "hello"},
        )
        path = save_sharded(ctx, run, state, step, epoch=0, keep_last=2)
    ckpt = load_sharded(ctx, run)
    return {
        "path": path.name,
        "flat": {k: (t.local, t.offset, t.numel) for k, t in ckpt.flat.items()},
        "replicated": ckpt.replicated,
        "per_rank": ckpt.per_rank,
        "notes": ckpt.notes,
        "meta": ckpt.meta,
        "step": ckpt.step,
    }


def _load_run(ctx, run: str) -> dict:
    ckpt = load_sharded(ctx, run)
    whole = load_sharded(ctx, run, ranges="full")
    return {
        "flat": {k: (t.local, t.offset) for k, t in ckpt.flat.items()},
        "full": {k: t.local for k, t in whole.flat.items()},
        "per_rank": ckpt.per_rank,
        "notes": ckpt.notes,
        "replicated": ckpt.replicated,
    }


def _run(fn, world: int, *args) -> list:
    """``fn`` on ``world`` ranks; a one-rank load runs right here (it needs no messages)."""
    if world == 1:
        return [fn(_Solo(), *args)]
    return ddtk.launch(fn, world, args=args, timeout=TIMEOUT, echo=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple[Path, list[dict]]]:
    """One run directory per world size 1..4, saved (and reloaded) by that many ranks."""
    out = {}
    for world in (1, 2, 3, 4):
        run = tmp_path_factory.mktemp(f"world{world}")
        out[world] = (run, ddtk.launch(_save_run, world, args=(str(run),), timeout=TIMEOUT))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_same_world_reload_is_bitwise_equal(runs, world):
    run, results = runs[world]
    for rank, res in enumerate(results):
        assert res["path"] == "step-000003" and res["step"] == 3
        for name, full in _full().items():
            local, offset, numel = res["flat"][name]
            lo, hi = _expected_range(full.numel(), world, rank)
            assert (offset, numel) == (lo, full.numel())
            assert local.dtype == full.dtype
            assert torch.equal(local, (full * 3)[lo:hi])
        assert res["replicated"]["sched"] == {"last_epoch": 3, "lrs": [0.1]}
        assert torch.equal(res["replicated"]["count"], torch.tensor(3))
        assert torch.equal(res["per_rank"]["tag"], torch.full((2,), 10 * rank + 3))
        assert res["notes"] == []
        assert res["meta"]["note"] == "hello" and res["meta"]["step"] == 3
    # retention and latest() work from the manifest alone
    assert [p.name for _s, p in checkpoint_dirs(run)] == ["step-000002", "step-000003"]
    assert latest(run).name == "step-000003"
    manifest = read_manifest(run / "step-000003")
    assert manifest["kind"] == "sharded" and manifest["world_size"] == world
    assert sorted(manifest["files"]) == [f"shard-{r:05d}-of-{world:05d}.pt" for r in range(world)]
    # the single-process loader says how to read it instead of failing obscurely
    with pytest.raises(
        CheckpointError, match=r"sharded checkpoint written by \d+ ranks: .*load_sharded"
    ):
        load(run)


@pytest.mark.parametrize(("saved", "loaded"), [(4, 2), (2, 3), (3, 1)])
def test_reshard_on_load(runs, saved, loaded):
    run, _ = runs[saved]
    results = _run(_load_run, loaded, str(run))
    for rank, res in enumerate(results):
        for name, full in _full().items():
            lo, hi = _expected_range(full.numel(), loaded, rank)
            local, offset = res["flat"][name]
            assert offset == lo
            assert torch.equal(local, (full * 3)[lo:hi])
            assert torch.equal(res["full"][name], full * 3)
        assert res["per_rank"] is None
        assert len(res["notes"]) == 1 and "not restored" in res["notes"][0]
        assert res["replicated"]["sched"]["last_epoch"] == 3


# ------------------------------------------------------------------ ZeRO


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(5, 3)  # 18 parameters: 5, 5, 5, 3 on 4 ranks; 9, 9 on 2


def _train(ctx, model, opt, steps: int) -> None:
    x, y = _data()
    lo, hi = _expected_range(8, ctx.world_size, ctx.rank)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step()


def _gathered(ctx, opt) -> dict[str, torch.Tensor]:
    """Full parameters and Adam moments, gathered with all_gather (independent of sharded.py)."""
    st = opt.optimizer.state[opt.shard]
    out = {"params": opt.flat[: opt.numel].clone()}
    for key in ("exp_avg", "exp_avg_sq"):
        out[key] = torch.cat(ctx.all_gather(st[key].detach()))[: opt.numel]
    out["step"] = st["step"].clone()
    return out


def _zero_save(ctx, run: str) -> dict:
    model = _model(0)
    opt = ZeroOptimizer(ctx, model, torch.optim.Adam, stage=2, lr=0.05)
    _train(ctx, model, opt, 3)
    save_sharded(ctx, run, zero_state(opt), 3)
    return _gathered(ctx, opt)


def _zero_resume(ctx, run: str) -> dict:
    wrong = ZeroOptimizer(ctx, torch.nn.Linear(6, 3), torch.optim.Adam, stage=1, lr=0.05)
    try:
        load_zero(ctx, run, wrong)
        mismatch = None
    except CheckpointMismatchError as exc:
        mismatch = str(exc)
    model = _model(123)  # different weights: they must all come from the checkpoint
    # saved with stage 2 on 4 ranks, resumed with stage 1 on 2: only the layout changes
    opt = ZeroOptimizer(ctx, model, torch.optim.Adam, stage=1, lr=0.05)
    ckpt = load_zero(ctx, run, opt)
    loaded = _gathered(ctx, opt)
    _train(ctx, model, opt, 3)
    final = opt.flat[: opt.numel].clone()
    return {"loaded": loaded, "final": final, "notes": ckpt.notes, "mismatch": mismatch}


@pytest.mark.slow
def test_zero_4_to_2_resume_matches_uninterrupted_training(tmp_path):
    saved = ddtk.launch(_zero_save, 4, args=(str(tmp_path),), timeout=TIMEOUT, echo=False)[0]
    resumed = ddtk.launch(_zero_resume, 2, args=(str(tmp_path),), timeout=TIMEOUT, echo=False)
    for res in resumed:
        for key in ("params", "exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(res["loaded"][key], saved[key]), key
        assert res["notes"]  # RNG states saved by 4 ranks are not restored on 2
        assert "parameter 0: checkpoint (3, 5) vs model (3, 6)" in res["mismatch"]
    # single-process reference: the same 6 Adam steps on the full batch
    model = _model(0)
    ref = torch.optim.Adam(model.parameters(), lr=0.05)
    x, y = _data()
    for _ in range(6):
        ref.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        ref.step()
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    # not bitwise: averaging the ranks' gradients sums in another order at 4, 2 and 1 ranks
    torch.testing.assert_close(resumed[0]["final"], expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(resumed[0]["final"], resumed[1]["final"])


# ------------------------------------------------------------------ plain data parallel


def _dp_objects(seed: int, features: int = 4):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(features, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _dp_save(ctx, run: str) -> dict:
    model, opt, sched = _dp_objects(0)
    sampler = ResumableSampler(10, seed=2)
    for _ in range(3):
        sampler.next_batch(3)
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        sched.step()
    save_sharded(ctx, run, dp_state(ctx, model, opt, sched, sampler), 3)
    return {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}


def _dp_load(ctx, run: str) -> dict:
    model, opt, sched = _dp_objects(7)
    sampler = ResumableSampler(10, seed=2)
    ckpt = load_dp(ctx, run, model, opt, sched, sampler)
    wrong, _, _ = _dp_objects(7, features=6)
    try:
        load_dp(ctx, run, wrong)
        mismatch = None
    except CheckpointMismatchError as exc:
        mismatch = str(exc)
    return {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        "sampler": sampler.state_dict(),
        "mismatch": mismatch,
        "files": sorted(ckpt.manifest["files"]),
    }


@pytest.mark.parametrize("loaded_world", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_dp_3_to_n_reassembles_model_optimizer_scheduler_sampler(tmp_path, loaded_world):
    saved = ddtk.launch(_dp_save, 3, args=(str(tmp_path),), timeout=TIMEOUT, echo=False)[0]
    loaded = _run(_dp_load, loaded_world, str(tmp_path))
    for res in loaded:
        assert res["files"] == [f"shard-0000{r}-of-00003.pt" for r in range(3)]
        assert res["model"].keys() == saved["model"].keys()
        for key, value in saved["model"].items():
            assert torch.equal(res["model"][key], value), key
        for i, st in saved["opt"]["state"].items():
            assert torch.equal(res["opt"]["state"][i]["momentum_buffer"], st["momentum_buffer"])
        assert res["opt"]["param_groups"] == saved["opt"]["param_groups"]
        assert res["sched"] == saved["sched"]
        assert res["sampler"]["epoch"] == 0 and res["sampler"]["position"] == 9
        assert "0.weight" in res["mismatch"] and "(3, 4)" in res["mismatch"]
        assert "(3, 6)" in res["mismatch"]


# ------------------------------------------------------------------ faults


def _two_steps_then_crash(ctx, run: str) -> None:
    for step in (1, 2):
        state = ShardedState(flat={"w": _piece(ctx, _full()["w"] * step)})
        save_sharded(ctx, run, state, step)
    state = ShardedState(flat={"w": _piece(ctx, _full()["w"] * 3)})
    if ctx.rank == 0:
        # rank 0's first os.replace puts its shard in place, the second would commit
        with crash_during("os.replace", after_calls=2):
            save_sharded(ctx, run, state, 3)
    else:
        save_sharded(ctx, run, state, 3)


def _load_step(ctx, run: str) -> tuple[int, bool]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = load_sharded(ctx, run).step
    return step, any("shard-00001-of-00002.pt" in str(w.message) for w in caught)


def test_crash_before_commit_is_ignored_and_bad_shards_fall_back(tmp_path):
    with pytest.raises(ddtk.RankError):
        ddtk.launch(
            _two_steps_then_crash,
            2,
            args=(str(tmp_path),),
            timeout=TIMEOUT,
            echo=False,
            op_timeout=20,
        )
    partial = tmp_path / "step-000003"
    assert partial.is_dir() and not (partial / "manifest.json").exists()
    assert (partial / "shard-00000-of-00002.pt").is_file()  # killed after its shard, at the commit
    assert (partial / "shard-00001-of-00002.pt").is_file()
    assert latest(tmp_path).name == "step-000002"
    with pytest.warns(RuntimeWarning, match="step-000003: manifest.json is missing"):
        assert load_sharded(_Solo(), tmp_path).step == 2
    shutil.rmtree(partial)
    # a corrupt shard in the newest checkpoint: fall back with a warning naming the file
    corrupt_file(tmp_path / "step-000002" / "shard-00001-of-00002.pt", nbytes=4)
    with pytest.warns(RuntimeWarning, match=r"shard-00001-of-00002\.pt: sha256 differs"):
        ckpt = load_sharded(_Solo(), tmp_path)
    assert ckpt.step == 1
    assert torch.equal(ckpt.flat["w"].local, _full()["w"])
    # on 2 ranks only rank 1 hashes that file; both must still fall back to the same step
    steps = ddtk.launch(_load_step, 2, args=(str(tmp_path),), timeout=TIMEOUT, echo=False)
    assert steps == [(1, True), (1, True)]
    # a missing shard in an explicit checkpoint: an error naming it
    (tmp_path / "step-000001" / "shard-00000-of-00002.pt").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"shard-00000-of-00002\.pt: missing"):
        load_sharded(_Solo(), tmp_path / "step-000001")


def _failing_write(ctx, run: str) -> str:
    state = ShardedState(flat={"w": _piece(ctx, _full()["w"])})
    save_sharded(ctx, run, state, 1)
    state = ShardedState(flat={"w": _piece(ctx, _full()["w"] * 2)})
    try:
        if ctx.rank == 1:
            disk_full = OSError(errno.ENOSPC, "No space left on device")
            with crash_during("os.replace", after_calls=1, exc=disk_full):
                save_sharded(ctx, run, state, 2)
        else:
            save_sharded(ctx, run, state, 2)
    except ShardWriteError as exc:
        return str(exc)
    return "no error"


def test_failed_shard_write_commits_nothing_and_every_rank_raises(tmp_path):
    messages = ddtk.launch(
        _failing_write, 3, args=(str(tmp_path),), timeout=TIMEOUT, echo=False, op_timeout=30
    )
    for msg in messages:
        assert "rank 1 could not write shard-00001-of-00003.pt" in msg
        assert "No space left on device" in msg and "nothing was committed" in msg
    assert [p.name for _s, p in checkpoint_dirs(tmp_path)] == ["step-000001"]
    assert latest(tmp_path).name == "step-000001"


def test_bad_arguments_and_layouts_are_reported(tmp_path):
    solo = _Solo()
    with pytest.raises(TypeError, match="ShardedState"):
        save_sharded(solo, tmp_path, {"w": torch.ones(2)}, 1)
    with pytest.raises(ValueError, match="step"):
        save_sharded(solo, tmp_path, ShardedState(), -1)
    with pytest.raises(ValueError, match="does not fit"):
        ShardedTensor(torch.ones(3), 2, 4)
    gap = ShardedState(flat={"w": ShardedTensor(torch.ones(3), 0, 5)})
    with pytest.raises(ShardWriteError, match="cover 3 of 5"):
        save_sharded(solo, tmp_path, gap, 1)
    assert checkpoint_dirs(tmp_path) == []
    save_sharded(solo, tmp_path, ShardedState(flat={"w": ShardedTensor(torch.ones(2), 0, 2)}), 1)
    with pytest.raises(Exception, match="already exists"):
        save_sharded(solo, tmp_path, ShardedState(), 1)
    shutil.rmtree(tmp_path / "step-000001")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ddtk.checkpoint.CheckpointNotFoundError):
            load_sharded(solo, tmp_path)


def test_only_the_overlapping_shard_files_are_read(runs, monkeypatch):
    from ddtk.checkpoint import sharded_load as sharded

    opened = []
    real = sharded._torch_load

    def spy(path):
        opened.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(sharded, "_torch_load", spy)
    run, _ = runs[4]  # w has 10 elements in pieces [0, 3) [3, 6) [6, 9) [9, 10)
    ckpt = load_sharded(_Solo(), run, ranges=lambda name, numel: (min(4, numel), min(5, numel)))
    assert torch.equal(ckpt.flat["w"].local, _full()["w"][4:5] * 3)
    # rank 1's file for the elements, rank 0's for the replicated entries; no other
    assert sorted(opened) == ["shard-00000-of-00004.pt", "shard-00001-of-00004.pt"]
    with pytest.raises(ValueError, match="outside"):
        load_sharded(_Solo(), run, ranges={"w": (5, 11)})
