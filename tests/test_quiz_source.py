"""Quiz sources: validation with question id, field and line; build outputs; self-check."""

from __future__ import annotations

import json
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from ddtk.quiz import (
    Answers,
    QuizSourceError,
    build,
    load_key,
    load_public,
    load_source,
    load_source_text,
    self_check,
)
from ddtk.quiz.build import build_texts
from ddtk.quiz.source import parse_pass_mark

SAMPLE = Path(__file__).parent / "fixtures" / "quiz" / "sample.source.yaml"

HEAD = """\
quiz: {id: demo, version: 1, title: Demo, pass_mark: 80%}
questions:
"""

SINGLE = """\
  - id: q1
    type: single
    prompt: Pick one
    choices:
      - {id: a, text: A}
      - {id: b, text: B}
    answer: b
"""


def _error(body: str) -> QuizSourceError:
    with pytest.raises(QuizSourceError) as info:
        load_source_text(HEAD + textwrap.dedent(body))
    return info.value


def test_sample_source_loads_with_exact_values() -> None:
    quiz = load_source(SAMPLE)
    assert (quiz.id, quiz.version, quiz.pass_mark) == ("sample-quiz", 2, Fraction(4, 5))
    assert quiz.ids == (
        "pick-dp",
        "nccl-facts",
        "ring-bytes",
        "efficiency",
        "loss-scaling",
        "write-ring-bytes",
    )
    assert quiz.question("ring-bytes").answer == Fraction(7, 4)
    assert quiz.question("ring-bytes").atol == Fraction(1, 100)
    assert quiz.question("efficiency").rtol == Fraction(1, 50)
    assert quiz.question("nccl-facts").answer == ("a", "c")
    assert quiz.max_score == 10
    assert quiz.question("pick-dp").line == 7


def test_duplicate_id_names_question_field_and_both_lines() -> None:
    err = _error(SINGLE + SINGLE)
    assert (err.question, err.field, err.line) == ("q1", "id", 10)
    assert "first on line 3" in str(err)


def test_answer_not_among_choices() -> None:
    err = _error(SINGLE.replace("answer: b", "answer: z"))
    assert (err.question, err.field, err.line) == ("q1", "answer", 9)
    assert "'z' is not among the choices" in str(err)


def test_negative_tolerance_and_unknown_type_are_all_reported() -> None:
    body = """\
      - id: n1
        type: numeric
        prompt: How many?
        answer: 3
        rtol: -0.1
      - id: t1
        type: essay
        prompt: Discuss
    """
    err = _error(body)
    found = {(p.question, p.field, p.line) for p in err.problems}
    assert found == {("n1", "rtol", 7), ("t1", "type", 9)}
    assert "unknown type 'essay'" in str(err)


def test_multi_answer_outside_choices_and_unknown_field() -> None:
    body = """\
      - id: m1
        type: multi
        prompt: Pick
        choices: [{id: a, text: A}, {id: b, text: B}]
        answer: [a, q]
        tolerance: 3
    """
    err = _error(body)
    found = {(p.question, p.field, p.line) for p in err.problems}
    assert found == {("m1", "answer", 7), ("m1", "tolerance", 8)}


def test_code_question_needs_valid_python_and_function() -> None:
    body = """\
      - id: c1
        type: code
        prompt: Write it
        solution: |
          def f(x):
              return x +
        tests: "assert f(1) == 2"
    """
    err = _error(body)
    found = {(p.question, p.field) for p in err.problems}
    assert found == {("c1", "function"), ("c1", "solution")}
    assert next(p for p in err.problems if p.field == "solution").line == 8


def test_yaml_syntax_error_and_duplicate_key_have_lines() -> None:
    with pytest.raises(QuizSourceError) as info:
        load_source_text(HEAD + "  - id: q1\n    type: [single\n")
    assert info.value.line is not None and "invalid YAML" in str(info.value)
    with pytest.raises(QuizSourceError) as info:
        load_source_text(HEAD + SINGLE + "    answer: a\n")
    assert info.value.line == 10 and "duplicate key 'answer'" in str(info.value)


def test_quiz_metadata_errors() -> None:
    text = "quiz: {id: Bad_Id, version: 0, pass_mark: 1.5}\nquestions: []\n"
    with pytest.raises(QuizSourceError) as info:
        load_source_text(text)
    fields = {p.field for p in info.value.problems}
    assert fields == {"quiz.id", "quiz.version", "quiz.pass_mark", "questions"}


@pytest.mark.parametrize("value", ["4/5", 0.8, "80%", " 80 % ".strip()])
def test_pass_mark_forms(value: object) -> None:
    assert parse_pass_mark(value) == Fraction(4, 5)


def test_build_writes_public_without_secrets_and_key_round_trips(tmp_path: Path) -> None:
    res = build(SAMPLE, tmp_path / "pub", tmp_path / "key" / "k.json", check_code=True)
    public_text = res.public.read_text()
    source = load_source(SAMPLE)
    secrets = ("answer:", "solution:", "feedback:", "tests:", "2 * (p - 1)", "dynamic loss scaling")
    for secret in secrets:
        assert secret not in public_text, secret
    public = load_public(res.public)
    assert public.ids == source.ids
    assert public.question("ring-bytes").atol == Fraction(1, 100)
    assert public.question("write-ring-bytes").starter.startswith("def ring_bytes")
    assert all(q.answer is None for q in public.questions)
    key = load_key(res.key)
    assert key == source.__class__(**{**source.__dict__, "questions": key.questions})
    assert [(q.id, q.answer, q.points, q.tests) for q in key.questions] == [
        (q.id, q.answer, q.points, q.tests) for q in source.questions
    ]
    assert json.loads(res.selfcheck.read_text())["quiz"] == "sample-quiz"
    # Deterministic: a rebuild gives identical bytes.
    assert build_texts(source)["selfcheck"] == res.selfcheck.read_text()
    assert build_texts(source)["public"] == public_text


def test_public_file_refuses_answers(tmp_path: Path) -> None:
    path = tmp_path / "public.yaml"
    path.write_text(HEAD + SINGLE)
    with pytest.raises(QuizSourceError) as info:
        load_public(path)
    assert (info.value.question, info.value.field, info.value.line) == ("q1", "answer", 9)


def test_build_refuses_a_solution_that_fails_its_tests(tmp_path: Path) -> None:
    data = yaml.safe_load(SAMPLE.read_text())
    data["questions"][-1]["solution"] = "def ring_bytes(n, p):\n    return n\n"
    src = tmp_path / "bad.source.yaml"
    src.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(QuizSourceError) as info:
        build(src, tmp_path, tmp_path / "key.json", check_code=True)
    assert info.value.question == "write-ring-bytes" and info.value.field == "solution"
    # 8/2 -> 8 is right by chance, 100/4 -> 150 and 10/1 -> 0 and 0/3 -> 0: 2 of 4 pass.
    assert "passes only 2 of 4 checks" in str(info.value)


def test_self_check_statuses_and_numeric_grid(tmp_path: Path) -> None:
    res = build(SAMPLE, tmp_path, tmp_path / "key.json")
    sc = json.loads(res.selfcheck.read_text())
    raw = res.selfcheck.read_text()
    assert "7/4" not in raw and "dynamic" not in raw

    def status(answers: dict) -> dict[str, str]:
        return self_check(sc, Answers("sample-quiz", 2, "zoe", answers)).status

    got = status(
        {
            "pick-dp": "dp",
            "nccl-facts": ["c", "a"],
            "ring-bytes": " 1.76 ",
            "loss-scaling": "Loss-Scaling",
            "write-ring-bytes": "def ring_bytes(n, p): return 0",
        }
    )
    assert got == {
        "pick-dp": "correct",
        "nccl-facts": "correct",
        "ring-bytes": "correct",
        "efficiency": "unchecked",
        "loss-scaling": "correct",
        "write-ring-bytes": "unchecked",
    }
    # Every value within atol matches; values beyond 1.25 * atol never do.
    for x in ["1.74", "1.7401", "1.7599", "1.76", "7/4", "1.75e0"]:
        assert status({"ring-bytes": x})["ring-bytes"] == "correct", x
    for x in ["1.7374", "1.7626", "1.8", "1.75 GB", "-1.75"]:
        assert status({"ring-bytes": x})["ring-bytes"] == "not yet", x
    report = self_check(sc, Answers("sample-quiz", 2, "zoe", {"pick-dp": "dp"}))
    assert (report.score, report.max_score, report.passed) == (2, 7, False)
