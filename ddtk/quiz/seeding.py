"""Per-student question draw and shuffle, reproducible from (quiz id, version, student).

The seed is a hash of the three values, so the grader can always recompute it: the
seed stored in an answers file is a record for the learner, never trusted. Answers
refer to question and choice ids, so the order never changes what is graded.

>>> seed_for("demo", 1, "alice")
1361705196
>>> order_ids(["q1", "q2", "q3"], {}, seed=7, draw=2, shuffle_questions=True)
(['q1', 'q2'], {})
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from ddtk.quiz.model import Quiz


def seed_for(quiz_id: str, version: int, student: str) -> int:
    """A 31-bit seed derived from the quiz id, its version and the student id."""
    digest = hashlib.sha256(f"{quiz_id}\x00{version}\x00{student}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def order_ids(
    question_ids: Sequence[str],
    choice_ids: Mapping[str, Sequence[str]],
    *,
    seed: int,
    draw: int | None = None,
    shuffle_questions: bool = False,
    shuffle_choices: bool = False,
) -> tuple[list[str], dict[str, list[str]]]:
    """Draw and shuffle ids with ``random.Random(seed)``; drawn questions keep source
    order unless ``shuffle_questions``. Returns (question ids, {qid: choice ids})."""
    rng = random.Random(seed)
    ids = list(question_ids)
    if draw is not None and draw < len(ids):
        picked = set(rng.sample(ids, draw))
        ids = [q for q in ids if q in picked]
    if shuffle_questions:
        rng.shuffle(ids)
    choices: dict[str, list[str]] = {}
    for qid in ids:
        if qid in choice_ids:
            cids = list(choice_ids[qid])
            if shuffle_choices:
                rng.shuffle(cids)
            choices[qid] = cids
    return ids, choices


def order_for(quiz: Quiz, student: str) -> tuple[list[str], dict[str, list[str]]]:
    """The questions (and choices) ``student`` sees, in order; deterministic."""
    seed = seed_for(quiz.id, quiz.version, student)
    return order_ids(
        quiz.ids,
        {q.id: q.choice_ids for q in quiz.questions if q.choices},
        seed=seed,
        draw=quiz.draw,
        shuffle_questions=quiz.shuffle_questions,
        shuffle_choices=quiz.shuffle_choices,
    )
