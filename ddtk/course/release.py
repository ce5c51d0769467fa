"""``ddtk course release OUT``: the kit as a class receives it, with nothing an answer lives in.

A release is the learner's tree: the lectures (each exercise's answer collapsed below
the learner's cell, as lectures always ship), the labs as stubs, the quiz without its
key, the project's brief and starter, ``deploy/``, ``docs/``, ``resources/``, the ``ddtk``
package and what installs it (``Makefile``, ``pyproject.toml``, ``requirements.lock``,
``environment.yml``, ``scripts/``), and a README for learners. It holds no
``solutions/`` (lab solutions, the quiz key, the project reference, the mutants) and no
``tests/``.

The labs' judges (``ddtk/course/judges/labNN.py``) are the hidden tests of the labs:
they compute what a correct answer produces with the instructor's own code, so a
release replaces each with a module whose ``judge(n, globals())`` says that the grader
checks the exercise when the instructor grades. The labs' own check cells (the public
checks) stay and run as before.

The release is written into a new folder beside ``OUT`` and renamed into place once
complete and checked: :func:`ddtk.course.leaks.find_leaks` must find no secret of the
kit in it, or nothing is published. With ``git=True`` it is also a git repository with
one commit, ready to push as the class repository.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ddtk.course.leaks import Leak, find_leaks

SHIPPED = ("course", "labs", "quizzes", "project", "deploy", "docs", "resources", "ddtk",
           "scripts", "Makefile", "pyproject.toml", "requirements.lock", "environment.yml",
           ".gitignore", ".gitattributes")  # fmt: skip
"""What a release takes from the kit (tracked files only); everything else stays."""
_NEVER = ("__pycache__", ".ipynb_checkpoints", ".egg-info")
_REPORTS = ("-report.md", "-report.json", ".answers.yaml")  # what a learner's own run writes
WITHHELD_JUDGE = '''"""The judge of {lab}: withheld from this class release.

The grader checks each exercise again, with code and inputs of its own, when your
instructor grades the notebook. The check cells of the notebook run as they are.
"""

from __future__ import annotations

from typing import Any

JUDGE = None


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Say that exercise ``number`` is checked again by the grader (no judge here)."""
    print(f"Exercise {{number}}: the grader checks it again when your instructor grades "
          "the notebook (its checks are not part of this class release)")
'''


class ReleaseError(ValueError):
    """The release cannot be made as asked (OUT in the way, a leak, not a kit)."""


@dataclass(frozen=True)
class Release:
    """What :func:`make_release` wrote: the folder, its files, and withheld judges."""

    out: Path
    files: tuple[str, ...]
    withheld: tuple[str, ...]
    git: bool


def kit_files(root: Path) -> list[str]:
    """The kit's files a release may take: tracked by git when ``root`` is a checkout,
    else every file; within :data:`SHIPPED`, never caches nor a learner's own reports."""
    try:
        listed = (
            subprocess.run(
                ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True
            )
            .stdout.decode()
            .split("\0")
        )
        files = [f for f in listed if f and (root / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]

    def shipped(rel: str) -> bool:
        top = rel.split("/")[0]
        return (
            top in SHIPPED
            and not any(part in rel for part in _NEVER)
            and not rel.endswith((".pyc", *_REPORTS))
        )

    return sorted(f for f in files if shipped(f))


def _withheld(rel: str) -> bool:
    name = Path(rel).name
    return rel.startswith("ddtk/course/judges/") and name.startswith("lab") and name.endswith(".py")


def _reference_pages(root: Path) -> list[str]:
    """The README's lines for ``resources/``: each page with its own title, lecture pages first."""
    pages = sorted((root / "resources").glob("*.md"), key=lambda p: (not p.name[0].isdigit(), p.name))
    if not pages:
        return []
    lines = ["## Reference", "",
             "The pages of `resources/` that the lectures send you to:", ""]  # fmt: skip
    for page in pages:
        first = page.read_text(encoding="utf-8").splitlines()[:1]
        title = first[0].lstrip("# ").strip() if first else page.stem
        lines.append(f"- [{title}](resources/{page.name})")
    return [*lines, ""]


def learner_readme(root: Path) -> str:
    """The release's README: how to start, and the course in the order to take it."""
    from ddtk.course import catalog

    steps = []
    for e in catalog.in_course_order():
        path = e.path.replace("solutions/", "labs/") if e.kind == "lab" else e.path
        if (root / path).is_file() or (root / e.path).is_file():
            steps.append(f"| {len(steps) + 1} | {e.title} | `{path}` |")
    steps.append(f"| {len(steps) + 1} | The final project | `project/README.md` |")
    return "\n".join(
        [
            "# Distributed Training at Scale",
            "",
            "The class edition of the course kit: seven lectures, four labs, a quiz and a final",
            "project, all runnable on a laptop without a GPU (real processes, real collectives).",
            "",
            "## Start",
            "",
            "```bash",
            "make lab      # creates .venv (locked versions) and opens JupyterLab on lecture 01",
            "ddtk doctor   # what this machine can run (inside .venv: .venv/bin/ddtk doctor)",
            "```",
            "",
            "You need Python 3.11 or newer, a C++17 compiler and `make`; `make horovod` builds",
            "Horovod for the labs that use it. Each lecture exercise has its answer collapsed",
            "below your cell: open it once you have tried.",
            "",
            "## The course, in order",
            "",
            "| step | what | where |",
            "|---|---|---|",
            *steps,
            "",
            *_reference_pages(root),
            "## Handing in",
            "",
            "Each lab's check cells tell you at once whether an exercise does what it should;",
            "your instructor's grader checks every exercise again, on inputs of its own, when it",
            "grades the notebook. Hand in the notebook (and the `labNN-report.md` and",
            "`labNN-report.json` it writes) as your instructor says. The quiz writes your answers",
            "file from its form (`quizzes/module-quiz.ipynb`).",
            "",
        ]
    )


def _copy(root: Path, files: Iterable[str], stage: Path) -> tuple[list[str], list[str]]:
    written, withheld = [], []
    for rel in files:
        target = stage / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if _withheld(rel):
            target.write_text(WITHHELD_JUDGE.format(lab=Path(rel).stem), encoding="utf-8")
            withheld.append(rel)
        else:
            shutil.copy2(root / rel, target)
        written.append(rel)
    (stage / "README.md").write_text(learner_readme(root), encoding="utf-8")
    return [*written, "README.md"], withheld


def _git_init(stage: Path) -> None:
    env = {"GIT_AUTHOR_NAME": "ddtk", "GIT_AUTHOR_EMAIL": "ddtk@localhost",
           "GIT_COMMITTER_NAME": "ddtk", "GIT_COMMITTER_EMAIL": "ddtk@localhost"}  # fmt: skip
    import os

    run = {"cwd": stage, "check": True, "capture_output": True, "env": {**os.environ, **env}}
    subprocess.run(["git", "init", "-q", "-b", "main"], **run)
    subprocess.run(["git", "add", "-A"], **run)
    subprocess.run(["git", "commit", "-q", "-m", "Class release of the course kit"], **run)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} exists and is not an empty folder: choose a new OUT "
                           "(a release never writes over anything)")  # fmt: skip


def make_release(root: Path, out: Path, *, git: bool = False) -> Release:
    """Write the class release of the kit at ``root`` as ``out`` (new or empty).

    Raises :class:`ReleaseError` when ``root`` is not a full kit (no ``solutions/``,
    so nothing to prove absent), ``out`` is in the way, or the release would hold a
    secret (then nothing is written)."""
    root, out = root.resolve(), out.resolve()
    if not (root / "solutions").is_dir() or not (root / "labs").is_dir():
        raise ReleaseError(f"{root} is not the full course kit (it needs labs/ and solutions/)")
    if out == root or root in out.parents:
        raise ReleaseError(f"{out} is inside the kit: write the release outside {root}")
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        written, withheld = _copy(root, kit_files(root), stage)
        leaks = find_leaks(root, stage)
        if leaks:
            raise ReleaseError(_leak_message(leaks))
        if git:
            _git_init(stage)
        stage.chmod(0o755)
        if out.exists():
            out.rmdir()  # empty, checked above
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return Release(out, tuple(written), tuple(withheld), git)


def _leak_message(leaks: list[Leak]) -> str:
    """One line per file: how many secrets of which kinds, and the first of them."""
    by_file: dict[str, list[Leak]] = {}
    for leak in leaks:
        by_file.setdefault(leak.path, []).append(leak)
    lines = [
        f"  {path}: {len(found)} line(s) of the "
        f"{' and '.join(sorted({f.kind for f in found}))}, e.g. {found[0].line[:80]!r}"
        for path, found in sorted(by_file.items())
    ]
    return (
        f"the release would hold {len(leaks)} secret(s) of the kit in {len(by_file)} file(s); "
        "nothing written:\n" + "\n".join(lines)
    )


__all__ = ["SHIPPED", "Release", "ReleaseError", "kit_files", "learner_readme", "make_release"]
