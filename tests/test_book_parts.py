"""The course site's pieces, without building it: links, lecture mentions, the quiz page,
the executed notebooks CI keeps, and the pages assembled from them.

The built site and its browser test are ``tests/site/test_site.py``, which ``make test``
runs after ``make book`` (the site needs every notebook executed first).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from ddtk.course import catalog
from ddtk.course.answers import is_answer_cell
from ddtk.course.book import BookError, assemble, fix_links, link_mentions, quiz_page
from ddtk.course.executed import Capture, describe
from ddtk.course.leaks import quiz_secrets

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"course/02-ray.ipynb", "resources/04-nccl-reference.md", "deploy/README.md",
         "deploy/slurm/README.md", "docs/benchmarks.md"}  # fmt: skip


def test_links_to_pages_stay_folders_go_to_their_readme_secrets_become_text() -> None:
    copies: set[str] = set()
    text = (
        "[ref](../resources/04-nccl-reference.md#ll128) [lab](../solutions/lab01-ray-train.ipynb) "
        "[slurm](../deploy/slurm/) [png](../docs/benchmarks-dp-2core.png) [web](https://x.org/a) "
        "[gone](../nowhere.md) [out](../../../etc/passwd) [top](#intro) ![fig](../docs/benchmarks-dp-2core.png)"
    )
    got = fix_links(text, "course/04-nccl-and-networking.ipynb", ROOT, PAGES, copies)
    assert "[ref](../resources/04-nccl-reference.md#ll128)" in got
    assert "[slurm](../deploy/slurm/README.md)" in got
    assert "[png](../docs/benchmarks-dp-2core.png)" in got and "![fig](../docs/" in got
    assert " lab " in got and "solutions" not in got  # no link into the answers
    assert " gone " in got and " out " in got and "[web](https://x.org/a)" in got
    assert "[top](#intro)" in got
    assert copies == {"docs/benchmarks-dp-2core.png"}


def test_lecture_mentions_become_links_except_in_code_links_headings_and_own_page() -> None:
    lectures = {int(e.name): e.path for e in catalog.NOTEBOOKS if e.kind == "lecture"}
    text = ("As lecture 4 showed, and Lecture 06 measures.\n# Lecture 5 in a heading\n"
            "`lecture 3` in code, [lecture 2](x.md) linked, lecture 1 here")  # fmt: skip
    got = link_mentions(text, "course/01-distributed-fundamentals.ipynb", lectures)
    assert "[lecture 4](04-nccl-and-networking.ipynb)" in got
    assert "[Lecture 06](06-fault-tolerance.ipynb)" in got
    assert "# Lecture 5 in a heading" in got and "`lecture 3`" in got
    assert "[lecture 2](x.md)" in got and got.endswith("lecture 1 here")
    from_lab = link_mentions("see lecture 7", "labs/lab04-profiling.ipynb", lectures)
    assert from_lab == "see [lecture 7](../course/07-performance-optimization.ipynb)"


def test_the_quiz_page_has_every_question_and_no_key() -> None:
    page = quiz_page(ROOT)
    public = (ROOT / "quizzes" / "module-quiz.yaml").read_text()
    assert page.count("\n## ") == public.count("\n- id: ") == 25
    assert "oom-13b-model" in page and "**c**: Wrap the model in FSDP" in page
    assert not [s for s in quiz_secrets(ROOT) if s in page]


def _nbval_run(capture: Capture, path: Path, nb, skip_last: bool = False) -> list[Path]:
    written = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, _cell in enumerate(code[: len(code) - skip_last]):
        out = [nbformat.v4.new_output("stream", name="stdout", text=f"cell {i}\n")]
        if i == 1:
            out.append(nbformat.v4.new_output("execute_result", data={"text/plain": "42"}))
        got = capture.add(path, nb, i, out, 0.5)
        written += [got] if got else []
    return written


def test_capture_writes_a_notebook_once_its_last_cell_ran(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# T"), nbformat.v4.new_code_cell("1"),
        nbformat.v4.new_code_cell("2"), nbformat.v4.new_code_cell("3"),
    ])  # fmt: skip
    (tmp_path / "course").mkdir()
    capture = Capture(tmp_path, tmp_path / "out")
    assert _nbval_run(capture, tmp_path / "course" / "a.ipynb", nb, skip_last=True) == []
    assert not (tmp_path / "out").exists()  # a run cut short is never written
    (written,) = _nbval_run(capture, tmp_path / "course" / "b.ipynb", nb)
    assert written == tmp_path / "out" / "course" / "b.ipynb"
    got = nbformat.read(written, as_version=4)
    assert [c.execution_count for c in got.cells[1:]] == [1, 2, 3]
    assert got.cells[2].outputs[1]["execution_count"] == 2
    meta = got.metadata["ddtk"]["executed"]
    assert meta["seconds"] == 1.5 and meta["errors"] == 0 and meta["machine"]["cpus"] >= 1
    assert describe(meta).startswith("Executed in 2 s on ")
    assert not list((tmp_path / "out" / "course").glob(".*tmp"))


def _executed_course(tmp_path: Path, errors: int = 0) -> Path:
    """Every lecture, marked executed (outputs as stored: none), as CI's copies would be."""
    executed = tmp_path / "executed"
    for e in catalog.NOTEBOOKS:
        if e.kind in ("lecture", "appendix"):
            nb = nbformat.read(e.file, as_version=4)
            nb.metadata["ddtk"] = {"executed": {"seconds": 29.0, "finished": "2026-12-02T10:00",
                                                "errors": errors, "machine": {"cpus": 2}}}  # fmt: skip
            (executed / e.path).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, executed / e.path)
    return executed


def test_pages_are_laid_out_without_answers_in_course_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    pages = assemble(ROOT, src, _executed_course(tmp_path))
    assert [p.path for p in pages][:4] == [
        "course/01-distributed-fundamentals.ipynb", "course/02-ray.ipynb",
        "course/appendix/02-optuna.ipynb", "labs/lab01-ray-train.ipynb"]  # fmt: skip
    for page in pages:
        assert (src / page.path).is_file(), page
    lecture = nbformat.read(src / "course/05-mixed-precision.ipynb", as_version=4)
    assert not [c for c in lecture.cells if is_answer_cell(c)]
    assert "Executed in 29 s" in lecture.cells[1].source
    assert "BEGIN SOLUTION" not in json.dumps([c.source for c in lecture.cells])
    toc = (src / "_toc.yml").read_text()
    assert (
        toc.index("course/02-ray")
        < toc.index("course/appendix/02-optuna")
        < toc.index("labs/lab01")
    )
    assert "execute_notebooks: 'off'" in (src / "_config.yml").read_text()


def test_a_lecture_never_executed_or_failed_stops_the_site(tmp_path: Path) -> None:
    executed = _executed_course(tmp_path)
    (executed / "course" / "05-mixed-precision.ipynb").unlink()
    with pytest.raises(BookError, match=r"no executed copy of course/05-mixed-precision.ipynb"):
        assemble(ROOT, tmp_path / "src", executed)
    shutil.rmtree(executed)
    executed = _executed_course(tmp_path)
    nb = nbformat.read(executed / "course" / "01-distributed-fundamentals.ipynb", as_version=4)
    next(c for c in nb.cells if c.cell_type == "code").source += "\n# changed since"
    nbformat.write(nb, executed / "course" / "01-distributed-fundamentals.ipynb")
    with pytest.raises(BookError, match="older than its code"):
        assemble(ROOT, tmp_path / "src", executed)
    shutil.rmtree(executed)
    with pytest.raises(BookError, match="cell\\(s\\) raised when it was executed"):
        assemble(ROOT, tmp_path / "src", _executed_course(tmp_path, errors=2))


def test_start_here_names_every_notebook_once() -> None:
    assert sorted(catalog.START_HERE) == sorted(e.name for e in catalog.NOTEBOOKS)
    assert len(set(catalog.START_HERE)) == len(catalog.START_HERE)
