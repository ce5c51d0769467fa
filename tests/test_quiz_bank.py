"""The module quiz itself: the question bank, its objectives and its built files.

These tests check the content of ``solutions/quiz/module-quiz.source.yaml`` (the
bank, with answers) and of the files built from it, not the grader's mechanics
(see test_quiz_source.py and test_quiz_grading.py for those). Numeric answers are
recomputed here from first principles, independently of the bank.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from ddtk.quiz import Answers, build, grade, load_public, load_source, self_check
from ddtk.quiz.codecheck import run_tests

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "solutions" / "quiz" / "module-quiz.source.yaml"
KEY = ROOT / "solutions" / "quiz" / "module-quiz.key.json"
PUBLIC = ROOT / "quizzes" / "module-quiz.yaml"
SELFCHECK = ROOT / "quizzes" / "module-quiz.selfcheck.json"
OBJECTIVES = ROOT / "quizzes" / "objectives.yaml"
OVERVIEW = ROOT.parent / "shared" / "seeds" / "module-overview.md"

TYPES = {"single", "multi", "numeric", "text", "code"}


@pytest.fixture(scope="module")
def quiz():
    return load_source(SOURCE)


@pytest.fixture(scope="module")
def objectives() -> dict[str, dict]:
    data = yaml.safe_load(OBJECTIVES.read_text(encoding="utf-8"))
    return {str(o["id"]): o for o in data["objectives"]}


def perfect_answers(quiz) -> dict:
    """The key's answers in the form a learner would submit them."""
    out: dict = {}
    for q in quiz.questions:
        if q.type == "single":
            out[q.id] = q.answer
        elif q.type == "multi":
            out[q.id] = list(q.answer)
        elif q.type == "numeric":
            out[q.id] = str(q.answer)
        elif q.type == "text":
            out[q.id] = q.answer[0]
        else:
            out[q.id] = q.solution
    return out


# ---------------------------------------------------------------- the bank


def test_bank_validates_with_the_agreed_metadata(quiz):
    assert quiz.id == "module-202"
    assert quiz.version >= 1
    assert quiz.pass_mark == Fraction(4, 5)
    assert quiz.draw is None


def test_bank_size_and_types(quiz):
    assert len(quiz.questions) == 25
    counts = Counter(q.type for q in quiz.questions)
    assert set(counts) == TYPES
    assert counts["numeric"] >= 3
    assert counts["code"] >= 1
    assert len(set(quiz.ids)) == 25


def test_every_lecture_has_questions(quiz):
    lectures = Counter(q.lecture for q in quiz.questions)
    assert set(lectures) == set(range(1, 8))
    assert min(lectures.values()) >= 2


def test_every_question_teaches(quiz):
    for q in quiz.questions:
        fb = q.feedback
        assert len(fb.correct.split()) >= 25, f"{q.id}: the 'correct' feedback should explain why"
        assert len(fb.incorrect.split()) >= 25, f"{q.id}: the 'incorrect' feedback should teach"
        assert fb.correct.strip() != fb.incorrect.strip(), q.id
        if q.type in ("single", "multi"):
            assert len(q.choices) >= 4, q.id
            assert set(fb.choices) <= set(q.choice_ids), q.id


def test_feedback_never_reveals_the_hidden_tests(quiz):
    for q in quiz.questions:
        if q.type != "code":
            continue
        text = q.feedback.correct + q.feedback.incorrect
        for line in q.tests.splitlines():
            if line.strip():
                assert line.strip() not in text, q.id


def test_every_question_has_known_objectives(quiz, objectives):
    for q in quiz.questions:
        assert q.objectives, f"{q.id} names no learning objective"
        unknown = set(q.objectives) - set(objectives)
        assert not unknown, f"{q.id}: unknown objectives {unknown}"


def test_every_objective_has_a_question(quiz, objectives):
    covered = {o for q in quiz.questions for o in q.objectives}
    missing = sorted(set(objectives) - covered)
    assert not missing, f"objectives without a question: {missing}"


def parse_overview_objectives(text: str) -> dict[str, tuple[str, str]]:
    """``{"1.1": (group, text), ...}`` from the overview's Learning Objectives section."""
    section = text.split("## Learning Objectives", 1)[1].split("\n## ", 1)[0]
    out: dict[str, tuple[str, str]] = {}
    group, number, sub = "", 0, 0
    for line in section.splitlines():
        head = re.match(r"^(\d+)\.\s+\*\*(.+?)\*\*\s*$", line)
        item = re.match(r"^\s+[-*]\s+(.+?)\s*$", line)
        if head:
            number, group, sub = int(head.group(1)), head.group(2).strip(), 0
        elif item and number:
            sub += 1
            out[f"{number}.{sub}"] = (group, item.group(1))
    return out


@pytest.mark.skipif(
    not OVERVIEW.exists(), reason="the module overview is not checked out next to the kit"
)
def test_objectives_match_the_module_overview(objectives):
    expected = parse_overview_objectives(OVERVIEW.read_text(encoding="utf-8"))
    assert len(expected) == 22
    got = {oid: (o["group"], o["text"]) for oid, o in objectives.items()}
    assert got == expected


def test_overview_parser_on_a_sample():
    sample = "## Learning Objectives\n\n1. **Design**\n   - Pick one\n   - Pick two\n\n2. **Run**\n   - Go\n\n## Next\n- no"
    assert parse_overview_objectives(sample) == {
        "1.1": ("Design", "Pick one"),
        "1.2": ("Design", "Pick two"),
        "2.1": ("Run", "Go"),
    }


# ---------------------------------------------------------------- the answers


def independent_numeric_answers() -> dict[str, Fraction]:
    """Each numeric answer recomputed from the quantities in its prompt."""
    p = 4  # pipeline stages; smallest m with (p-1)/(m+p-1) <= 1/10
    m = next(m for m in range(1, 1000) if Fraction(p - 1, m + p - 1) <= Fraction(1, 10))
    ring_gib = Fraction(2 * (8 - 1), 8) * 1  # 2(n-1)/n x 1 GiB
    busbw = 12 * Fraction(2 * (16 - 1), 16)  # algbw x 2(n-1)/n
    zero2 = 2 + Fraction(2, 8) + Fraction(12, 8)  # full weights, sharded grads and states
    job_mtbf_min = Fraction(5000 * 60, 500)
    young = Fraction(round(math.sqrt(2 * 3 * job_mtbf_min)))
    efficiency = Fraction(600, 50) / 16
    return {
        "pipeline-microbatches": Fraction(m),
        "tune-concurrency": Fraction(4 * (8 // 3)),
        "ring-allreduce-bytes": ring_gib,
        "busbw-from-algbw": busbw,
        "zero-stage2-memory": zero2,
        "checkpoint-interval": young,
        "scaling-efficiency": efficiency,
    }


def test_numeric_answers_match_an_independent_computation(quiz):
    expected = independent_numeric_answers()
    numeric = {q.id: q for q in quiz.questions if q.type == "numeric"}
    assert set(numeric) == set(expected)
    assert expected["pipeline-microbatches"] == 27
    assert expected["checkpoint-interval"] == 60
    for qid, value in expected.items():
        assert numeric[qid].answer == value, qid


# common wrong answers named in the feedback: they must score 0 (tolerances not too loose)
COMMON_MISTAKES = {
    "pipeline-microbatches": "30",
    "tune-concurrency": "10",
    "ring-allreduce-bytes": "2",
    "busbw-from-algbw": "12",
    "zero-stage2-memory": "2",
    "checkpoint-interval": "1342",
    "scaling-efficiency": "12",
    "zero-collective": "all-reduce",
}


def test_common_mistakes_score_zero(quiz):
    result = grade(quiz, Answers(quiz.id, quiz.version, "mistaken", dict(COMMON_MISTAKES)))
    scores = {r.id: r.score for r in result.questions}
    for qid in COMMON_MISTAKES:
        assert scores[qid] == 0, qid


def test_numeric_forms_a_learner_may_type(quiz):
    answers = {
        "ring-allreduce-bytes": " 1.75e0 ",
        "scaling-efficiency": "3/4",
        "checkpoint-interval": "62",
    }
    result = grade(quiz, Answers(quiz.id, quiz.version, "forms", answers))
    scores = {r.id: r.score for r in result.questions}
    assert all(scores[qid] == 1 for qid in answers), scores


def test_code_reference_solution_passes_and_the_starter_fails(quiz):
    for q in quiz.questions:
        if q.type != "code":
            continue
        good = run_tests(q.solution, q.tests, q.function, q.timeout)
        assert good.total >= 5 and good.passed == good.total, (q.id, good)
        bad = run_tests(q.starter, q.tests, q.function, q.timeout)
        assert bad.passed < bad.total, q.id


# ---------------------------------------------------------------- the built files


def test_key_grades_perfect_at_full_marks_and_empty_at_zero(quiz):
    key = json.loads(KEY.read_text(encoding="utf-8"))
    full = grade(key, Answers(quiz.id, quiz.version, "perfect", perfect_answers(quiz)))
    assert full.score == full.max_score == quiz.max_score
    assert full.passed
    empty = grade(key, Answers(quiz.id, quiz.version, "empty", {}))
    assert empty.score == 0 and not empty.passed


def test_built_files_are_up_to_date(tmp_path):
    out = tmp_path / "quizzes"
    out.mkdir()
    key = tmp_path / "key.json"
    result = build(SOURCE, out, key)
    assert Path(result.public).read_text(encoding="utf-8") == PUBLIC.read_text(encoding="utf-8")
    assert json.loads(Path(result.key).read_text(encoding="utf-8")) == json.loads(
        KEY.read_text(encoding="utf-8")
    )
    fresh = Path(result.selfcheck).read_text(encoding="utf-8")
    assert fresh == SELFCHECK.read_text(encoding="utf-8")


def test_public_file_hides_answers_solutions_and_tests(quiz):
    public = load_public(PUBLIC)
    assert public.ids == quiz.ids
    text = PUBLIC.read_text(encoding="utf-8")
    for q in quiz.questions:
        if q.type == "code":
            assert q.function in text
            for line in (q.tests + q.solution).splitlines():
                if line.strip() and line.strip() not in (q.starter or ""):
                    assert line.strip() not in text, (q.id, line)
        if q.feedback.incorrect:
            assert q.feedback.incorrect.strip()[:60] not in text, q.id


def test_self_check_accepts_the_key_answers(quiz):
    report = self_check(SELFCHECK, Answers(quiz.id, quiz.version, "perfect", perfect_answers(quiz)))
    assert report.passed
    statuses = Counter(report.status.values())
    assert statuses["not yet"] == 0 and statuses["unanswered"] == 0
    assert statuses["correct"] >= 20


def test_readme_counts_match_the_bank(quiz):
    readme = (ROOT / "quizzes" / "README.md").read_text(encoding="utf-8")
    types = Counter(q.type for q in quiz.questions)
    for qtype, n in types.items():
        label = f"`{qtype}` choice ({n})" if qtype in ("single", "multi") else f"`{qtype}` ({n})"
        assert label in readme, label
    lectures = Counter(q.lecture for q in quiz.questions)
    rows = dict(re.findall(r"^\| (\d) \| .+ \| (\d+) \|$", readme, flags=re.M))
    assert {int(k): int(v) for k, v in rows.items()} == dict(lectures)
    assert f"**{len(quiz.questions)} questions**" in readme
    assert f"so {quiz.max_score} points in all" in readme
