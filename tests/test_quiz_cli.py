"""``ddtk quiz build|check|grade|selfcheck``: a generated class with malformed files."""

from __future__ import annotations

import csv
import json
import time
from fractions import Fraction
from pathlib import Path

import pytest

from ddtk.cli import main
from ddtk.quiz import Answers, write_answers

SAMPLE = Path(__file__).parent / "fixtures" / "quiz" / "sample.source.yaml"
GOOD = "def ring_bytes(n, p):\n    return 2 * (p - 1) * n / p\n"
HALF = "def ring_bytes(n, p):\n    return n\n"  # 2 of 4 checks
NOISY = "import sys\nsys.stderr.write('warning: ' * 100)\nprint('debug')\n" + GOOD
BROKEN = "def ring_bytes(n, p)\n    return n\n"

# Per question: (answer, points it earns) worked out by hand from the grading rules.
VARIANTS: dict[str, list[tuple[object, Fraction]]] = {
    "pick-dp": [("dp", Fraction(2)), ("tp", Fraction(0)), (None, Fraction(0))],
    "nccl-facts": [(["a", "c"], Fraction(3)), (["a"], Fraction(3, 2)), (["b", "d"], Fraction(0))],
    "ring-bytes": [
        ("7/4", Fraction(1)),
        (" 1.75e0 ", Fraction(1)),
        ("1.8", Fraction(0)),
        ("1.75 GB", Fraction(0)),
    ],
    "efficiency": [(0.75, Fraction(1)), ("0.7", Fraction(0))],
    "loss-scaling": [("Loss-Scaling", Fraction(1)), ("gradient clipping", Fraction(0))],
    "write-ring-bytes": [
        (GOOD, Fraction(2)),
        (NOISY, Fraction(2)),
        (HALF, Fraction(1)),
        (BROKEN, Fraction(0)),
        (None, Fraction(0)),
    ],
}
PASS_POINTS = Fraction(8)  # 4/5 of 10


def make_class(folder: Path, students: int = 26) -> dict[str, tuple[str, Fraction | None]]:
    """Write ``students`` generated answers files plus 8 problem files into ``folder``.

    Returns ``{student or file name: (expected status, expected score or None)}``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    expected: dict[str, tuple[str, Fraction | None]] = {}
    for i in range(students):
        name = f"s{i:02d}"
        answers, score = {}, Fraction(0)
        for j, (qid, options) in enumerate(VARIANTS.items()):
            value, points = options[0] if i % 3 == 0 else options[(i * (j + 1) + j) % len(options)]
            score += points
            if value is not None:
                answers[qid] = value
        suffix = ".json" if i % 4 == 1 else ".yaml"
        write_answers(folder / f"{name}{suffix}", Answers("sample-quiz", 2, name, answers))
        expected[name] = ("pass" if score >= PASS_POINTS else "fail", score)
    # Graded with notes: a wrong type scores 0 for that question only, an unknown id is ignored.
    write_answers(
        folder / "wrongtype.yaml",
        Answers("sample-quiz", 2, "wrongtype", {"pick-dp": "dp", "ring-bytes": [1.75], "extra": 1}),
    )
    expected["wrongtype"] = ("fail", Fraction(2))
    # Not gradable: each becomes an error row and the others are still graded.
    (folder / "badyaml.yaml").write_text("quiz: sample-quiz\nanswers: {pick-dp: [dp\n")
    (folder / "badjson.json").write_text('{"quiz": "sample-quiz", "student": "x",')
    (folder / "nostudent.yaml").write_text(
        "quiz: sample-quiz\nversion: 2\nanswers: {pick-dp: dp}\n"
    )
    write_answers(
        folder / "oldversion.yaml", Answers("sample-quiz", 1, "oldversion", {"pick-dp": "dp"})
    )
    write_answers(folder / "otherquiz.yaml", Answers("other-quiz", 2, "otherquiz", {}))
    write_answers(folder / "zz-duplicate.yaml", Answers("sample-quiz", 2, "s00", {"pick-dp": "dp"}))
    (folder / "notes.txt").write_text("not an answers file; ignored")
    for name in ("badyaml.yaml", "badjson.json", "nostudent.yaml", "oldversion", "otherquiz"):
        expected[name] = ("error", None)
    return expected


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("quiz")
    rc = main(
        ["quiz", "build", str(SAMPLE), "--out", str(tmp / "pub"), "--key", str(tmp / "key.json")]
    )
    assert rc == 0
    return {"key": tmp / "key.json", "selfcheck": tmp / "pub" / "sample.selfcheck.json", "tmp": tmp}


def test_check_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["quiz", "check", str(SAMPLE)]) == 0
    assert "6 questions" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(SAMPLE.read_text().replace("answer: dp", "answer: zz"))
    assert main(["quiz", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 17" in err and "'pick-dp'" in err and "'answer'" in err


def test_grade_a_class_in_one_command(
    built: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = make_class(tmp_path / "class")
    files = list((tmp_path / "class").iterdir())
    assert len(files) == 34
    out = tmp_path / "grades"
    start = time.perf_counter()
    rc = main(
        ["quiz", "grade", str(tmp_path / "class"), "--key", str(built["key"]), "--out", str(out)]
    )
    seconds = time.perf_counter() - start
    printed = capsys.readouterr().out
    print(f"graded {len(files) - 1} files in {seconds:.2f} s")
    assert rc == 1
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 33  # 34 files, notes.txt is not an answers file
    by_student: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_student.setdefault(row["student"], []).append(row)
    for name, (status, score) in expected.items():
        (row,) = [r for r in by_student[name] if name != "s00" or r["status"] != "error"]
        assert row["status"] == status, (name, row)
        if score is not None:
            assert Fraction(row["score"]) == score, (name, row)
            assert row["max_score"] == "10"
    dup = [r for r in by_student["s00"] if r["status"] == "error"]
    assert len(dup) == 1 and "second answers file" in dup[0]["error"]
    assert {r["status"] for r in rows} == {"pass", "fail", "error"}
    assert sum(r["status"] == "error" for r in rows) == 6
    # Per-student results.json with per-question score, max and feedback.
    s01 = json.loads((out / "s01" / "results.json").read_text())
    assert Fraction(s01["score"]) == expected["s01"][1]
    assert [q["id"] for q in s01["questions"]] == list(VARIANTS)
    assert all({"score", "max", "feedback"} <= set(q) for q in s01["questions"])
    wrong = json.loads((out / "wrongtype" / "results.json").read_text())
    ring = next(q for q in wrong["questions"] if q["id"] == "ring-bytes")
    assert ring["status"] == "invalid" and ring["score"] == "0"
    assert wrong["warnings"] == [
        "answer for 'extra' ignored: not a question of this quiz",
        "ring-bytes: answer not graded: expected a number, got list [1.75]",
    ]
    assert (out / "nostudent.yaml.error" / "results.json").is_file()
    assert (
        "missing student id"
        in json.loads((out / "nostudent.yaml.error" / "results.json").read_text())["error"]
    )
    # Output folders stay inside --out whatever the file is called.
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["canvas.csv", "grades.csv"]
    # Hidden tests never reach any feedback, exported or not.
    everything = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "isclose" not in everything and "test_one_rank" not in everything
    check_quiz_exports(out, rows, s01)
    assert "sample-quiz v2" in printed and "not graded" in printed


def check_quiz_exports(out: Path, rows: list[dict[str, str]], s01: dict) -> None:
    """Gradescope per student (a test per question, partial credit kept), Canvas, feedback."""
    from test_gradebook import assert_gradescope_results

    gs = json.loads((out / "s01" / "gradescope.json").read_text())
    assert_gradescope_results(gs)
    assert [t["number"] for t in gs["tests"]] == [q["id"] for q in s01["questions"]]
    assert [Fraction(t["score"]).limit_denominator(1000) for t in gs["tests"]] == [
        Fraction(q["score"]) for q in s01["questions"]]  # fmt: skip
    for path in out.rglob("gradescope.json"):
        assert_gradescope_results(json.loads(path.read_text()))
    with open(out / "canvas.csv", newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0][-1] == "Sample quiz for the grader tests" and canvas[1][-1] == "10"
    assert len(canvas) == 2 + len({r["student"] for r in rows})  # s00's second file: one row
    graded = {r["student"]: r["score"] for r in rows if r["status"] != "error"}
    exported = {r[3]: Fraction(r[-1]).limit_denominator(1000) for r in canvas[2:]}
    assert all(exported[s] == Fraction(v) for s, v in graded.items())
    page = (out / "s01" / "feedback.html").read_text()
    assert "s01" in page and "s02" not in page and "ring-bytes" in page


def test_exit_codes(
    built: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = str(built["key"])
    perfect = {qid: options[0][0] for qid, options in VARIANTS.items()}
    write_answers(tmp_path / "ok" / "a.yaml", Answers("sample-quiz", 2, "a", perfect))
    write_answers(tmp_path / "ok" / "b.json", Answers("sample-quiz", 2, "b", perfect))
    assert (
        main(["quiz", "grade", str(tmp_path / "ok"), "--key", key, "--out", str(tmp_path / "o1")])
        == 0
    )
    single = str(tmp_path / "ok" / "a.yaml")
    assert main(["quiz", "grade", single, "--key", key, "--out", str(tmp_path / "o2")]) == 0
    assert json.loads((tmp_path / "o2" / "a" / "results.json").read_text())["score"] == "10"
    # Usage errors: a missing key, an invalid key, a missing path, a folder with no answers.
    assert main(["quiz", "grade", single, "--key", str(tmp_path / "nokey.json")]) == 2
    (tmp_path / "badkey.json").write_text('{"quiz": {"id": "x"}}')
    assert main(["quiz", "grade", single, "--key", str(tmp_path / "badkey.json")]) == 2
    assert main(["quiz", "grade", str(tmp_path / "missing"), "--key", key]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["quiz", "grade", str(tmp_path / "empty"), "--key", key]) == 2
    with pytest.raises(SystemExit) as info:
        main(["quiz", "grade", "--key", key])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_selfcheck_command(
    built: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = {
        "pick-dp": "dp",
        "nccl-facts": ["a", "c"],
        "ring-bytes": "1.755",
        "loss-scaling": "loss scaling",
    }
    write_answers(tmp_path / "me.yaml", Answers("sample-quiz", 2, "me", answers))
    rc = main(
        ["quiz", "selfcheck", str(tmp_path / "me.yaml"), "--selfcheck", str(built["selfcheck"])]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "self-check: 7/7 (pass)" in out and "unchecked" in out
