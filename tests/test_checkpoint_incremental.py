"""Incremental checkpoints: unchanged tensors are not rewritten, loading is bitwise and
verified, a corrupt blob is named and skipped, and garbage collection keeps referenced blobs."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ddtk.checkpoint import (
    MANIFEST_NAME,
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    capture,
    checkpoint_dirs,
    load,
    save,
    step_dir,
)
from ddtk.checkpoint.background import AsyncCheckpointer
from ddtk.checkpoint.incremental import (
    BLOB_DIR,
    apply_incremental_retention,
    collect_garbage,
    load_incremental,
    referenced_blobs,
    save_incremental,
    save_stats,
    tensor_digest,
)
from ddtk.faults.injectors import corrupt_file


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 8, (8,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _blob_files(run) -> set[str]:
    return {p.name for p in (run / BLOB_DIR).iterdir()}


def _expected_blob_bytes(tensors) -> int:
    """Bytes of torch.save of each tensor, computed independently of the code under test."""
    import io

    total = 0
    for t in tensors:
        buf = io.BytesIO()
        torch.save(t.detach().clone(), buf)
        total += buf.getbuffer().nbytes
    return total


def test_digest_depends_on_bytes_dtype_and_shape() -> None:
    a = torch.arange(6, dtype=torch.float32)
    assert tensor_digest(a) == tensor_digest(a.clone())
    assert tensor_digest(a) != tensor_digest(a.reshape(2, 3))
    assert tensor_digest(a.view(torch.int32)) != tensor_digest(a)
    b = a.clone()
    b[3] = -1
    assert tensor_digest(a) != tensor_digest(b)


def test_unchanged_state_writes_no_blobs_and_one_change_writes_one(tmp_path) -> None:
    model = _model()
    first = save_incremental(tmp_path, capture(model, step=1, rng=False), 1, inline_bytes=0)
    stats1 = save_stats(first)
    params = list(model.state_dict().values())
    assert stats1["blobs_written"] == len(params) == 4
    assert stats1["blob_bytes_written"] == _expected_blob_bytes(params)
    assert stats1["tensor_bytes"] == sum(t.nbytes for t in params)
    blobs_after_first = _blob_files(tmp_path)

    second = save_incremental(tmp_path, capture(model, step=2, rng=False), 2, inline_bytes=0)
    stats2 = save_stats(second)
    assert stats2["blobs_written"] == 0 and stats2["blob_bytes_written"] == 0
    assert stats2["blobs_reused"] == 4
    assert _blob_files(tmp_path) == blobs_after_first
    # the bytes written are the index and meta.json only
    files = json.loads((second / MANIFEST_NAME).read_text())["files"]
    assert stats2["bytes_written"] == sum(f["size"] for f in files.values())

    with torch.no_grad():
        model[2].weight.mul_(2.0)
    third = save_incremental(tmp_path, capture(model, step=3, rng=False), 3, inline_bytes=0)
    stats3 = save_stats(third)
    assert stats3["blobs_written"] == 1 and stats3["blobs_reused"] == 3
    assert stats3["blob_bytes_written"] == _expected_blob_bytes([model[2].weight])
    new = _blob_files(tmp_path) - blobs_after_first
    assert new == {f"{tensor_digest(model[2].weight)}.pt"}


def test_load_assembles_bitwise_and_resumes_training_exactly(tmp_path) -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    _train(model, opt, 3)
    save_incremental(tmp_path, capture(model, opt, step=3), 3)
    _train(model, opt, 2)
    path = save_incremental(tmp_path, capture(model, opt, step=5), 5, inline_bytes=0)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    # a full checkpoint of the same state, the independent reference
    save(tmp_path / "full", capture(model, opt, step=5), 5)
    _train(model, opt, 2, seed=7)
    expected_after = {k: v.clone() for k, v in model.state_dict().items()}

    fresh = _model(seed=99)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    ckpt = load_incremental(tmp_path, fresh, fresh_opt)
    assert ckpt.path == path and ckpt.step == 5
    for k, v in reference.items():
        assert torch.equal(fresh.state_dict()[k], v), k
    full = load(tmp_path / "full").state.tensors
    for i, st in full["optimizer"]["state"].items():
        for key, value in st.items():
            assert torch.equal(ckpt.state.tensors["optimizer"]["state"][i][key], value), (i, key)
    assert ckpt.state.tensors["optimizer"]["param_groups"] == full["optimizer"]["param_groups"]
    # Adam's per-parameter step counters must not share storage after assembly
    steps = [st["step"] for st in fresh_opt.state_dict()["state"].values()]
    assert len({s.data_ptr() for s in steps}) == len(steps)
    _train(fresh, fresh_opt, 2, seed=7)
    for k, v in expected_after.items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0)


def test_corrupt_blob_is_named_and_run_dir_falls_back(tmp_path) -> None:
    model = _model()
    save_incremental(tmp_path, capture(model, step=1, rng=False), 1)
    good_weight = model[2].weight.detach().clone()
    with torch.no_grad():
        model[2].weight.add_(1.0)
    second = save_incremental(tmp_path, capture(model, step=2, rng=False), 2)
    bad = tmp_path / BLOB_DIR / f"{tensor_digest(model[2].weight)}.pt"
    corrupt_file(bad, offset=bad.stat().st_size // 2, nbytes=4)
    with pytest.raises(CorruptCheckpointError, match=f"{BLOB_DIR}/{bad.name}: sha256 differs"):
        load_incremental(second)
    fresh = _model(seed=5)
    with pytest.warns(RuntimeWarning, match=f"step-000002.*{bad.name}"):
        ckpt = load_incremental(tmp_path, fresh, rng=False)
    assert ckpt.step == 1 and torch.equal(fresh[2].weight, good_weight)
    # a later save does not reuse the corrupt blob: it is rewritten
    with torch.no_grad():
        model[2].weight.copy_(good_weight + 1.0)
    third = save_incremental(tmp_path, capture(model, step=3, rng=False), 3)
    assert save_stats(third)["blobs_written"] == 1
    assert load_incremental(third).step == 3
    bad.unlink()
    with pytest.raises(CorruptCheckpointError, match="missing"):
        load_incremental(third)


def test_retention_and_gc_keep_referenced_blobs(tmp_path) -> None:
    model = _model()
    digests = {}
    for step in (1, 2, 3, 4):
        with torch.no_grad():
            model[2].weight.add_(1.0)  # changes every step; layer 0 never changes
        digests[step] = tensor_digest(model[2].weight)
        save_incremental(tmp_path, capture(model, step=step, rng=False), step, keep_last=2)
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [3, 4]
    blobs = _blob_files(tmp_path)
    assert f"{tensor_digest(model[0].weight)}.pt" in blobs  # written at step 1, still used
    assert f"{digests[3]}.pt" in blobs and f"{digests[4]}.pt" in blobs
    assert f"{digests[1]}.pt" not in blobs and f"{digests[2]}.pt" not in blobs
    assert {b.removesuffix(".pt") for b in blobs} == referenced_blobs(tmp_path)
    for step in (3, 4):
        assert load_incremental(step_dir(tmp_path, step)).step == step
    # an orphan (e.g. from a killed writer) is collected; referenced blobs stay
    orphan = tmp_path / BLOB_DIR / ("0" * 64 + ".pt")
    orphan.write_bytes(b"x")
    planned = apply_incremental_retention(tmp_path, keep_last=1, dry_run=True)
    assert set(planned) == {step_dir(tmp_path, 3), orphan, tmp_path / BLOB_DIR / f"{digests[3]}.pt"}
    assert step_dir(tmp_path, 3).is_dir() and orphan.exists()  # a dry run removes nothing
    assert collect_garbage(tmp_path) == [orphan]
    removed = apply_incremental_retention(tmp_path, keep_last=1)
    assert step_dir(tmp_path, 3) in removed
    assert tmp_path / BLOB_DIR / f"{digests[3]}.pt" in removed
    assert load_incremental(tmp_path).step == 4


def test_async_checkpointer_writes_incremental(tmp_path) -> None:
    model = _model()
    with AsyncCheckpointer(tmp_path, writer=save_incremental) as ckpt:
        ckpt.save(capture(model, step=1, rng=False), 1)
        ckpt.save(capture(model, step=2, rng=False), 2)
        path = ckpt.wait()
    assert save_stats(path)["blobs_written"] == 0
    fresh = _model(seed=3)
    load_incremental(tmp_path, fresh, rng=False)
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_bad_input(tmp_path) -> None:
    model = _model()
    with pytest.raises(TypeError, match="CheckpointState"):
        save_incremental(tmp_path, model.state_dict(), 1)
    with pytest.raises(ValueError, match="step"):
        save_incremental(tmp_path, capture(model, step=1), -2)
    with pytest.raises(ValueError, match="check_reused"):
        save_incremental(tmp_path, capture(model, step=1), 1, check_reused="md5")
    with pytest.raises(CheckpointNotFoundError):
        load_incremental(tmp_path / "nowhere")
    save(tmp_path / "full", capture(model, step=1), 1)
    with pytest.raises(CheckpointError, match="'full' checkpoint, not an incremental one"):
        load_incremental(step_dir(tmp_path / "full", 1))


def test_plain_load_and_latest_understand_incremental_checkpoints(tmp_path) -> None:
    """``ddtk.checkpoint.load``/``latest`` read incremental runs and check their blobs."""
    from ddtk.checkpoint import latest, problems

    model = _model()
    save_incremental(tmp_path, capture(model, step=1, rng=False), 1)
    with torch.no_grad():
        model[2].weight.add_(1.0)
    save_incremental(tmp_path, capture(model, step=2, rng=False), 2)
    fresh = _model(seed=7)
    assert load(tmp_path, fresh, rng=False).step == 2
    assert torch.equal(fresh[2].weight, model[2].weight)
    # a blob only step 2 uses goes bad: its own files still verify, the blob does not
    bad = tmp_path / BLOB_DIR / f"{tensor_digest(model[2].weight)}.pt"
    corrupt_file(bad, offset=0, nbytes=4)
    assert any(bad.name in p for p in problems(step_dir(tmp_path, 2)))
    assert problems(step_dir(tmp_path, 1)) == []
    assert latest(tmp_path) == step_dir(tmp_path, 1)
    with pytest.warns(RuntimeWarning, match=bad.name):
        assert load(tmp_path).step == 1
    with pytest.raises(CorruptCheckpointError, match=bad.name):
        load(step_dir(tmp_path, 2))
