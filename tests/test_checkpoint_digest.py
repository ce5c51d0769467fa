"""sha256 of checkpoint files: whole and chunked digests against hashlib, the chunked manifest
entry, corruption located to its chunk, format 1 still read, and verification that runs beside
the read without ever restoring unverified bytes."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from ddtk.checkpoint import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    capture,
    load,
    save,
)
from ddtk.checkpoint import store as store_module
from ddtk.checkpoint.atomic import atomic_write
from ddtk.checkpoint.digest import file_digest
from ddtk.checkpoint.manifest import read_manifest, verify
from ddtk.checkpoint.store import STATE_FILE

CHUNK = 4096


def _reference_chunks(data: bytes, chunk: int) -> list[str]:
    """hashlib, one chunk at a time: what a chunked digest must equal."""
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [b""]
    return [hashlib.sha256(p).hexdigest() for p in pieces]


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK, 5 * CHUNK + 17])
def test_file_digest_matches_hashlib_whole_and_chunked(tmp_path: Path, size: int) -> None:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    whole = file_digest(path)
    assert (whole.size, whole.sha256, whole.chunks) == (size, hashlib.sha256(data).hexdigest(), ())
    chunked = file_digest(path, CHUNK)
    if size <= CHUNK:  # one chunk: the plain sha256, which is the same digest
        assert chunked == whole
    else:
        assert chunked.size == size and chunked.sha256 is None and chunked.chunk_bytes == CHUNK
        assert list(chunked.chunks) == _reference_chunks(data, CHUNK)


@pytest.mark.parametrize("chunk", [0, CHUNK, 3 * CHUNK + 1])
def test_atomic_write_records_the_digest_of_uneven_writes(tmp_path: Path, chunk: int) -> None:
    """Writes of every size, across chunk ends: hashed while written, or per chunk afterwards."""
    rng = random.Random(chunk)
    buffers = [rng.randbytes(n) for n in (0, 1, 4095, 3 * CHUNK + 3, 7, 2 * CHUNK, 100)]

    def write(f) -> None:
        for b in buffers:
            assert f.write(memoryview(b)) == len(b)

    info = atomic_write(tmp_path / "f.bin", write, chunk_bytes=chunk)
    data = b"".join(buffers)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert info == file_digest(tmp_path / "f.bin", chunk) and info.size == len(data)
    if chunk:
        assert info.sha256 is None and list(info.chunks) == _reference_chunks(data, chunk)
    else:
        assert info.sha256 == hashlib.sha256(data).hexdigest()


def test_a_small_state_file_keeps_one_plain_sha256(tmp_path: Path) -> None:
    """Below one chunk the entry is what ``sha256sum`` prints, as in format 1."""
    path = save(tmp_path, capture(nn.Linear(4, 4), step=1), 1)
    entry = read_manifest(path)["files"][STATE_FILE]
    assert entry == {"size": entry["size"],
                     "sha256": hashlib.sha256((path / STATE_FILE).read_bytes()).hexdigest()}  # fmt: skip


def _saved(tmp_path: Path, monkeypatch, chunk: int = CHUNK) -> tuple[nn.Module, Path]:
    monkeypatch.setattr(store_module, "CHUNK_BYTES", chunk)
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    return model, save(tmp_path / "run", capture(model, step=1), 1)


def test_the_state_file_is_recorded_in_chunks(tmp_path: Path, monkeypatch) -> None:
    _model, path = _saved(tmp_path, monkeypatch)
    entry = read_manifest(path)["files"][STATE_FILE]
    data = (path / STATE_FILE).read_bytes()
    assert "sha256" not in entry  # no whole-file digest that sha256sum would be compared with
    assert entry["size"] == len(data) and entry["chunk_bytes"] == CHUNK
    assert entry["sha256_chunks"] == _reference_chunks(data, CHUNK)
    assert len(entry["sha256_chunks"]) > 3
    assert read_manifest(path)["format"] == 2
    assert verify(path) == []


def test_a_flipped_byte_is_located_to_its_chunk(tmp_path: Path, monkeypatch) -> None:
    model, path = _saved(tmp_path, monkeypatch)
    before = model.weight.detach().clone()
    state = path / STATE_FILE
    data = bytearray(state.read_bytes())
    at = 2 * CHUNK + 5  # inside the third chunk, bytes 8-12 KiB
    data[at] ^= 0xFF
    state.write_bytes(bytes(data))
    mib = CHUNK / (1 << 20)
    assert verify(path) == [
        f"{STATE_FILE}: sha256 differs from the manifest in 1 of {len(data) // CHUNK + 1} chunks "
        f"(bytes {2 * mib:g}-{3 * mib:g} MiB; the file is corrupt)"
    ]
    with torch.no_grad():
        model.weight.add_(1.0)
    changed = model.weight.detach().clone()
    with pytest.raises(CorruptCheckpointError, match=r"1 of .* chunks"):
        load(path, model)
    assert torch.equal(model.weight, changed) and not torch.equal(changed, before)


def test_a_damaged_file_that_does_not_parse_is_reported_as_corrupt(tmp_path, monkeypatch) -> None:
    """The read runs beside the verification; its parse error must not hide the real cause."""
    model, path = _saved(tmp_path, monkeypatch)
    state = path / STATE_FILE
    data = bytearray(state.read_bytes())
    data[:64] = bytes(64)  # the zip header: torch.load fails on it
    state.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="sha256 differs"):
        load(path, model)


def test_malformed_chunk_entries_are_problems_not_crashes(tmp_path, monkeypatch) -> None:
    _model, path = _saved(tmp_path, monkeypatch)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    entry = manifest["files"][STATE_FILE]
    for bad, why in (({"chunk_bytes": 0}, "malformed"), ({"sha256_chunks": "x"}, "malformed"),
                     ({"sha256_chunks": entry["sha256_chunks"][:-1]}, "the manifest lists")):  # fmt: skip
        (path / MANIFEST_NAME).write_text(json.dumps({**manifest, "files": {
            **manifest["files"], STATE_FILE: {**entry, **bad}}}))  # fmt: skip
        problems = verify(path)
        assert len(problems) == 1 and why in problems[0], problems


def test_format_1_manifests_with_whole_file_digests_still_load(tmp_path, monkeypatch) -> None:
    model, path = _saved(tmp_path, monkeypatch)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    digest = hashlib.sha256((path / STATE_FILE).read_bytes()).hexdigest()
    manifest["format"] = 1
    manifest["files"][STATE_FILE] = {
        "size": manifest["files"][STATE_FILE]["size"],
        "sha256": digest,
    }
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert load(path, nn.Linear(64, 64)).step == 1
    manifest["format"] = 3
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="has format 3; this ddtk reads formats 1, 2"):
        load(path, model)


def test_capture_without_copy_shares_the_live_tensors(tmp_path: Path) -> None:
    model = nn.Linear(8, 8)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    live = capture(model, opt, step=1, copy=False).tensors
    copied = capture(model, opt, step=1).tensors
    w = model.weight
    assert live["model"]["weight"].data_ptr() == w.data_ptr()
    assert copied["model"]["weight"].data_ptr() != w.data_ptr()
    moment = opt.state_dict()["state"][0]["exp_avg"]
    assert live["optimizer"]["state"][0]["exp_avg"].data_ptr() == moment.data_ptr()
    assert copied["optimizer"]["state"][0]["exp_avg"].data_ptr() != moment.data_ptr()
    path = save(tmp_path, capture(model, opt, step=1, copy=False), 1)
    restored = nn.Linear(8, 8)
    load(path, restored)
    assert torch.equal(restored.weight, w) and os.path.isdir(path)


def test_a_background_writer_hashes_with_one_thread(tmp_path: Path, monkeypatch) -> None:
    """The async writer leaves the other cores to training; a synchronous save uses them."""
    from ddtk.checkpoint import digest
    from ddtk.checkpoint.background import AsyncCheckpointer

    seen: list[int] = []
    real = digest.hash_threads

    def spy() -> int:
        seen.append(real())
        return seen[-1]

    monkeypatch.setattr(digest, "hash_threads", spy)
    monkeypatch.setattr(store_module, "CHUNK_BYTES", CHUNK)
    model = nn.Linear(64, 64)
    with AsyncCheckpointer(tmp_path / "async") as ckpt:
        ckpt.save(capture(model, step=1), 1)
    assert seen and set(seen) == {1}
    cores = real()
    with digest.limit_hash_threads(3):
        assert real() == min(3, cores)
    assert real() == cores
    seen.clear()
    save(tmp_path / "sync", capture(model, step=1), 1)
    assert seen and set(seen) == {real()}
