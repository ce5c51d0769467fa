"""Grading by key: exact per-type rules, code checks in a subprocess, never trusting input."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from ddtk.quiz import Answers, AnswersError, grade, load_source, load_source_text, order_for
from ddtk.quiz.answers import read_answers, write_answers
from ddtk.quiz.codecheck import run_tests
from ddtk.quiz.grading import score_question
from ddtk.quiz.seeding import seed_for

SAMPLE = Path(__file__).parent / "fixtures" / "quiz" / "sample.source.yaml"
QUIZ = load_source(SAMPLE)
GOOD_CODE = "def ring_bytes(n, p):\n    return 2 * (p - 1) * n / p\n"


def _score(qid: str, value: object) -> Fraction:
    return score_question(QUIZ.question(qid), value).score


def test_single_choice() -> None:
    assert _score("pick-dp", "dp") == 2
    assert _score("pick-dp", "tp") == 0
    result = score_question(QUIZ.question("pick-dp"), "tp")
    assert "Tensor parallelism splits single layers." in result.feedback
    assert score_question(QUIZ.question("pick-dp"), "zz").status == "invalid"
    assert score_question(QUIZ.question("pick-dp"), None).status == "unanswered"


@pytest.mark.parametrize(
    ("picks", "expected"),
    [
        # 3 points, right choices {a, c}: points * max(0, (right - wrong) / 2)
        (["a", "c"], Fraction(3)),
        (["c", "a"], Fraction(3)),
        (["a"], Fraction(3, 2)),
        (["a", "c", "d"], Fraction(3, 2)),
        (["a", "b", "c", "d"], Fraction(0)),
        (["a", "b"], Fraction(0)),
        (["b", "d"], Fraction(0)),
        ("a", Fraction(3, 2)),
    ],
)
def test_multi_partial_credit(picks: object, expected: Fraction) -> None:
    assert _score("nccl-facts", picks) == expected


@pytest.mark.parametrize(
    "value", [1.75, "1.75", "7/4", "1.75e0", " 1.75 ", "1.7401", 1.76, "175/100"]
)
def test_numeric_accepts_forms_within_atol(value: object) -> None:
    assert _score("ring-bytes", value) == 1


@pytest.mark.parametrize("value", ["1.7399", 1.7601, "2", "-7/4", "abc", [1.75], True])
def test_numeric_rejects_outside_tolerance_or_malformed(value: object) -> None:
    assert _score("ring-bytes", value) == 0


def test_numeric_with_unit_gets_a_clear_note() -> None:
    result = score_question(QUIZ.question("ring-bytes"), "1.75 GB")
    assert result.score == 0 and result.status == "invalid"
    assert "not a unit-free number" in result.feedback


def test_numeric_rtol_is_exact_at_the_boundary() -> None:
    # answer 3/4, rtol 1/50: |x - 3/4| <= 3/200 = 0.015 exactly.
    assert _score("efficiency", "0.765") == 1
    assert _score("efficiency", "0.735") == 1
    assert _score("efficiency", "0.7651") == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("dynamic loss scaling", 1),
        ("  Dynamic   Loss-Scaling ", 1),
        ("LOSS SCALING", 1),
        ("loss—scaling", 1),
        ("loss scale", 0),
        ("", 0),
    ],
)
def test_text_normalisation(value: str, expected: int) -> None:
    assert _score("loss-scaling", value) == expected


def test_code_full_partial_and_hidden_tests() -> None:
    q = QUIZ.question("write-ring-bytes")
    assert score_question(q, GOOD_CODE).score == 2
    # Right for p == 2 and n == 0 only: 8->8, 0->0 pass; 100/4 and p == 1 fail -> 2 of 4.
    half = score_question(q, "def ring_bytes(n, p):\n    return n\n")
    assert half.score == 1 and half.status == "partial"
    assert "2 of 4 checks passed" in half.feedback
    assert "assert" not in half.feedback and "isclose" not in half.feedback


def test_stderr_and_prints_never_change_a_score() -> None:
    noisy = (
        "import sys, warnings\n"
        "print('hello')\n"
        "sys.stderr.write('Traceback (most recent call last):\\n' * 50)\n"
        "warnings.warn('deprecated')\n" + GOOD_CODE
    )
    assert score_question(QUIZ.question("write-ring-bytes"), noisy).score == 2


def test_forged_result_lines_and_exit_codes_are_ignored() -> None:
    forged = "import sys\nfor i in range(10):\n    print('pass', i)\nsys.exit(0)\n"
    res = run_tests(forged, "assert f() == 1\nassert f() == 2\n", "f")
    assert (res.passed, res.total) == (0, 2)
    exits = "import os\ndef f():\n    os._exit(0)\n"
    assert run_tests(exits, "assert f() == 1\n", "f").passed == 0


def test_objects_equal_to_everything_do_not_pass() -> None:
    cheat = "class Any:\n    def __eq__(self, other):\n        return True\n\ndef f():\n    return (Any(), 1)\n"
    assert run_tests(cheat, "assert f() == (2, 1)\nassert f() == 3\n", "f").passed == 0
    plain = "def f():\n    return (2, 1)\n"
    assert run_tests(plain, "assert f() == (2, 1)\nassert f() == 3\n", "f").passed == 1


def test_timeout_and_network_are_contained() -> None:
    res = run_tests(
        "def f():\n    while True:\n        pass\n", "assert f() == 1\n", "f", timeout=1
    )
    assert (res.passed, res.total) == (0, 1) and "Stopped after 1 s" in res.note
    net = (
        "import socket\n"
        "def f():\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "    except PermissionError:\n"
        "        return 'blocked'\n"
        "    except OSError:\n"
        "        return 'reached'\n"
    )
    assert run_tests(net, "assert f() == 'blocked'\n", "f").passed == 1
    spawn = "import subprocess\ndef f():\n    return subprocess.run(['true']).returncode\n"
    assert run_tests(spawn, "assert f() == 0\n", "f").passed == 0


def test_missing_function_and_syntax_error_notes() -> None:
    res = run_tests("def g(): pass\n", "assert f() == 1\n", "f")
    assert res.passed == 0 and "No function named `f`" in res.note
    res = run_tests("def f(:\n", "assert f() == 1\n", "f")
    assert "SyntaxError at line 1" in res.note


def test_grade_student_exact_pass_mark() -> None:
    # Max 10; pass mark 4/5 -> 8 points needed. Lose exactly 2 points (pick-dp): pass.
    answers = {
        "pick-dp": "tp",
        "nccl-facts": ["a", "c"],
        "ring-bytes": "7/4",
        "efficiency": 0.75,
        "loss-scaling": "loss scaling",
        "write-ring-bytes": GOOD_CODE,
    }
    result = grade(QUIZ, Answers("sample-quiz", 2, "ann", answers))
    assert (result.score, result.max_score, result.passed) == (8, 10, True)
    # Half a point less (multi with one wrong extra pick: 3/2 instead of 3): fail.
    answers["nccl-facts"] = ["a", "c", "d"]
    result = grade(QUIZ, Answers("sample-quiz", 2, "ann", answers))
    assert (result.score, result.passed) == (Fraction(13, 2), False)
    assert [q.id for q in result.questions] == list(QUIZ.ids)


def test_grade_reports_other_version_and_unknown_ids() -> None:
    bad = grade(QUIZ, Answers("sample-quiz", 1, "bo", {"pick-dp": "dp"}))
    assert bad.status == "error" and "version 1" in bad.error
    other = grade(QUIZ, Answers("other-quiz", 2, "bo", {}))
    assert other.status == "error" and "other-quiz" in other.error
    warn = grade(QUIZ, Answers("sample-quiz", 2, "bo", {"pick-dp": "dp", "nope": 1}))
    assert warn.score == 2 and warn.warnings == [
        "answer for 'nope' ignored: not a question of this quiz"
    ]


DRAW = """\
quiz: {id: drawn, version: 3, pass_mark: 1/2, draw: 3, shuffle_questions: true, shuffle_choices: true}
questions:
"""


def _drawn_quiz():
    body = "".join(
        f"  - {{id: q{i}, type: single, prompt: P{i}, answer: a,"
        f" choices: [{{id: a, text: A}}, {{id: b, text: B}}, {{id: c, text: C}}]}}\n"
        for i in range(8)
    )
    return load_source_text(DRAW + body)


def test_seeded_draw_is_reproducible_and_not_taken_from_the_submission() -> None:
    quiz = _drawn_quiz()
    ids, choices = order_for(quiz, "carol")
    assert order_for(quiz, "carol") == (ids, choices)
    assert len(ids) == 3 and set(choices) == set(ids)
    assert all(sorted(c) == ["a", "b", "c"] for c in choices.values())
    assert len({tuple(order_for(quiz, s)[0]) for s in ("a1", "b2", "c3", "d4", "e5")}) > 1
    answers = dict.fromkeys(ids, "a")
    honest = grade(quiz, Answers("drawn", 3, "carol", answers, seed=seed_for("drawn", 3, "carol")))
    assert (honest.score, honest.max_score) == (3, 3) and not honest.warnings
    assert [q.id for q in honest.questions] == sorted(ids, key=quiz.ids.index)
    every = dict.fromkeys(quiz.ids, "a")
    forged = grade(quiz, Answers("drawn", 3, "carol", every, seed=1))
    assert [q.id for q in forged.questions] == [q.id for q in honest.questions]
    assert forged.score == 3 and any("stored seed 1" in w for w in forged.warnings)
    assert sum("not drawn for this student" in w for w in forged.warnings) == 5


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("quiz: demo\nversion: 1\nanswers: {}\n", "missing student id"),
        ("quiz: demo\nversion: 1\nstudent: 'a b'\n", "student id must be letters"),
        ("quiz: demo\nversion: 1\nstudent: '..'\n", "student id must be letters"),
        ("quiz: demo\nversion: one\nstudent: al\n", "'version' must be an integer"),
        ("quiz: demo\nversion: 1\nstudent: al\nanswers: [1, 2]\n", "'answers' must be a mapping"),
        ("quiz: demo\nversion: 1\nstudent: al\nanswer: {}\n", "unknown top-level field"),
        ("quiz: [demo\n", "invalid YAML at line"),
        ("- 1\n- 2\n", "must be a mapping"),
    ],
)
def test_read_answers_rejects_malformed_files(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(text)
    with pytest.raises(AnswersError) as info:
        read_answers(path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_answers_round_trip_yaml_and_json(tmp_path: Path) -> None:
    ans = Answers(
        "demo", 1, "al.b-c_d", {"n": Fraction(7, 4), "m": ["a", "c"], "c": GOOD_CODE}, seed=5
    )
    for name in ("a.yaml", "a.json"):
        write_answers(tmp_path / name, ans)
        back = read_answers(tmp_path / name)
        assert back == Answers(
            "demo", 1, "al.b-c_d", {"n": "7/4", "m": ["a", "c"], "c": GOOD_CODE}, seed=5
        )
