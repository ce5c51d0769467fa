"""QuizSession and its widget: answers by id, checked at once, saved, self-checked.

The quiz is tests/fixtures/quiz/mini.source.yaml (one question of each type), built
into a temporary folder by ``ddtk.quiz.build``. Expected scores are worked out by hand
from that source: pick-one 1 point, pick-many 2, ring-bytes 1, name-it 1, write-it
(code, never self-checked) 3; so the self-check's maximum is 5.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import ipywidgets as w
import pytest
import yaml
from support import executed_text

from ddtk.quiz import build
from ddtk.quiz.session import QuizSession
from ddtk.quiz.widget import MultiChoice, QuizWidget

SOURCE = Path(__file__).parent / "fixtures" / "quiz" / "mini.source.yaml"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def quiz(tmp_path: Path) -> tuple[Path, Path]:
    built = build(SOURCE, tmp_path / "public", tmp_path / "private" / "key.json")
    return built.public, built.selfcheck


def _session(quiz: tuple[Path, Path], tmp_path: Path, student: str | None = "alice") -> QuizSession:
    return QuizSession(*quiz, student=student, answers_path=tmp_path / "answers.yaml")


def test_answers_are_checked_at_once(quiz, tmp_path) -> None:
    s = _session(quiz, tmp_path)
    with pytest.raises(ValueError, match=r"unknown question id 'pick-on'.*did you mean 'pick-one'"):
        s.answer("pick-on", "b")
    with pytest.raises(ValueError, match=r"question 'pick-one': 'd' is not one of its choices"):
        s.answer("pick-one", "d")
    with pytest.raises(ValueError, match=r"ids, not positions"):
        s.answer("pick-one", 1)
    with pytest.raises(ValueError, match=r"question 'pick-many': 'e' is not one of its choices"):
        s.answer("pick-many", ["a", "e"])
    with pytest.raises(ValueError, match=r"question 'ring-bytes'.*not a unit-free number"):
        s.answer("ring-bytes", "1.75 GB")
    with pytest.raises(ValueError, match=r"question 'ring-bytes'"):
        s.answer("ring-bytes", "seven quarters")
    with pytest.raises(ValueError, match=r"question 'write-it': syntax error at line 1"):
        s.answer("write-it", "def ring_bytes(n, p) return 0")
    with pytest.raises(ValueError, match=r"define a function named ring_bytes"):
        s.answer("write-it", "def other(n, p):\n    return 0\n")
    with pytest.raises(ValueError, match=r"question 'name-it': give text"):
        s.answer("name-it", 3)
    assert s.answers == {}  # nothing bad was recorded
    s.answer("pick-many", ["c", "a", "c"])
    s.answer("ring-bytes", " 1.75e0 ")
    s.answer("ring-bytes", Fraction(7, 4))
    assert s.answers == {"pick-many": ["a", "c"], "ring-bytes": "7/4"}
    s.answer("pick-many", [])
    assert s.answers == {"ring-bytes": "7/4"}
    with pytest.raises(ValueError, match="student id must be"):
        s.student = "alice smith"


def test_save_and_check(quiz, tmp_path) -> None:
    s = _session(quiz, tmp_path)
    s.answer("pick-one", "b")  # right: 1
    s.answer("pick-many", ["a"])  # partly right: self-check says "not yet"
    s.answer("ring-bytes", "1.752")  # within atol 0.01 of 7/4: 1
    s.answer("write-it", "def ring_bytes(n, p):\n    return 0\n")
    path = s.save()
    assert path == tmp_path / "answers.yaml"
    saved = yaml.safe_load(path.read_text())
    assert saved["quiz"] == "mini-quiz" and saved["version"] == 2 and saved["student"] == "alice"
    assert isinstance(saved["seed"], int)  # the quiz shuffles choices: the seed is recorded
    assert saved["answers"] == {
        "pick-one": "b",
        "pick-many": ["a"],
        "ring-bytes": "1.752",
        "write-it": "def ring_bytes(n, p):\n    return 0\n",
    }
    report = s.check()
    assert report.status == {
        "pick-one": "correct",
        "pick-many": "not yet",
        "ring-bytes": "correct",
        "name-it": "unanswered",
        "write-it": "unchecked",
    }
    assert (report.score, report.max_score, report.passed) == (Fraction(2), Fraction(5), False)
    s.answer("pick-many", ["c", "a"])
    s.answer("name-it", "  Dynamic Loss-Scaling ")
    report = s.check()
    assert (report.score, report.passed) == (Fraction(5), True)
    text = s.summary()
    assert text.startswith("Self-check for alice: score 5/5 (100%), pass mark 80%: passed")
    assert "  unchecked  write-it" in text
    s.save(tmp_path / "copy.json")
    assert json.loads((tmp_path / "copy.json").read_text())["answers"]["name-it"] == (
        "  Dynamic Loss-Scaling "
    )


def test_saving_needs_a_student(quiz, tmp_path) -> None:
    s = QuizSession(*quiz)
    s.answer("pick-one", "a")
    with pytest.raises(ValueError, match="no student id yet"):
        s.save(tmp_path / "x.yaml")
    s.student = "bob"
    assert s.save(tmp_path / "x.yaml").is_file()


def test_edited_yaml_file(quiz, tmp_path) -> None:
    s = _session(quiz, tmp_path)
    s.answer("pick-one", "c")
    path = s.template(tmp_path / "edit-me.yaml")
    text = path.read_text()
    assert "# Which collective sums gradients across ranks?" in text
    assert "#   b: all-reduce" in text
    assert "  pick-one: c\n" in text and "  name-it:\n" in text
    assert "loss scaling" not in text.lower()  # no answer the learner did not give
    edited = (
        text.replace("  pick-one: c\n", "  pick-one: b\n")
        .replace("  pick-many:\n", "  pick-many: [c, a]\n")
        .replace("  ring-bytes:\n", "  ring-bytes: 7/4\n")
        .replace("  name-it:\n", "  name-it: loss scaling\n")
    )
    path.write_text(edited)
    fresh = QuizSession(*quiz, answers_path=path)  # loads the file, student included
    assert fresh.student == "alice"
    assert fresh.answers["pick-many"] == ["a", "c"]
    report = fresh.check()
    assert (report.score, report.max_score) == (Fraction(5), Fraction(5))
    path.write_text(edited.replace("  pick-one: b\n", "  pick-one: z\n"))
    with pytest.raises(ValueError, match=r"edit-me.yaml: question 'pick-one': 'z' is not one"):
        fresh.load(path)


def test_session_resumes_from_its_file(quiz, tmp_path) -> None:
    s = _session(quiz, tmp_path)
    s.answer("ring-bytes", 1.75)
    s.save()
    again = _session(quiz, tmp_path)
    assert again.answers == {"ring-bytes": 1.75}
    with pytest.raises(ValueError, match="answers of 'alice', not of 'bob'"):
        QuizSession(*quiz, student="bob", answers_path=tmp_path / "answers.yaml")


def test_personal_choice_order(quiz, tmp_path) -> None:
    from ddtk.quiz import order_for

    s = _session(quiz, tmp_path, student=None)
    assert [c.id for c in s.questions[0].choices] == ["a", "b", "c"]  # source order
    for student in ("alice", "bob", "carol"):
        s.student = student
        _, expected = order_for(s.quiz, student)
        shown = {q.id: [c.id for c in q.choices] for q in s.questions if q.choices}
        assert shown == expected
        assert sorted(shown["pick-many"]) == ["a", "b", "c", "d"]


def test_widget_form(quiz, tmp_path) -> None:
    s = _session(quiz, tmp_path, student=None)
    form = QuizWidget(s)
    assert isinstance(s.widget(), w.VBox)
    kinds = {qid: type(field) for qid, field in form.inputs.items()}
    assert kinds == {
        "pick-one": w.RadioButtons,
        "pick-many": MultiChoice,
        "ring-bytes": w.Text,
        "name-it": w.Text,
        "write-it": w.Textarea,
    }
    assert form.inputs["write-it"].value.startswith("def ring_bytes(n, p):")
    form.save_and_check()  # no student id yet
    assert "Not saved" in form.message.value and "student id" in form.message.value
    form.student.value = "carol"
    assert "order for carol" in form.shown_for.value
    picked = form.inputs["pick-one"]
    assert [v for _, v in picked.options] == [c.id for c in s.questions[0].choices]
    picked.value = "b"
    form.inputs["pick-many"].value = ["a", "c"]
    form.inputs["ring-bytes"].value = "1.75 GB"  # refused, reported, the rest still saved
    form.inputs["name-it"].value = "loss scaling"
    form.save_and_check()
    html = form.message.value
    assert "Self-check for carol: score 4/5 (80%), pass mark 80%: passed" in html
    assert "not a unit-free number" in html
    assert "data-qid='ring-bytes' data-status='unanswered'" in html
    saved = yaml.safe_load((tmp_path / "answers.yaml").read_text())
    assert saved["student"] == "carol"
    assert saved["answers"] == {"pick-one": "b", "pick-many": ["a", "c"], "name-it": "loss scaling"}
    # the unchanged starter code is not an answer; an edited one is
    form.inputs["write-it"].value = "def ring_bytes(n, p):\n    return 0\n"
    form.save_and_check()
    assert "write-it" in yaml.safe_load((tmp_path / "answers.yaml").read_text())["answers"]


@pytest.mark.notebook
def test_quiz_notebook_runs_headless(tmp_path) -> None:
    """The notebook runs top to bottom under papermill, as ``ddtk course run`` runs notebooks."""
    import shutil

    from ddtk.course.run import run_notebook

    for name in ("module-quiz.ipynb", "module-quiz.yaml", "module-quiz.selfcheck.json"):
        shutil.copy(ROOT / "quizzes" / name, tmp_path / name)
    result = run_notebook(
        tmp_path / "module-quiz.ipynb",
        {"student": "nb-test"},
        out_dir=tmp_path / "out",
        timeout=300,
    )
    assert result.ok, result.failure.describe() if result.failure else result.status
    text = executed_text(result.output)
    assert "Self-check for nb-test: score 0/" in text
    assert "oom-13b-model" in text
    source = json.loads((ROOT / "quizzes" / "module-quiz.ipynb").read_text())
    assert all(not c.get("outputs") for c in source["cells"] if c["cell_type"] == "code")


def test_drawn_questions(tmp_path) -> None:
    """With ``draw``, a student answers only the questions drawn for them."""
    from ddtk.quiz import order_for

    source = tmp_path / "drawn.source.yaml"
    source.write_text(SOURCE.read_text().replace("  shuffle_choices: true", "  draw: 3"))
    built = build(source, tmp_path, tmp_path / "key.json")
    s = QuizSession(built.public, built.selfcheck, student="dave", answers_path=tmp_path / "a.yaml")
    drawn, _ = order_for(s.quiz, "dave")
    assert len(drawn) == 3 and s.question_ids == drawn
    assert [q.id for q in s.questions] == drawn
    left_out = next(q for q in s.quiz.ids if q not in drawn)
    with pytest.raises(ValueError, match=f"question '{left_out}' is not among the questions drawn"):
        s.answer(left_out, "a")
    assert set(QuizWidget(s).inputs) == set(drawn)
    assert set(s.check().status) == set(drawn)


def test_widget_loads_a_students_earlier_answers(quiz, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # default answers file: ./mini-quiz-erin.answers.yaml
    first = QuizSession(*quiz, student="erin")
    first.answer("pick-one", "c")
    assert first.save() == Path("mini-quiz-erin.answers.yaml")
    form = QuizWidget(QuizSession(*quiz))
    assert form.inputs["pick-one"].value is None
    form.student.value = "erin"
    assert form.inputs["pick-one"].value == "c"
