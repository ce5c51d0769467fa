"""ddtk.quiz: quizzes written in YAML, built, self-checked and graded exactly.

- :func:`load_source` validates a quiz source (errors name question id, field, line);
- :func:`build` writes the public file, the self-check file and the private key;
- :func:`read_answers` / :func:`write_answers` handle a learner's answers file;
- :func:`self_check` checks answers against salted hashes, without the key;
- :func:`grade` grades one answers file by the key; :func:`grade_class` a folder;
- :func:`order_for` gives a student's deterministic draw and shuffle.

Scores are :class:`fractions.Fraction`, so the pass mark is never off by rounding.

>>> from ddtk.quiz import load_source_text, grade, Answers
>>> quiz = load_source_text('''
... quiz: {id: demo, version: 1, pass_mark: 80%}
... questions:
...   - {id: q1, type: text, prompt: "Which scaling?", answer: [dynamic loss scaling]}
... ''')
>>> grade(quiz, Answers("demo", 1, "alice", {"q1": "Dynamic loss-scaling"})).passed
True
"""

from ddtk.quiz.answers import Answers, AnswersError, check_answers, read_answers, write_answers
from ddtk.quiz.build import BuildResult, build
from ddtk.quiz.classgrade import ClassResult, grade_class, write_grades_csv, write_results
from ddtk.quiz.grading import CodeResult, QuestionResult, StudentResult, grade, score_question
from ddtk.quiz.model import Choice, Feedback, Problem, Question, Quiz, QuizSourceError
from ddtk.quiz.seeding import order_for, seed_for
from ddtk.quiz.selfcheck import SelfCheckItem, SelfCheckReport, make_selfcheck, self_check
from ddtk.quiz.source import load_key, load_public, load_source, load_source_text, validate

__all__ = [
    "Answers",
    "AnswersError",
    "BuildResult",
    "Choice",
    "ClassResult",
    "CodeResult",
    "Feedback",
    "Problem",
    "Question",
    "QuestionResult",
    "Quiz",
    "QuizSourceError",
    "SelfCheckItem",
    "SelfCheckReport",
    "StudentResult",
    "build",
    "check_answers",
    "grade",
    "grade_class",
    "load_key",
    "load_public",
    "load_source",
    "load_source_text",
    "make_selfcheck",
    "order_for",
    "read_answers",
    "score_question",
    "seed_for",
    "self_check",
    "validate",
    "write_answers",
    "write_grades_csv",
    "write_results",
]
