"""Atomic text writes for every file the quiz tools produce.

A reader (a grader, a notebook, a test checking built files) never sees half a file:
text goes to a temporary file in the same folder that is renamed into place. Built
files and answers files are also synced to disk (``durable=True``); outputs that can be
regenerated (per-student results) skip the sync, which keeps writing a class's results
fast. Missing parent folders are created. This module imports nothing heavy (the
checkpoint package pulls in torch), so ``ddtk quiz`` starts quickly.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "sub" / "a.txt"
>>> write_text(path, "hello\\n")
>>> path.read_text()
'hello\\n'
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_text(path: str | Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; raise OSError naming the file."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            f.write(text.encode("utf-8"))
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise OSError(f"could not write {path}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
