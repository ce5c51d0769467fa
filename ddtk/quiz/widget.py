"""The ipywidgets form of a :class:`~ddtk.quiz.session.QuizSession`.

One input per question, chosen by type: radio buttons for ``single``, one checkbox
per choice for ``multi``, a text field for ``numeric`` and ``text``, a text area
(pre-filled with the starter code) for ``code``. Above them a student id field, below
them a "Save and check" button and an output area. The button records every answer
through the session (so the form validates exactly like ``session.answer``), writes
the answers file and shows the self-check: the score and one status per question.

Every question box carries the CSS class ``ddtk-quiz-q-<question id>`` and the
result area ``ddtk-quiz-result``, so the form can be driven by a browser test.

>>> import tempfile, pathlib
>>> from ddtk.quiz import build
>>> from ddtk.quiz.session import QuizSession
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> _ = (tmp / "demo.source.yaml").write_text('''
... quiz: {id: demo, version: 1, pass_mark: 1/2}
... questions:
...   - {id: q1, type: single, prompt: "Pick b", answer: b,
...      choices: [{id: a, text: "A"}, {id: b, text: "B"}]}
... ''')
>>> built = build(tmp / "demo.source.yaml", tmp, tmp / "demo.key.json")
>>> form = QuizWidget(QuizSession(built.public, built.selfcheck, answers_path=tmp / "a.yaml"))
>>> form.student.value = "bob"
>>> form.inputs["q1"].value = "b"
>>> form.save_and_check()
>>> form.message.value.startswith("<b>Self-check for bob: score 1/1")
True
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ddtk.quiz.model import format_score

if TYPE_CHECKING:
    from ddtk.quiz.model import Question
    from ddtk.quiz.selfcheck import SelfCheckReport
    from ddtk.quiz.session import QuizSession

_STATUS_STYLE = {
    "correct": ("✔ correct", "#1a7f37"),
    "not yet": ("✘ not yet", "#b35900"),
    "unanswered": ("– unanswered", "#777"),
    "unchecked": ("? unchecked (graded by the instructor)", "#555"),
    "invalid": ("⚠ invalid", "#c00"),
}
_FULL = w.Layout(width="95%")
# Long choices wrap onto several lines instead of being cut off (scoped to the form).
_STYLE = """<style>
.ddtk-quiz .widget-radio-box label {display: flex; flex-direction: row-reverse;
  justify-content: flex-end; align-items: center; gap: 6px; white-space: normal;
  height: auto; line-height: 1.4; padding: 2px 0;}
.ddtk-quiz .widget-radio-box input {flex: none; margin: 0; align-self: center;}
.ddtk-quiz .widget-checkbox {height: auto;}
.ddtk-quiz .widget-checkbox .widget-label-basic {display: flex; align-items: baseline;
  gap: 6px; height: auto;}
.ddtk-quiz .widget-checkbox .widget-label-basic span {white-space: normal; overflow: visible;
  text-overflow: clip; line-height: 1.4;}
</style>"""


def markdown_html(text: str) -> str:
    """Render a Markdown prompt to HTML (plain escaped text when no renderer is installed)."""
    try:
        import mistune
    except ImportError:
        return f"<pre>{html.escape(text)}</pre>"
    return str(mistune.html(text))


class MultiChoice(w.VBox):
    """One checkbox per choice; ``value`` is the list of checked choice ids."""

    def __init__(self, q: Question, current: list[str] | None) -> None:
        self.ids = [c.id for c in q.choices]
        picked = set(current or [])
        self.boxes = [
            w.Checkbox(value=c.id in picked, description=c.text, indent=False, layout=_FULL)
            for c in q.choices
        ]
        super().__init__(self.boxes)

    @property
    def value(self) -> list[str]:
        return [cid for cid, box in zip(self.ids, self.boxes) if box.value]

    @value.setter
    def value(self, ids: list[str]) -> None:
        for cid, box in zip(self.ids, self.boxes):
            box.value = cid in ids


def question_input(q: Question, current: Any) -> Any:
    """The input widget for ``q``, showing the recorded answer ``current`` if any."""
    if q.type == "single":
        return w.RadioButtons(
            options=[(c.text, c.id) for c in q.choices], value=current, layout=_FULL
        )
    if q.type == "multi":
        return MultiChoice(q, current)
    if q.type == "code":
        start = current if current is not None else (q.starter or "")
        rows = max(6, min(20, start.count("\n") + 3))
        return w.Textarea(value=start, rows=rows, layout=_FULL)
    placeholder = "a number, e.g. 1.75 or 7/4" if q.type == "numeric" else "your answer"
    return w.Text(
        value="" if current is None else str(current),
        placeholder=placeholder,
        layout=w.Layout(width="50%"),
    )


def _question_box(index: int, q: Question, field: Any) -> w.VBox:
    head = f"<b>Question {index}</b> <code>{html.escape(q.id)}</code> · {q.type}"
    head += f" · {format_score(q.points)} point(s)"
    if q.type == "numeric" and (q.atol or q.rtol):
        head += f" · tolerance atol={float(q.atol):g}, rtol={float(q.rtol):g}"
    parts = [w.HTML(head), w.HTMLMath(markdown_html(q.prompt))]
    if q.type == "multi":
        parts.append(w.HTML("<i>Tick every correct statement.</i>"))
    box = w.VBox([*parts, field], layout=w.Layout(border="1px solid #ddd", padding="6px"))
    box.add_class(f"ddtk-quiz-q-{q.id}")
    return box


class QuizWidget:
    """Builds and runs the form; ``box`` is the widget to display."""

    def __init__(self, session: QuizSession) -> None:
        self.session = session
        self.student = w.Text(
            value=session.student or "",
            description="Student id",
            placeholder="e.g. alice",
            continuous_update=False,
        )
        self.student.add_class("ddtk-quiz-student")
        self.button = w.Button(description="Save and check", button_style="primary")
        self.button.add_class("ddtk-quiz-save")
        self.message = w.HTML()
        self.message.add_class("ddtk-quiz-result")
        self.inputs: dict[str, Any] = {}
        self.questions = w.VBox()
        self.shown_for = w.HTML()
        self.shown_for.add_class("ddtk-quiz-shown-for")
        self._build_questions()
        self.student.observe(self._on_student, names="value")
        self.button.on_click(lambda _: self.save_and_check())
        title = f"<h3>{html.escape(session.quiz.title or session.quiz.id)}</h3>"
        intro = (
            f"<p>{len(self.inputs)} questions, pass mark "
            f"{float(100 * session.quiz.pass_mark):.0f}%. Enter your student id first.</p>"
        )
        self.box = w.VBox(
            [
                w.HTML(_STYLE + title + intro),
                self.student,
                self.shown_for,
                self.questions,
                self.button,
                self.message,
            ]
        )
        self.box.add_class("ddtk-quiz")

    def _build_questions(self) -> None:
        """(Re)build the question boxes in the student's order, keeping recorded answers."""
        current = self.session.answers
        self.inputs = {}
        boxes = []
        for i, q in enumerate(self.session.questions, 1):
            self.inputs[q.id] = question_input(q, current.get(q.id))
            boxes.append(_question_box(i, q, self.inputs[q.id]))
        self.questions.children = boxes
        self._show_student()

    def _show_student(self) -> None:
        who = self.session.student
        self.shown_for.value = (
            f"<i>Questions and choices in the order for {html.escape(who)}.</i>" if who else ""
        )

    def _on_student(self, change: dict[str, Any]) -> None:
        """Show the new student's questions (the draw and choice order may change) and load
        the student's answers file when nothing has been answered yet."""
        try:
            self._record()
            self.session.student = change["new"].strip()
        except ValueError as exc:
            self.message.value = _error_html(str(exc))
            return
        path = self.session.answers_path
        if not self.session.answers and path.is_file():
            try:  # the student's earlier answers come back
                self.session.load(path)
            except ValueError as exc:
                self.message.value = _error_html(str(exc))
        self._build_questions()

    def _record(self) -> list[str]:
        """Pass every input to the session; return the problems found."""
        problems = []
        for qid, field in self.inputs.items():
            value = field.value
            q = self.session.quiz.question(qid)
            if q.type == "code" and value.strip() == (q.starter or "").strip():
                value = None
            if isinstance(value, str) and q.type != "code":
                value = value.strip()
            try:
                self.session.answer(qid, value)
            except ValueError as exc:
                problems.append(str(exc))
        return problems

    def save_and_check(self) -> None:
        """Record the answers, write the answers file and show the self-check."""
        try:
            student = self.student.value.strip()
            if student != self.session.student:
                self.session.student = student
            problems = self._record()
            path = self.session.save()
            report = self.session.check() if self.session.selfcheck_path else None
        except (ValueError, OSError) as exc:
            self.message.value = _error_html(str(exc))
            return
        self.message.value = report_html(report, problems, str(path))


def _error_html(text: str) -> str:
    return f"<p style='color:#c00'><b>Not saved:</b> {html.escape(text)}</p>"


def report_html(report: SelfCheckReport | None, problems: list[str], path: str) -> str:
    """The result area: score line, per-question status, problems and where it was saved."""
    parts = []
    if report is not None:
        verdict = "passed" if report.passed else "not yet passed"
        pct = float(100 * report.score / report.max_score) if report.max_score else 0.0
        parts.append(
            f"<b>Self-check for {html.escape(report.student)}: score "
            f"{format_score(report.score)}/{format_score(report.max_score)} ({pct:.0f}%), "
            f"pass mark {float(100 * report.pass_mark):.0f}%: {verdict}</b>"
        )
        rows = []
        for item in report.questions:
            label, colour = _STATUS_STYLE.get(item.status, (item.status, "#000"))
            rows.append(
                f"<tr data-qid='{html.escape(item.id)}' data-status='{item.status}'>"
                f"<td><code>{html.escape(item.id)}</code></td>"
                f"<td style='color:{colour}'>{html.escape(label)}</td></tr>"
            )
        parts.append("<table>" + "".join(rows) + "</table>")
        parts.append(f"<p><i>{html.escape(report.note)}</i></p>")
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
        parts.append(
            f"<p style='color:#c00'>Not recorded (fix and save again):</p><ul>{items}</ul>"
        )
    parts.append(f"<p>Answers saved to <code>{html.escape(path)}</code>.</p>")
    return "".join(parts)
