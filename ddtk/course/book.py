"""``make book``: the course as a static site, built from the notebooks CI already executed.

The site never executes anything. ``make test`` runs every lecture once under nbval and
keeps it, outputs and all, in ``build/executed/notebooks/`` (:mod:`ddtk.course.executed`);
:func:`assemble` lays the pages out in ``build/book-src/`` in the repository's own
layout, and :func:`build` turns them into HTML in ``build/book/_build/html/``:

- the lectures as executed, each headed by how long it ran and on what machine, without
  their collapsed answer cells (the site shows no solution code);
- the labs as learners get them (the stubs of ``labs/``), not executed;
- the quiz's questions and choices from the public quiz file, without the key;
- the project brief, ``resources/``, ``docs/benchmarks.md`` and ``deploy/``'s READMEs.

Once built, the site is searched for every line of the lab solutions, the quiz key,
the project reference and the lectures' answers (:func:`ddtk.course.leaks.find_leaks`
on the pages' text); one found, and the site is deleted and the build fails.

Pages follow README's "Start here" order. A mention such as "lecture 4" becomes a link to
that lecture; a link to a file that is not a page is copied beside it (a figure, a
manifest) or, when it points nowhere a learner may go (``solutions/``, a missing
file), left as plain text, so no link of the site is broken.

The generator is Jupyter Book 1 (Sphinx, ``sphinx-book-theme``; ``pip install
'jupyter-book<2'``, the ``book`` extra). Jupyter Book 2 (MyST) downloads its site theme
from ``api.mystmd.org`` and GitHub at build time, which a machine that reaches only the
package registries cannot do; Jupyter Book 1 builds from PyPI packages alone, with
Sphinx's own full-text search.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddtk.course import catalog
from ddtk.course.executed import EXECUTED_NOTEBOOKS, describe
from ddtk.course.leaks import find_leaks

BOOK_SRC = Path("build") / "book-src"
BOOK_OUT = Path("build") / "book"
HTML = Path("_build") / "html"
REFERENCE = ("resources/*.md", "docs/benchmarks.md")
DEPLOY = ("deploy/README.md", "deploy/*/README.md")
_LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")
_MENTION = re.compile(r"\b([Ll]ecture)\s+0?([1-7])\b")
_SKIP = re.compile(r"(`[^`\n]*`|!?\[[^\]]*\]\([^)]*\))")


class BookError(ValueError):
    """The site cannot be built as asked: a notebook was never executed, or failed."""


@dataclass(frozen=True)
class Page:
    """A page of the site: its path in the source tree (and the repository) and its title."""

    path: str
    title: str


# ---------------------------------------------------------------- links


def fix_links(text: str, where: str, root: Path, pages: set[str], copies: set[str]) -> str:
    """Rewrite the relative links of ``text`` (markdown of the page at repository path
    ``where``): to a page, kept; to a folder with a README page, to that README; to a
    file learners may have, kept and noted in ``copies``; to anything else, plain text."""

    def one(m: re.Match[str]) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        rel = _resolve(where, path)
        if rel is None:
            return _plain(label)
        if rel in pages:
            return m.group(0)
        if (root / rel).is_dir() and f"{rel.rstrip('/')}/README.md" in pages:
            new = f"{path.rstrip('/')}/README.md" + (f"#{anchor}" if anchor else "")
            return f"{label}({new})"
        if (root / rel).is_file() and not rel.startswith("solutions/"):
            copies.add(rel)
            return m.group(0)
        return _plain(label)

    return _LINK.sub(one, text)


def _resolve(where: str, target: str) -> str | None:
    """``target`` (relative to the page at ``where``) as a repository path, or None
    when it leaves the repository."""
    parts: list[str] = list(Path(where).parent.parts)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def _plain(label: str) -> str:
    return label[1:-1] if label.startswith("[") else label[2:-1]


def link_mentions(text: str, where: str, lectures: dict[int, str]) -> str:
    """Turn "lecture 4" into a link to lecture 4's page (outside code, links and headings;
    never on the lecture's own page)."""

    def one(m: re.Match[str]) -> str:
        target = lectures.get(int(m.group(2)))
        if target is None or target == where:
            return m.group(0)
        rel = os.path.relpath(target, Path(where).parent)
        return f"[{m.group(0)}]({rel})"

    out = []
    for line in text.split("\n"):
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        pieces = _SKIP.split(line)
        out.append("".join(p if i % 2 else _MENTION.sub(one, p) for i, p in enumerate(pieces)))
    return "\n".join(out)


# ---------------------------------------------------------------- pages


def _lectures() -> dict[int, str]:
    return {int(e.name): e.path for e in catalog.NOTEBOOKS if e.kind == "lecture"}


def _markdown_cells(nb, fix) -> None:
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown":
            cell["source"] = fix(cell.get("source", ""))


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.get("cell_type") == "code"]


def _executed_lecture(root: Path, executed: Path, path: str):
    import nbformat

    from ddtk.course.answers import is_answer_cell

    file = executed / path
    if not file.is_file():
        raise BookError(f"no executed copy of {path} in {executed}: `make test` executes "
                        "every notebook and keeps it there (or `make course`)")  # fmt: skip
    nb = nbformat.read(str(file), as_version=4)
    if _code(nb) != _code(nbformat.read(str(root / path), as_version=4)):
        raise BookError(f"the executed copy of {path} is older than its code: `make test` "
                        "executes it again")  # fmt: skip
    meta = nb.metadata.get("ddtk", {}).get("executed", {})
    if meta.get("errors"):
        raise BookError(f"{path}: {meta['errors']} cell(s) raised when it was executed; "
                        "the site shows only notebooks that ran clean")  # fmt: skip
    nb.cells = [c for c in nb.cells if not is_answer_cell(c)]
    note = nbformat.v4.new_markdown_cell(f"*{describe(meta)}. Answers to the exercises are "
                                         "left out of this page; open the notebook to try them.*")  # fmt: skip
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, note)
    return nb


def _lab(root: Path, name: str):
    import nbformat

    nb = nbformat.read(str(root / "labs" / name), as_version=4)
    nb = copy.deepcopy(nb)
    note = nbformat.v4.new_markdown_cell(
        "*The learner's version of this lab, not executed here: run it in JupyterLab "
        "(`make lab`), where each check cell tells you at once how an exercise does.*"
    )
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, note)
    return nb


def quiz_page(root: Path) -> str:
    """The quiz's questions and choices as markdown, from the public quiz file (no key)."""
    from ddtk.quiz.source import load_public

    quiz = load_public(root / "quizzes" / "module-quiz.yaml")
    lines = [f"# {quiz.title}", "",
             f"{len(quiz.questions)} questions, {quiz.max_score} points; "
             f"{float(quiz.pass_mark) * 100:.0f} % of the points pass. Answer in "
             "`quizzes/module-quiz.ipynb` (a form that saves your answers file), or in a YAML "
             "file as `quizzes/README.md` shows; `ddtk quiz selfcheck` tells you which answers "
             "are right without showing the key.", ""]  # fmt: skip
    for n, q in enumerate(quiz.questions, start=1):
        lines += [f"## {n}. `{q.id}` ({q.type}, {q.points} point{'s' * (q.points != 1)})", ""]
        lines += [q.prompt.strip(), ""]
        lines += [f"- **{c.id}**: {c.text}" for c in q.choices]
        if q.type == "code" and getattr(q, "starter", None):
            lines += ["", "```python", q.starter.rstrip(), "```"]
        lines.append("")
    return "\n".join(lines)


def _intro(order: list[Page]) -> str:
    rows = "\n".join(f"| {i} | [{p.title}]({p.path}) |" for i, p in enumerate(order, start=1))
    return "\n".join([
        "# Distributed Training at Scale", "",
        "Seven lectures, four labs, a quiz and a final project on training models across many",
        "processes and machines: Ray Train, Horovod, PyTorch DDP, NCCL, mixed precision, fault",
        "tolerance and profiling. Every lecture on this site is shown as the kit's CI executed it",
        "on a laptop-class machine without a GPU (real processes, real collectives); each says",
        "how long it ran and on what. The labs are the learners' versions, to run yourself.", "",
        "## Start here", "", "| step | page |", "|---|---|", rows, "",
        "Run the notebooks yourself with `make lab` in the course kit (it installs everything",
        "and opens JupyterLab on lecture 1); `ddtk doctor` says what your machine can run.", "",
    ])  # fmt: skip


def _order() -> list[Page]:
    pages = []
    for e in catalog.in_course_order():
        if e.kind == "lab":
            pages.append(Page(f"labs/{Path(e.path).name}", e.title))
        elif e.kind == "quiz":
            pages.append(Page("quizzes/module-quiz.md", "Module quiz"))
        else:
            pages.append(
                Page(
                    e.path, e.title if e.kind == "appendix" else f"Lecture {int(e.name)}: {e.title}"
                )
            )
    pages.append(Page("project/README.md", "The final project"))
    return pages


def _globbed(root: Path, patterns: tuple[str, ...]) -> list[str]:
    return [p.relative_to(root).as_posix() for pat in patterns for p in sorted(root.glob(pat))]


def assemble(root: Path, src: Path, executed: Path | None = None) -> list[Page]:
    """Lay out the site's pages in ``src`` (replaced whole); return them in reading order."""
    import nbformat

    executed = executed or root / EXECUTED_NOTEBOOKS
    order = _order()
    reference = [Page(p, p) for p in _globbed(root, REFERENCE)]
    deploy = [Page(p, p) for p in _globbed(root, DEPLOY)]
    pages = {p.path for p in [*order, *reference, *deploy]}
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    copies: set[str] = set()
    lectures = _lectures()

    def fix(where: str):
        return lambda text: link_mentions(
            fix_links(text, where, root, pages, copies), where, lectures
        )

    for page in order:
        target = src / page.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if page.path.endswith(".ipynb"):
            nb = (_lab(root, Path(page.path).name) if page.path.startswith("labs/")
                  else _executed_lecture(root, executed, page.path))  # fmt: skip
            _markdown_cells(nb, fix(page.path))
            nbformat.write(nb, str(target))
        elif page.path.startswith("quizzes/"):
            target.write_text(quiz_page(root), encoding="utf-8")
        else:
            target.write_text(fix(page.path)((root / page.path).read_text(encoding="utf-8")))
    for page in [*reference, *deploy]:
        (src / page.path).parent.mkdir(parents=True, exist_ok=True)
        (src / page.path).write_text(fix(page.path)((root / page.path).read_text(encoding="utf-8")))
    for rel in sorted(copies):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, src / rel)
    (src / "intro.md").write_text(_intro(order), encoding="utf-8")
    _write_config(src, order, reference, deploy)
    return [*order, *reference, *deploy]


def _stem(path: str) -> str:
    return str(Path(path).with_suffix(""))


def _write_config(src: Path, order: list[Page], reference: list[Page], deploy: list[Page]) -> None:
    import yaml

    chapters = []
    for page in order:
        if "/appendix/" in page.path and chapters:
            chapters[-1].setdefault("sections", []).append({"file": _stem(page.path)})
        else:
            chapters.append({"file": _stem(page.path)})
    deploy_root = next((p for p in deploy if p.path == "deploy/README.md"), None)
    deploy_chapters = [{"file": _stem(deploy_root.path),
                        "sections": [{"file": _stem(p.path)} for p in deploy if p is not deploy_root]}
                       ] if deploy_root else []  # fmt: skip
    toc = {"format": "jb-book", "root": "intro", "parts": [
        {"caption": "The course, in order", "chapters": chapters},
        {"caption": "Reference", "chapters": [{"file": _stem(p.path)} for p in reference]},
        {"caption": "Running on clusters", "chapters": deploy_chapters},
    ]}  # fmt: skip
    config = {
        "title": "Distributed Training at Scale",
        "author": "the ddtk course kit",
        "copyright": "",
        "only_build_toc_files": True,
        "execute": {"execute_notebooks": "off"},
        "html": {"use_repository_button": False, "use_issues_button": False,
                 "home_page_in_navbar": True},
        "sphinx": {"config": {
            "html_show_sourcelink": False,
            "html_show_copyright": False,
            "nb_merge_streams": True,
            "suppress_warnings": ["myst.header", "mystnb.unknown_mime_type"],
        }},
    }  # fmt: skip
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    (src / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))


def build(root: Path, out: Path | None = None, src: Path | None = None) -> Path:
    """Assemble the pages and build the site; return its ``index.html``."""
    out = out or root / BOOK_OUT
    src = src or root / BOOK_SRC
    assemble(root, src)
    exe = Path(sys.executable).with_name("jupyter-book")
    if not exe.exists():
        raise BookError("Jupyter Book is not installed here: pip install -e '.[book]' (make venv)")
    if (out / HTML).exists():
        shutil.rmtree(out / HTML)
    done = subprocess.run([str(exe), "build", str(src), "--path-output", str(out),
                           "--builder", "html"], capture_output=True, text=True)  # fmt: skip
    index = out / HTML / "index.html"
    if done.returncode == 0 and index.is_file():
        leaks = find_leaks(root, out / HTML, lecture_answers=True)
        if leaks:
            shutil.rmtree(out / HTML)  # a site that shows an answer is not left to publish
            raise BookError(f"the site would show {len(leaks)} line(s) of answers, e.g. {leaks[0]}")
    if done.returncode != 0 or not index.is_file():
        raise BookError(
            f"jupyter-book build failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return index


__all__ = ["BOOK_OUT", "BOOK_SRC", "HTML", "BookError", "Page", "assemble", "build", "fix_links",
           "link_mentions", "quiz_page"]  # fmt: skip
