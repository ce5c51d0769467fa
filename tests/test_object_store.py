"""ddtk.checkpoint.object_store against a real S3 API (moto's server on 127.0.0.1).

Start, use, stop: a checkpoint without its manifest does not count, a large upload is
invisible until completed, a "move" is a copy plus a delete, and after ``stop`` no
process is left (the ``no_leftover_processes`` fixture) and the port is closed.
"""

from __future__ import annotations

import socket

import pytest
from support import require_or_skip

from ddtk.checkpoint.object_store import LocalS3, committed_checkpoints, put_checkpoint


@pytest.fixture
def s3():
    pytest.importorskip("pyarrow.fs")
    try:
        import moto  # noqa: F401
    except ModuleNotFoundError:
        require_or_skip(
            "moto", "moto is not installed: pip install 'moto[server]' (the course extra)"
        )
    with LocalS3() as server:
        yield server
    with socket.socket() as probe:  # stopped: nothing listens on its port any more
        assert probe.connect_ex(("127.0.0.1", server.port)) != 0


def test_only_checkpoints_with_their_manifest_count(s3: LocalS3) -> None:
    import pyarrow.fs as pafs

    fs = s3.filesystem()
    fs.create_dir("ckpt")
    put_checkpoint(fs, "ckpt/run/step-000010", {"shard-0.pt": b"a" * 100, "shard-1.pt": b"b" * 50})
    with fs.open_output_stream("ckpt/run/step-000020/shard-0.pt") as out:  # died before the rest
        out.write(b"c" * 100)
    assert [c["step_dir"] for c in committed_checkpoints(fs, "ckpt/run")] == [
        "ckpt/run/step-000010"
    ]
    assert committed_checkpoints(fs, "ckpt/none") == []
    with pytest.raises(ValueError, match="written by put_checkpoint itself"):
        put_checkpoint(fs, "ckpt/run/step-000030", {"manifest.json": b"{}"})
    # a multipart upload is not visible before it completes
    stream = fs.open_output_stream("ckpt/big.bin")
    stream.write(b"x" * (12 << 20))
    assert fs.get_file_info("ckpt/big.bin").type == pafs.FileType.NotFound
    stream.close()
    assert fs.get_file_info("ckpt/big.bin").size == 12 << 20
    # a move is a server-side copy (PUT to the new key) and a DELETE of the old one
    mark = s3.mark()
    fs.move("ckpt/big.bin", "ckpt/moved.bin")
    calls = [c.rsplit(" ", 1)[0] for c in s3.requests(mark)]
    assert "PUT /ckpt/moved.bin" in calls and "DELETE /ckpt/big.bin" in calls, calls
    assert calls.index("PUT /ckpt/moved.bin") < calls.index("DELETE /ckpt/big.bin")
    assert s3.uri("ckpt/ray").startswith("s3://testing:testing@ckpt/ray?scheme=http")


def test_a_stopped_server_says_so() -> None:
    server = LocalS3()
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.endpoint
    server.stop()  # stopping what never started is fine
