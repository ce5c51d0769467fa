"""Tests of ``ddtk course``: building labs, repository checks, stripping and running notebooks.

Fixture notebooks live in tests/fixtures/notebooks/ and are written by its
make_fixtures.py. Tests that execute a notebook start a real kernel (about a second
each) and are marked ``notebook``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from ddtk.course import cli
from ddtk.course.build import MarkerError, build_lab, build_labs, diff_labs
from ddtk.course.check import check_repo, strip_paths
from ddtk.course.notebooks import NotebookError, strip_outputs
from ddtk.course.run import parse_parameter, parse_parameters, resolve_notebooks, run_notebook

FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"


# ---------------------------------------------------------------- helpers


def code(source: str, *tags: str) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def notebook(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        }
    )
    for index, cell in enumerate(cells):
        cell["id"] = f"c{index}"
    nb.cells = list(cells)
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def load(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def sources(nb: nbformat.NotebookNode) -> list[str]:
    return [cell.source for cell in nb.cells]


def stdout_of(nb: nbformat.NotebookNode) -> str:
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.output_type == "stream"
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A clean course repository: one lecture, one solution and its generated lab."""
    write(
        notebook(code("world_size = 2", "parameters"), code("print(world_size)")),
        tmp_path / "course" / "01-x.ipynb",
    )
    (tmp_path / "solutions").mkdir()
    shutil.copy(FIXTURES / "solution_exercise.ipynb", tmp_path / "solutions" / "lab01-x.ipynb")
    build_labs(tmp_path / "solutions", tmp_path / "labs")
    return tmp_path


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))


# ---------------------------------------------------------------- fixtures are current


def test_fixture_notebooks_match_their_generator(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for path in module.write_fixtures(tmp_path):
        stored = FIXTURES / path.name
        assert stored.read_bytes() == path.read_bytes(), (
            f"run {FIXTURES / 'make_fixtures.py'} to refresh {stored}"
        )


# ---------------------------------------------------------------- build


def test_build_replaces_each_solution_block_with_a_numbered_stub() -> None:
    lab, titles = build_lab(load(FIXTURES / "solution_multi.ipynb"), "solution_multi.ipynb")
    assert titles == ["split into chunks", "", 'the "busbw" factor']
    src = sources(lab)
    assert src[0] == "world_size = 4"
    assert src[2] == (
        "import math\n\n\ndef ring_chunks(n, world_size):\n"
        '    raise NotImplementedError("Exercise 1: split into chunks")'
    )
    # Nested block: the stub keeps the indentation of its BEGIN line, code after END stays.
    assert src[3] == (
        "class Ring:\n    def __init__(self, world_size):\n        self.world_size = world_size\n\n"
        "    def neighbours(self, rank):\n        if rank >= 0:\n"
        '            raise NotImplementedError("Exercise 2")\n'
        "        raise ValueError(rank)"
    )
    assert (
        src[4]
        == 'raise NotImplementedError("Exercise 3: the \\"busbw\\" factor")\nprint(busbw_factor)'
    )
    for cell in lab.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)  # every stubbed cell is still valid Python
        assert "SOLUTION" not in cell.source
        assert "Answer" not in cell.source and "only an answer" not in cell.source


def test_build_removes_markdown_answers_and_drops_answer_only_cells() -> None:
    solution = load(FIXTURES / "solution_multi.ipynb")
    lab, _ = build_lab(solution, "solution_multi.ipynb")
    assert len(lab.cells) == len(solution.cells) - 1
    assert lab.cells[5].source == "**Question:** why does the ring take 2(n-1) steps?"
    assert [c.id for c in lab.cells] == [c.id for c in solution.cells if c.id != "cell-6"]


def test_build_strips_outputs_and_leaves_the_solution_untouched() -> None:
    solution = load(FIXTURES / "solution_multi.ipynb")
    assert solution.cells[-1].outputs and solution.cells[-1].execution_count == 5
    lab, _ = build_lab(solution, "solution_multi.ipynb")
    assert all(
        c.outputs == [] and c.execution_count is None for c in lab.cells if c.cell_type == "code"
    )
    assert solution.cells[-1].execution_count == 5
    assert "# BEGIN SOLUTION split into chunks" in solution.cells[2].source


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\n# BEGIN SOLUTION\nx = 2", "cell[1], line 2: '# BEGIN SOLUTION' is never closed"),
        ("x = 1\n# END SOLUTION", "cell[1], line 2: '# END SOLUTION' without a matching"),
        (
            "# BEGIN SOLUTION a\n# BEGIN SOLUTION b\n# END SOLUTION",
            "cell[1], line 2: '# BEGIN SOLUTION' inside",
        ),
        (
            "x = 1  # BEGIN SOLUTION",
            "cell[1], line 1: 'x = 1  # BEGIN SOLUTION' looks like a solution marker",
        ),
    ],
)
def test_build_rejects_unbalanced_or_malformed_code_markers(source: str, expected: str) -> None:
    nb = notebook(code("n = 1", "parameters"), code(source))
    with pytest.raises(MarkerError) as info:
        build_lab(nb, "solutions/lab09.ipynb")
    assert str(info.value).startswith("solutions/lab09.ipynb: ")
    assert expected in str(info.value)


def test_build_rejects_unbalanced_markdown_markers() -> None:
    nb = notebook(code("n = 1", "parameters"), new_markdown_cell("Q?\n<!-- BEGIN SOLUTION -->\nA."))
    with pytest.raises(
        MarkerError, match=r"lab09.ipynb: cell\[1\], line 2: '<!-- BEGIN SOLUTION -->' is never"
    ):
        build_lab(nb, "lab09.ipynb")
    nb = notebook(code("n = 1", "parameters"), new_markdown_cell("Q?\n<!-- END SOLUTION -->"))
    with pytest.raises(MarkerError, match=r"cell\[1\], line 2: '<!-- END SOLUTION -->' without"):
        build_lab(nb, "lab09.ipynb")


def test_blocks_of_one_cell_with_the_same_title_are_one_exercise() -> None:
    from ddtk.course.build import _stub_code

    two_functions = (
        "def save(x):\n    # BEGIN SOLUTION save and load\n    return x\n    # END SOLUTION\n\n\n"
        "def load(x):\n    # BEGIN SOLUTION save and load\n    return x\n    # END SOLUTION\n\n\n"
        "def other(x):\n    # BEGIN SOLUTION something else\n    return x\n    # END SOLUTION"
    )
    source, titles = _stub_code(two_functions, "lab.ipynb", 3, first_exercise=4)
    assert titles == ["save and load", "something else"]
    assert source.count('raise NotImplementedError("Exercise 4: save and load")') == 2
    assert 'raise NotImplementedError("Exercise 5: something else")' in source
    # the same title in another cell is another exercise
    _, later = _stub_code(two_functions.split("\n\n\n")[0], "lab.ipynb", 5, first_exercise=6)
    assert later == ["save and load"]


def test_build_labs_error_names_the_notebook_file_and_writes_nothing(tmp_path: Path) -> None:
    write(notebook(code("# BEGIN SOLUTION\nx = 1")), tmp_path / "solutions" / "lab09-bad.ipynb")
    with pytest.raises(MarkerError, match=r"lab09-bad\.ipynb: cell\[0\]"):
        build_labs(tmp_path / "solutions", tmp_path / "labs")
    assert not (tmp_path / "labs").exists()
    assert run_cli("build", "--root", str(tmp_path)) == 2


def test_build_is_byte_for_byte_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "solutions"
    src.mkdir()
    for name in ("solution_multi.ipynb", "solution_exercise.ipynb"):
        shutil.copy(FIXTURES / name, src / name)
    first = build_labs(src, tmp_path / "a")
    second = build_labs(src, tmp_path / "b")
    assert [p.name for p in first] == ["solution_exercise.ipynb", "solution_multi.ipynb"]
    for a, b in zip(first, second):
        data = a.read_bytes()
        assert data == b.read_bytes()
        assert data.endswith(b"}\n")
        nbformat.validate(nbformat.reads(data.decode(), as_version=4))
    # Rebuilding over an up-to-date lab leaves it untouched.
    mtime = first[0].stat().st_mtime_ns
    build_labs(src, tmp_path / "a")
    assert first[0].stat().st_mtime_ns == mtime


def test_build_check_detects_a_stale_missing_and_orphan_lab(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert diff_labs(repo / "solutions", repo / "labs") == []
    assert run_cli("build", "--check", "--root", str(repo)) == 0

    solution = repo / "solutions" / "lab01-x.ipynb"
    nb = load(solution)
    nb.cells[2].source = nb.cells[2].source.replace("n * (n - 1) // 2", "sum(range(n))")
    write(nb, solution)
    shutil.copy(FIXTURES / "solution_multi.ipynb", repo / "solutions" / "lab02-y.ipynb")
    write(notebook(code("x = 1")), repo / "labs" / "lab99-gone.ipynb")
    before = {p.name: p.read_bytes() for p in (repo / "labs").glob("*.ipynb")}

    differences = {(d.name, d.kind) for d in diff_labs(repo / "solutions", repo / "labs")}
    assert differences == {
        ("lab01-x.ipynb", "stale"),
        ("lab02-y.ipynb", "missing"),
        ("lab99-gone.ipynb", "orphan"),
    }
    capsys.readouterr()
    assert run_cli("build", "--check", "--root", str(repo)) == 1
    out = capsys.readouterr().out
    assert "stale" in out and "cell[2]" in out and "missing" in out and "orphan" in out
    assert {
        p.name: p.read_bytes() for p in (repo / "labs").glob("*.ipynb")
    } == before  # --check writes nothing

    assert run_cli("build", "--root", str(repo)) == 0
    assert sorted(p.name for p in (repo / "labs").glob("*.ipynb")) == [
        "lab01-x.ipynb",
        "lab02-y.ipynb",
    ]
    assert diff_labs(repo / "solutions", repo / "labs") == []


# ---------------------------------------------------------------- check and strip


def test_check_passes_on_a_clean_repository(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_repo(repo) == []
    assert run_cli("check", "--root", str(repo)) == 0
    # rich wraps at the terminal's width, and the path's length varies (xdist's workers)
    assert "pass the checks" in " ".join(capsys.readouterr().out.split())


def test_check_finds_stored_outputs_in_any_notebook_dir(repo: Path) -> None:
    lecture = repo / "course" / "01-x.ipynb"
    nb = load(lecture)
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="2\n")]
    write(nb, lecture)
    quiz = notebook(new_markdown_cell("quiz"), code("answer = 42"))
    quiz.cells[1].execution_count = 7
    write(quiz, repo / "quizzes" / "q1.ipynb")

    findings = [(f.check, f.path.name, f.cell) for f in check_repo(repo)]
    assert findings == [("outputs", "01-x.ipynb", 1), ("outputs", "q1.ipynb", 1)]


def test_check_finds_missing_duplicate_and_misplaced_parameters_cells(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(notebook(new_markdown_cell("# t"), code("x = 1")), repo / "course" / "02-none.ipynb")
    write(
        notebook(code("import os"), code("x = 1", "parameters")), repo / "course" / "03-late.ipynb"
    )
    write(
        notebook(code("x = 1", "parameters"), code("y = 2", "parameters")),
        repo / "course" / "04-two.ipynb",
    )
    # labs/ is generated, so a lab without a parameters cell is not a parameters finding.
    findings = {(f.check, f.path.name): f for f in check_repo(repo)}
    assert set(findings) == {
        ("parameters", "02-none.ipynb"),
        ("parameters", "03-late.ipynb"),
        ("parameters", "04-two.ipynb"),
    }
    assert (
        "no code cell tagged 'parameters'; tag cell[1]"
        in findings["parameters", "02-none.ipynb"].message
    )
    assert (
        "is cell[1] but the first code cell is cell[0]"
        in findings["parameters", "03-late.ipynb"].message
    )
    assert "2 code cells tagged 'parameters'" in findings["parameters", "04-two.ipynb"].message

    capsys.readouterr()
    assert run_cli("check", "--root", str(repo)) == 1
    out = capsys.readouterr().out
    assert "02-none.ipynb" in out and "3 problem(s) found" in out


def test_check_finds_a_stale_lab_and_a_solution_without_parameters(repo: Path) -> None:
    write(
        notebook(code("def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION")),
        repo / "solutions" / "lab02-z.ipynb",
    )
    findings = {(f.check, f.path.name) for f in check_repo(repo)}
    assert findings == {("parameters", "lab02-z.ipynb"), ("labs", "lab02-z.ipynb")}


def test_check_reports_unbuildable_solutions_and_unreadable_notebooks(repo: Path) -> None:
    write(
        notebook(code("x = 1", "parameters"), code("# END SOLUTION")),
        repo / "solutions" / "lab03-bad.ipynb",
    )
    (repo / "course" / "05-broken.ipynb").write_text("{not json")
    findings = {(f.check, f.path.name): f.message for f in check_repo(repo)}
    assert "cannot build labs" in findings["labs", "solutions"]
    assert "lab03-bad.ipynb: cell[1], line 1" in findings["labs", "solutions"]
    assert "not a readable notebook" in findings["unreadable", "05-broken.ipynb"]


def test_check_refuses_a_directory_that_is_not_a_course_repo(tmp_path: Path) -> None:
    with pytest.raises(NotebookError, match="is this the course repository"):
        check_repo(tmp_path)
    assert run_cli("check", "--root", str(tmp_path)) == 2


def test_repository_notebooks_pass_course_check() -> None:
    """The checked-in course/, solutions/, labs/ and quizzes/ follow the notebook conventions."""
    from ddtk.course.catalog import REPO_ROOT

    if not any((REPO_ROOT / d).is_dir() for d in ("course", "solutions", "labs", "quizzes")):
        pytest.skip(f"no notebook directories under {REPO_ROOT}")
    findings = check_repo(REPO_ROOT)
    report = "\n".join(f"{f.check}: {f.path.relative_to(REPO_ROOT)}: {f.message}" for f in findings)
    assert not findings, f"`ddtk course check` finds problems:\n{report}"


def test_strip_removes_outputs_counts_and_run_metadata(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nb = load(FIXTURES / "solution_multi.ipynb")
    nb.cells[0].metadata["execution"] = {"iopub.status.busy": "2024-01-01T00:00:00Z"}
    nb.metadata["papermill"] = {"parameters": {}}
    assert strip_outputs(nb) is True
    assert all(c.get("outputs", []) == [] and c.get("execution_count") is None for c in nb.cells)
    assert "execution" not in nb.cells[0].metadata and "papermill" not in nb.metadata
    assert strip_outputs(nb) is False

    dirty = repo / "course" / "01-x.ipynb"
    lecture = load(dirty)
    lecture.cells[1].outputs = [new_output("stream", name="stdout", text="2\n")]
    lecture.cells[1].execution_count = 1
    write(lecture, dirty)
    clean_lab = repo / "labs" / "lab01-x.ipynb"
    lab_bytes = clean_lab.read_bytes()
    assert check_repo(repo) != []
    capsys.readouterr()
    assert run_cli("strip", "--root", str(repo)) == 0
    assert "stripped course/01-x.ipynb" in capsys.readouterr().out.replace(str(repo) + "/", "")
    assert check_repo(repo) == []
    assert clean_lab.read_bytes() == lab_bytes  # clean notebooks are not rewritten
    assert strip_paths([dirty]) == []


def test_strip_rejects_a_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("strip", str(tmp_path / "nope.ipynb")) == 2
    assert "no such file or directory" in capsys.readouterr().err


# ---------------------------------------------------------------- run: input handling (no kernel)


def test_parameters_are_parsed_as_typed_yaml() -> None:
    params = parse_parameters(
        [
            "world_size=3",
            "backend=gloo",
            "use_gpu=false",
            "lr=1e-3",
            "ray_address=",
            "dims=[1, 2]",
            "name=a=b",
        ]
    )
    assert params == {
        "world_size": 3,
        "backend": "gloo",
        "use_gpu": False,
        "lr": 0.001,
        "ray_address": None,
        "dims": [1, 2],
        "name": "a=b",
    }
    assert type(params["world_size"]) is int and type(params["lr"]) is float


@pytest.mark.parametrize("bad", ["world_size", "=3", "1x=2", "world size=2"])
def test_bad_parameter_syntax_says_the_expected_form(bad: str) -> None:
    with pytest.raises(NotebookError, match=r"expected the form key=value.*-p world_size=4"):
        parse_parameter(bad)


def test_bad_parameter_yaml_is_reported() -> None:
    with pytest.raises(NotebookError, match="not valid YAML"):
        parse_parameter("dims=[1, 2")


def test_unknown_notebook_name_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NotebookError, match=r"unknown notebook 'lab77'; known names: 01, .*lab04"):
        resolve_notebooks(["lab77"])
    assert run_cli("run", "lab77") == 2
    assert "known names" in capsys.readouterr().err


def test_parameters_for_a_notebook_without_parameters_cell_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(NotebookError, match="no code cell tagged 'parameters'"):
        run_notebook(FIXTURES / "no_parameters.ipynb", {"x": 2}, tmp_path)
    assert not list(tmp_path.rglob("*.ipynb"))  # refused before anything ran
    assert (
        run_cli("run", str(FIXTURES / "no_parameters.ipynb"), "-p", "x=2", "--out", str(tmp_path))
        == 2
    )
    err = capsys.readouterr().err
    assert "parameters given (x)" in err and "no_parameters.ipynb" in err


def test_course_cli_import_does_not_load_notebook_libraries() -> None:
    code = (
        "import sys, ddtk.course.cli\n"
        "print([m for m in ('papermill', 'nbformat', 'nbclient', 'jupyter_client') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- run: executing notebooks


@pytest.mark.notebook
def test_run_applies_typed_parameters_in_the_notebook_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(FIXTURES / "params.ipynb"), "-p", "world_size=3", "-p", "backend=gloo"]
    argv += ["-p", "use_gpu=false", "-p", "lr=1e-3", "--out", str(tmp_path), "--timeout", "60"]
    assert run_cli(*argv) == 0
    out = capsys.readouterr().out
    assert "params.ipynb" in out and "passed" in out

    executed = load(tmp_path / "notebooks" / "params.ipynb")
    seen = json.loads(stdout_of(executed))
    assert {k: seen[k] for k in ("world_size", "backend", "use_gpu", "lr")} == {
        "world_size": 3,
        "backend": "gloo",
        "use_gpu": False,
        "lr": 0.001,
    }
    assert Path(seen["cwd"]) == FIXTURES.resolve()
    # kernel_name="python3" resolves to the interpreter running the tests.
    assert Path(seen["executable"]).absolute() == Path(sys.executable).absolute()


@pytest.mark.notebook
def test_run_failure_names_the_failing_cell(tmp_path: Path) -> None:
    result = run_notebook(FIXTURES / "failing.ipynb", {"divisor": 0}, tmp_path, timeout=60)
    assert result.status == "failed" and not result.ok
    assert result.failure is not None
    # cell[3] of the source notebook, although papermill added cells before it.
    assert result.failure.cell_index == 3
    assert (result.failure.ename, result.failure.evalue) == (
        "ZeroDivisionError",
        "division by zero",
    )
    assert result.failure.source.startswith("ratio = numerator / divisor")
    assert result.output == (tmp_path / "notebooks" / "failing.ipynb").absolute()
    executed = load(result.output)
    failing = [
        c for c in executed.cells if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert len(failing) == 1 and failing[0].execution_count == result.failure.execution_count


@pytest.mark.notebook
def test_run_cli_exits_nonzero_and_points_at_the_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli("run", str(FIXTURES / "failing.ipynb"), "--out", str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "failed" in out
    assert "at cell[3] (In [3]): ZeroDivisionError: division by zero" in out
    assert "cell begins: ratio = numerator / divisor" in out
    assert f"executed notebook: {tmp_path / 'notebooks' / 'failing.ipynb'}" in out


@pytest.mark.notebook
def test_run_timeout_names_the_running_cell(tmp_path: Path) -> None:
    result = run_notebook(FIXTURES / "slow.ipynb", None, tmp_path, timeout=1)
    assert result.status == "timeout"
    assert result.failure is not None and result.failure.cell_index == 1
    assert result.failure.ename == "CellTimeoutError"
    assert result.seconds < 30


@pytest.mark.notebook
def test_run_dead_kernel_names_the_running_cell(tmp_path: Path) -> None:
    # The fixture has no kernelspec or language metadata: the run uses this interpreter anyway.
    result = run_notebook(FIXTURES / "dies.ipynb", {"code": 4}, tmp_path, timeout=60)
    assert result.status == "failed" and result.failure is not None
    assert (result.failure.cell_index, result.failure.ename) == (1, "DeadKernelError")
    assert "os._exit(code)" in result.failure.source


@pytest.mark.notebook
def test_exercise_check_fails_on_the_stub_and_passes_on_the_solution(tmp_path: Path) -> None:
    src = tmp_path / "solutions"
    src.mkdir()
    shutil.copy(FIXTURES / "solution_exercise.ipynb", src / "lab01.ipynb")
    (lab,) = build_labs(src, tmp_path / "labs")
    out = tmp_path / "executed"

    stub = run_notebook(lab, {"n": 4}, out, timeout=60)
    assert stub.status == "failed" and stub.failure is not None
    assert stub.failure.cell_index == 2  # the check cell, not the exercise cell defining the stub
    assert (stub.failure.ename, stub.failure.evalue) == (
        "NotImplementedError",
        "Exercise 1: ring sum",
    )

    solved = run_notebook(src / "lab01.ipynb", {"n": 4}, out, timeout=60)
    assert solved.ok, solved.failure
    assert "exercise 1 passed" in stdout_of(load(solved.output))
