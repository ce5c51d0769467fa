"""``ddtk course collect``: every learner's lab notebook and hand-in, into one folder to grade.

On a JupyterHub each learner's copy of the class release lives in their home (where
nbgitpuller put it): ``/home/<user>/<repo>/labs/lab01-ray-train.ipynb``. A glob such as
``'/home/*/dtas-2027'`` names those copies; the part the first wildcard matched is the
student (``<user>``). Each student's notebook and the hand-in report it wrote
(``labNN-report.md``, ``labNN-report.json``) are copied to ``OUT/<student>/``, the layout
``ddtk course grade`` reads. A lecture's exercises are collected the same way, from
``course/`` (``ddtk course collect '/home/*/dtas-2027' 01``), with no hand-in report.

A learner controls their home, so only regular files are copied, never a link (a link
to a classmate's notebook would hand in the classmate's work), and never more than
:data:`MAX_BYTES` a file. ``OUT`` must be new or empty: collecting never overwrites.
"""

from __future__ import annotations

import glob
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_BYTES = 50 << 20
_WILD = set("*?[")


class CollectError(ValueError):
    """The pattern, the lab or OUT cannot be used."""


@dataclass
class Collected:
    """Who handed in what, who handed in nothing, and what was refused (and why)."""

    handed_in: dict[str, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def _student_index(pattern: str) -> int:
    parts = Path(pattern).parts
    for i, part in enumerate(parts):
        if _WILD & set(part):
            return i
    raise CollectError(f"the pattern {pattern!r} has no wildcard to tell the students apart")


def _regular(path: Path) -> str | None:
    """Why ``path`` cannot be collected, or None when it is a plain file of a sane size."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a link or a device): not collected"
    if info.st_size > MAX_BYTES:
        return f"{info.st_size} bytes, over the {MAX_BYTES} allowed"
    return None


def collect(pattern: str, notebook: str, out: Path, folder: str = "labs") -> Collected:
    """Copy ``<folder>/<notebook>`` (and a lab's ``labNN-report.*``) of every copy
    ``pattern`` matches into ``out/<student>/``; ``folder``: ``labs`` for a lab, ``course``
    for a lecture whose exercises are graded."""
    index = _student_index(pattern)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CollectError(f"{out} exists and is not an empty folder: choose a new OUT")
    word = notebook.split("-")[0]
    names = [notebook, *((f"{word}-report.md", f"{word}-report.json") if folder == "labs" else ())]
    result = Collected()
    for match in sorted(glob.glob(pattern)):
        copy = Path(match)
        if copy.is_symlink() or not copy.is_dir():
            continue
        student = copy.parts[index]
        if (copy / folder).is_symlink():
            result.refused[f"{student}/{folder}"] = (
                "a link, not the release's folder: not collected"
            )
            result.missing.append(student)
            continue
        got = []
        for name in names:
            source = copy / folder / name
            why = _regular(source)
            if why == "missing":
                continue
            if why is not None:
                result.refused[f"{student}/{name}"] = why
                continue
            (out / student).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, out / student / name, follow_symlinks=False)
            got.append(name)
        if notebook in got:
            result.handed_in[student] = got
        else:
            result.missing.append(student)
            shutil.rmtree(out / student, ignore_errors=True)  # a report without a notebook
    return result


__all__ = ["MAX_BYTES", "CollectError", "Collected", "collect"]
