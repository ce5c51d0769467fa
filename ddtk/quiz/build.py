"""``ddtk quiz build``: from one validated source, write the three files a quiz needs.

- the public quiz (YAML): metadata, prompts, choices, numeric tolerances, code
  starters; no answers, solutions, tests or feedback;
- the self-check file (JSON): salted hashes of the answers (:mod:`ddtk.quiz.selfcheck`);
- the private key (JSON): the full validated source, which the grader reads.

Output is deterministic (fixed salt, stable key order), so a test can check that the
built files are up to date with the source. Every file is written atomically.

>>> import tempfile, pathlib
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> _ = (tmp / "demo.source.yaml").write_text('''
... quiz: {id: demo, version: 1, pass_mark: 80%}
... questions:
...   - {id: q1, type: single, prompt: "Pick", answer: b,
...      choices: [{id: a, text: A}, {id: b, text: B}]}
... ''')
>>> result = build(tmp / "demo.source.yaml", tmp / "public", tmp / "key.json")
>>> result.public.name, result.selfcheck.name, "answer" in result.public.read_text()
('demo.yaml', 'demo.selfcheck.json', False)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddtk.quiz.model import Problem, Quiz, QuizSourceError
from ddtk.quiz.selfcheck import make_selfcheck
from ddtk.quiz.source import load_source, quiz_to_dict


@dataclass(frozen=True)
class BuildResult:
    """Paths of the files written by :func:`build`."""

    public: Path
    selfcheck: Path
    key: Path


def quiz_stem(source_path: str | Path) -> str:
    """``module-quiz.source.yaml`` -> ``module-quiz``."""
    name = Path(source_path).name
    for suffix in (".yaml", ".yml", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.removesuffix(".source")


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as ``|`` blocks so prompts and code stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = (
        "|"
        if "\n" in value and not any(c in value for c in "\t\r") and value == value.rstrip(" ")
        else None
    )
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def public_text(quiz: Quiz) -> str:
    """The public quiz as YAML text."""
    header = f"# Public quiz file for {quiz.id} v{quiz.version}: built by `ddtk quiz build`; do not edit.\n"
    body = yaml.dump(
        quiz_to_dict(quiz, private=False),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    return header + body


def _json_text(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def build_texts(quiz: Quiz) -> dict[str, str]:
    """The three files' contents: ``{"public": ..., "selfcheck": ..., "key": ...}``."""
    return {
        "public": public_text(quiz),
        "selfcheck": _json_text(make_selfcheck(quiz)),
        "key": _json_text(quiz_to_dict(quiz, private=True)),
    }


def build(
    source_path: str | Path,
    out_dir: str | Path,
    key_path: str | Path,
    *,
    check_code: bool = False,
) -> BuildResult:
    """Validate ``source_path`` and write ``out_dir/<stem>.yaml``,
    ``out_dir/<stem>.selfcheck.json`` and ``key_path``.

    With ``check_code``, every code question's reference solution must pass all of
    its instructor tests first (QuizSourceError otherwise).
    """
    from ddtk.quiz.files import write_text

    quiz = load_source(source_path)
    if check_code:
        problems = solution_problems(quiz)
        if problems:
            raise QuizSourceError(problems, str(source_path))
    out_dir, stem = Path(out_dir), quiz_stem(source_path)
    texts = build_texts(quiz)
    result = BuildResult(
        out_dir / f"{stem}.yaml", out_dir / f"{stem}.selfcheck.json", Path(key_path)
    )
    for path, text in (
        (result.public, texts["public"]),
        (result.selfcheck, texts["selfcheck"]),
        (result.key, texts["key"]),
    ):
        write_text(path, text)
    return result


def solution_problems(quiz: Quiz) -> list[Problem]:
    """Problems with code questions whose reference solution fails its own tests."""
    from ddtk.quiz.codecheck import check_solutions

    problems = []
    for qid, res in check_solutions(quiz.questions).items():
        if res.total == 0:
            problems.append(
                Problem(
                    "has no checks (assert statements or test_ functions)",
                    qid,
                    "tests",
                    quiz.question(qid).line,
                )
            )
        elif res.passed != res.total:
            note = f": {res.note}" if res.note else ""
            problems.append(
                Problem(
                    f"the solution passes only {res.passed} of {res.total} checks{note}",
                    qid,
                    "solution",
                    quiz.question(qid).line,
                )
            )
    return problems
