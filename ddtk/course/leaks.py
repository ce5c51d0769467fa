"""What must never reach learners, and a search of a tree for any of it.

The secrets of the kit are

- the **lab solutions**: every line inside a ``# BEGIN SOLUTION`` ... ``# END SOLUTION``
  block (and the markdown ``<!-- BEGIN SOLUTION -->`` blocks) of ``solutions/lab*.ipynb``;
- the **quiz key**: the feedback that explains each answer, the code question's reference
  solution and its instructor tests (``solutions/quiz/*.key.json``), and, structurally,
  any ``answer``, ``solution``, ``tests`` or ``feedback`` field in a quiz file;
- the **project reference**: ``solutions/project/`` (its code, design document, numbers).

A secret line is *distinctive* when it is long enough to be specific (at least
:data:`MIN_CHARS` characters once stripped), is not an import, and does not also appear
in what ``ddtk`` generates for learners from it (the lab's stub, the public quiz, which
``ddtk course check`` and ``ddtk quiz build`` keep in step): a stub's signature line is
no secret. Some lines of a solution are also
taught elsewhere on purpose (lecture 02 and ``ddtk/examples/ray_digits.py`` show the
Ray Train loop lab 01 asks for); those are listed, line by line, in
``solutions/release-allowed.json``, reviewed by the instructor, so that any *other*
copy of a solution line into the kit is found. :func:`find_leaks` compares stripped
lines as substrings, so a solution line copied anywhere, at any indentation, inside a
longer line, in any text file or notebook cell of the tree, is found.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MIN_CHARS = 24
_BEGIN = re.compile(r"^\s*(# BEGIN SOLUTION\b.*|<!--\s*BEGIN SOLUTION\s*-->)\s*$")
_END = re.compile(r"^\s*(# END SOLUTION|<!--\s*END SOLUTION\s*-->)\s*$")
_QUIZ_SECRET_FIELDS = frozenset({"answer", "solution", "tests", "feedback"})
SECRET_PATHS = ("solutions", "solutions/quiz", "solutions/project", "solutions/mutants")


@dataclass(frozen=True)
class Leak:
    """A secret found in the tree: which file, what kind of secret, and the line."""

    path: str
    kind: str  # "lab solution", "quiz key", "project reference", "secret file", "quiz field"
    line: str

    def __str__(self) -> str:
        return f"{self.path}: {self.kind}: {self.line[:100]}"


def _cell_sources(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        out.append(src if isinstance(src, str) else "".join(src))
    return out


ALLOWED = "solutions/release-allowed.json"
_IMPORT = re.compile(r"^(import \S|from \S+ import )")


def _distinctive(lines: Iterable[str], public: str) -> set[str]:
    """The lines worth looking for: long, not imports, nowhere in the ``public`` text
    (read without markdown's backticks, so code quoted in prose counts as shown)."""
    public = public + "\n" + public.replace("`", "")
    return {
        s for s in (x.strip() for x in lines)
        if len(s) >= MIN_CHARS and s not in public and not _IMPORT.match(s)
    }  # fmt: skip


def allowed_lines(kit: Path) -> set[str]:
    """The solution lines the kit also teaches on purpose (``solutions/release-allowed.json``)."""
    path = kit / ALLOWED
    if not path.is_file():
        return set()
    return {line.strip() for line in json.loads(path.read_text(encoding="utf-8"))["lines"]}


def _block_lines(source: str) -> list[str]:
    inside, out = False, []
    for line in source.splitlines():
        if _BEGIN.match(line):
            inside = True
        elif _END.match(line):
            inside = False
        elif inside:
            out.append(line)
    return out


def lab_secrets(root: Path) -> set[str]:
    """The distinctive lines of every solution block of ``root``'s labs."""
    secrets: set[str] = set()
    for solution in sorted((root / "solutions").glob("lab*.ipynb")):
        stub = root / "labs" / solution.name
        public = _file_text(stub) if stub.is_file() else ""
        blocks = [line for src in _cell_sources(solution) for line in _block_lines(src)]
        secrets |= _distinctive(blocks, public)
    return secrets


def quiz_secrets(root: Path) -> set[str]:
    """The distinctive lines of the quiz keys: feedback, reference solutions, tests (less
    what the public quiz shows, such as the code question's starter)."""
    public = "\n".join(_file_text(p) for p in _files(root / "quizzes")
                       if p.suffix in (".yaml", ".yml", ".md"))  # fmt: skip
    secrets: set[str] = set()
    for key in sorted((root / "solutions" / "quiz").glob("*.key.json")):
        for q in json.loads(key.read_text(encoding="utf-8")).get("questions", []):
            texts = [str(v) for v in (q.get("feedback") or {}).values()]
            texts += [str(q.get(k, "")) for k in ("solution", "tests")]
            secrets |= _distinctive((ln for t in texts for ln in t.splitlines()), public)
    return secrets


def project_secrets(root: Path) -> set[str]:
    """The distinctive lines of the project's reference. What its starter shares with it
    is not taken from the starter (which nothing generates, so a reference line copied
    there would vouch for itself) but listed in ``solutions/release-allowed.json``."""
    texts = [
        p.read_text(encoding="utf-8", errors="replace")
        for p in _files(root / "solutions" / "project")
    ]
    return _distinctive((ln for t in texts for ln in t.splitlines()), "")


def _files(folder: Path) -> Iterator[Path]:
    if folder.is_dir():
        yield from (p for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink())


_TAG = re.compile(r"<[^>]+>")


def _file_text(path: Path) -> str:
    """The file's text; a notebook's cell sources as written (not JSON-escaped); a web
    page's text without its tags (highlighted code keeps its spacing between them)."""
    import html

    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".ipynb":
            return text + "\n" + "\n".join(_cell_sources(path))
        if path.suffix in (".html", ".htm"):
            return html.unescape(_TAG.sub("", text))
        return text
    except (UnicodeDecodeError, json.JSONDecodeError):
        return ""  # a binary file (an image): no text to copy a line into


def lecture_answer_secrets(root: Path) -> set[str]:
    """The distinctive lines of the lectures' collapsed answers (which a lecture notebook
    ships, but the course site must not show), less what the lecture shows elsewhere."""
    from ddtk.course.answers import answer_code, is_answer_cell

    secrets: set[str] = set()
    for path in sorted((root / "course").rglob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        shown = "\n".join(
            "".join(c["source"]) if isinstance(c.get("source"), list) else c.get("source", "")
            for c in cells if not is_answer_cell(c)
        )  # fmt: skip
        answers = [ln for c in cells if is_answer_cell(c) for ln in answer_code(c).splitlines()]
        secrets |= _distinctive(answers, shown)
    return secrets


def _quiz_fields(path: Path, rel: str) -> list[Leak]:
    """A quiz file (YAML or JSON) whose questions carry an answer, solution, tests or feedback."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return []
    questions = data.get("questions", []) if isinstance(data, dict) else []
    return [
        Leak(rel, "quiz field", f"question {q.get('id')!r} has {field!r}")
        for q in questions
        if isinstance(q, dict)
        for field in sorted(_QUIZ_SECRET_FIELDS & set(q))
    ]


def find_leaks(kit: Path, tree: Path, *, lecture_answers: bool = False) -> list[Leak]:
    """Every secret of the kit at ``kit`` that the tree at ``tree`` holds, file by file;
    ``lecture_answers``: the lectures' collapsed answers count as secrets too (a site)."""
    allowed = allowed_lines(kit)
    kinds = {
        "lab solution": lab_secrets(kit) - allowed,
        "quiz key": quiz_secrets(kit) - allowed,
        "project reference": project_secrets(kit) - allowed,
    }
    if lecture_answers:
        kinds["lecture answer"] = lecture_answer_secrets(kit) - allowed
    leaks: list[Leak] = []
    for path in _files(tree):
        rel = path.relative_to(tree).as_posix()
        if rel.split("/")[0] == "solutions" or rel.endswith(".key.json"):
            leaks.append(Leak(rel, "secret file", "a file the release must never hold"))
            continue
        text = _file_text(path)  # a secret line inside a longer one counts too
        for kind, secrets in kinds.items():
            leaks += [Leak(rel, kind, s) for s in sorted(secrets) if s in text]
        if rel.startswith("quizzes/") and path.suffix in (".yaml", ".yml", ".json"):
            leaks += _quiz_fields(path, rel)
    return leaks


__all__ = [
    "ALLOWED", "MIN_CHARS", "Leak", "allowed_lines", "find_leaks", "lab_secrets",
    "lecture_answer_secrets", "project_secrets", "quiz_secrets",
]  # fmt: skip
