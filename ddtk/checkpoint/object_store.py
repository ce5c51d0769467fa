"""Checkpoints on an object store (S3): no rename, so the manifest written last is the commit.

An object store keeps whole objects: a reader sees a PUT's object complete or not
at all, and S3 has been strongly consistent for PUTs, overwrites, deletes and lists
since December 2020. What it lacks is ``rename``: pyarrow's, fsspec's and boto3's
"move" is a server-side copy followed by a delete, per object, so
"write under a temporary name, then rename" commits nothing atomically. The commit
is instead the *last object written*: every shard first, then a manifest with
their sizes and sha256 (:func:`put_checkpoint`); a reader takes only prefixes whose
manifest exists and matches (:func:`committed_checkpoints`). That is
:mod:`ddtk.checkpoint.manifest`'s protocol, DCP's ``.metadata`` written last, and
Ray Train's checkpoints registered after their upload.

:class:`LocalS3` runs a real S3 API on this machine for demos and tests: moto's
server (``pip install 'moto[server]'``) on a free port of 127.0.0.1, in a process of
its own, with the requests it serves recorded (:meth:`LocalS3.requests`), so a
notebook can show which HTTP calls a "move" or a large upload really makes.

The protocol needs nothing but a pyarrow filesystem, so it runs unchanged on a local
directory (here), on :class:`LocalS3`'s ``filesystem()``, or on a bucket:

>>> import tempfile, pyarrow.fs as pafs
>>> fs = pafs.SubTreeFileSystem(tempfile.mkdtemp(), pafs.LocalFileSystem())
>>> _ = put_checkpoint(fs, "run/step-000010", {"state.pt": b"weights"})
>>> fs.create_dir("run/step-000020")
>>> with fs.open_output_stream("run/step-000020/state.pt") as f:  # an upload that died
...     _ = f.write(b"half of it")
>>> [c["step_dir"] for c in committed_checkpoints(fs, "run")]
['run/step-000010']
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["MANIFEST", "LocalS3", "committed_checkpoints", "put_checkpoint"]

MANIFEST = "manifest.json"
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+ \S+) HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)*" (\d{3})')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalS3:
    """moto's S3 server on 127.0.0.1 for the length of a ``with`` block (or start/stop).

    Raises ModuleNotFoundError naming the package when moto is not installed, and
    RuntimeError with the server's output when it does not answer within
    ``start_timeout`` seconds. :meth:`stop` terminates the process (SIGKILL after 5 s).
    """

    access_key = secret_key = "testing"  # moto accepts any credentials
    region = "us-east-1"

    def __init__(self, start_timeout: float = 30.0):
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._log: list[str] = []

    @property
    def endpoint(self) -> str:
        """``host:port`` of the server (pyarrow's ``endpoint_override``)."""
        if self.port is None:
            raise RuntimeError("LocalS3 is not started")
        return f"127.0.0.1:{self.port}"

    def start(self) -> LocalS3:
        """Start the server and wait until it answers; returns ``self``."""
        import importlib.util

        if importlib.util.find_spec("moto") is None:
            raise ModuleNotFoundError("LocalS3 needs moto's server: pip install 'moto[server]'")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        threading.Thread(target=self._read_log, name="ddtk-local-s3", daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"moto's S3 server did not answer on {self.endpoint} within "
                    f"{self.start_timeout:g} s: {' | '.join(self._log[-5:]) or 'no output'}"
                )
            time.sleep(0.05)
        return self

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.append(line.rstrip())

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/moto-api/", timeout=0.5):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the server process; safe to call twice."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` talking to this server (buckets may be created)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            endpoint_override=self.endpoint, scheme="http", region=self.region,
            access_key=self.access_key, secret_key=self.secret_key, allow_bucket_creation=True,
        )  # fmt: skip

    def uri(self, path: str) -> str:
        """``s3://...`` for ``path`` (``bucket/prefix``) with this server's endpoint and
        credentials in it: what ``RunConfig(storage_path=...)`` and
        ``pyarrow.fs.FileSystem.from_uri`` accept."""
        return (f"s3://{self.access_key}:{self.secret_key}@{path.strip('/')}?scheme=http"
                f"&endpoint_override={self.endpoint}&region={self.region}")  # fmt: skip

    def mark(self) -> int:
        """A position in the request log, for :meth:`requests`."""
        return len(self._log)

    def requests(self, since: int = 0, settle: float = 0.1) -> list[str]:
        """``"METHOD /bucket/key?query status"`` of each request served after ``since``."""
        time.sleep(settle)  # the server logs a request after answering it
        out = []
        for line in self._log[since:]:
            m = _REQUEST.search(line)
            if m:
                out.append(f"{m.group(1)} {m.group(2)}")
        return out


def put_checkpoint(fs: Any, step_dir: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    """Upload ``files`` (name -> bytes) under ``step_dir``, then the manifest: the commit.

    Each object is one PUT (or one completed multipart upload), so it appears whole;
    the manifest, with every object's size and sha256, is written only after the
    others exist. Returns the manifest. ``create_dir`` first: a file system needs the
    directory, and on S3 it is an empty marker object that commits nothing.
    """
    if MANIFEST in files:
        raise ValueError(f"{MANIFEST} is written by put_checkpoint itself, last")
    fs.create_dir(step_dir, recursive=True)
    entries = {}
    for name, data in files.items():
        with fs.open_output_stream(f"{step_dir}/{name}") as out:
            out.write(data)
        entries[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"files": entries, "time": time.time()}
    with fs.open_output_stream(f"{step_dir}/{MANIFEST}") as out:
        out.write(json.dumps(manifest, sort_keys=True).encode())
    return manifest


def committed_checkpoints(fs: Any, prefix: str) -> list[dict[str, Any]]:
    """The checkpoints under ``prefix`` whose manifest exists and whose objects have the
    listed sizes (a listing is strongly consistent on S3), oldest name first."""
    import pyarrow.fs as pafs

    found = []
    for info in fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True)):
        if info.type != pafs.FileType.Directory:
            continue
        marker = fs.get_file_info(f"{info.path}/{MANIFEST}")
        if marker.type != pafs.FileType.File:
            continue  # never committed: an upload that died, or one still going on
        with fs.open_input_stream(marker.path) as f:
            manifest = json.loads(f.read())
        sizes = {n: fs.get_file_info(f"{info.path}/{n}").size for n in manifest["files"]}
        if all(sizes[n] == e["size"] for n, e in manifest["files"].items()):
            found.append({"step_dir": info.path, **manifest})
    return sorted(found, key=lambda c: c["step_dir"])
