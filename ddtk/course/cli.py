"""``ddtk course run|build|check|strip|lab|grade``: the notebook tools from the command line.

Each handler takes the parsed Namespace and returns the exit code: 0 when all is
well, 1 when a notebook failed or a check found a problem, 2 for bad input. The
work itself is done by the library functions in :mod:`ddtk.course.run`,
:mod:`ddtk.course.build` and :mod:`ddtk.course.check`, imported inside the handlers
so that ``ddtk --help`` does not load papermill or nbformat.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.gradebook import number
from ddtk.gradebook.canvas import add_canvas_options

if TYPE_CHECKING:
    from rich.console import Console

    from ddtk.course.build import LabDifference
    from ddtk.course.check import Finding
    from ddtk.course.run import RunResult

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _error(message: str) -> int:
    _console(stderr=True).print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return EXIT_USAGE


def _root(args: argparse.Namespace) -> Path:
    from ddtk.course.notebooks import find_root

    return Path(args.root) if args.root else find_root()


# ---------------------------------------------------------------- run


def _run_table(results: list[RunResult]) -> Any:
    from rich.table import Table

    from ddtk.course.notebooks import display_path

    table = Table(title="ddtk course run")
    table.add_column("notebook")
    table.add_column("status")
    table.add_column("seconds", justify="right")
    styles = {"passed": "green", "failed": "bold red", "timeout": "bold red"}
    for r in results:
        table.add_row(
            display_path(r.notebook), f"[{styles[r.status]}]{r.status}[/]", f"{r.seconds:.1f}"
        )
    return table


def _report_failure(console: Console, result: RunResult) -> None:
    from ddtk.course.notebooks import display_path

    console.print(
        f"[bold red]{result.status.upper()}[/] {display_path(result.notebook)}", soft_wrap=True
    )
    if result.failure is not None:
        console.print(f"  at {result.failure.describe()}", soft_wrap=True, markup=False)
        lines = [line for line in result.failure.source.splitlines() if line.strip()]
        if lines:
            console.print(f"  cell begins: {lines[0].strip()}", soft_wrap=True, markup=False)
    console.print(
        f"  executed notebook: {display_path(result.output)}", soft_wrap=True, markup=False
    )
    if result.kernel_log is not None:
        console.print(
            f"  kernel process output: {display_path(result.kernel_log)}",
            soft_wrap=True,
            markup=False,
        )


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        transient=True,
    )


def cmd_run(args: argparse.Namespace) -> int:
    """Execute notebooks with papermill, show progress and a summary, exit 1 if any failed."""
    from ddtk.course import run
    from ddtk.course.notebooks import NotebookError, display_path

    try:
        paths = run.resolve_notebooks(args.names)
        parameters = run.parse_parameters(args.param or [])
        unknown = run.unknown_parameters(paths, parameters)
        run.check_kernel(args.kernel)
    except NotebookError as exc:
        return _error(str(exc))
    console = _console()
    for path, names in unknown.items():
        console.print(
            f"[yellow]warning:[/] {display_path(path)} does not assign {', '.join(names)} in its "
            "parameters cell; the value is injected anyway",
            soft_wrap=True,
        )
    with _progress() as progress:
        overall = progress.add_task("notebooks", total=len(paths))
        cells = progress.add_task("", total=None, visible=False)

        def on_start(path: Path) -> None:
            progress.reset(cells, total=None, description=f"  {path.name}", visible=True)

        def on_cell(done: int, total: int) -> None:
            progress.update(cells, completed=done, total=total)

        def on_done(result: RunResult) -> None:
            progress.advance(overall)
            if progress.console.is_terminal:  # a running log above the live bars
                progress.console.print(
                    f"{result.status:>7} {display_path(result.notebook)} ({result.seconds:.1f} s)"
                )

        results = run.run_notebooks(
            paths,
            parameters,
            Path(args.out),
            args.timeout,
            kernel_name=args.kernel,
            on_start=on_start,
            on_cell=on_cell,
            on_done=on_done,
        )
    console.print(_run_table(results))
    failed = [r for r in results if not r.ok]
    for result in failed:
        _report_failure(console, result)
    return EXIT_FAILED if failed else EXIT_OK


# ---------------------------------------------------------------- build


def _differences_table(differences: list[LabDifference], dst: Path) -> Any:
    from rich.table import Table

    from ddtk.course.notebooks import display_path

    table = Table(title=f"{display_path(dst)} is out of date")
    table.add_column("lab")
    table.add_column("problem")
    table.add_column("detail")
    for d in differences:
        table.add_row(display_path(dst / d.name), d.kind, d.detail)
    return table


def cmd_build(args: argparse.Namespace) -> int:
    """Generate labs/ from solutions/, or with --check only report whether labs/ is up to date."""
    from ddtk.course.build import build_labs, diff_labs, render_labs
    from ddtk.course.notebooks import NotebookError, display_path

    root = _root(args)
    src = Path(args.src) if args.src else root / "solutions"
    dst = Path(args.dst) if args.dst else root / "labs"
    console = _console()
    try:
        differences = diff_labs(src, dst)
        if args.check:
            if differences:
                console.print(_differences_table(differences, dst))
                console.print("run `ddtk course build` to regenerate the labs")
                return EXIT_FAILED
            console.print(f"{display_path(dst)} is up to date with {display_path(src)}")
            return EXIT_OK
        labs = render_labs(src)
        build_labs(src, dst)
    except NotebookError as exc:
        return _error(str(exc))
    changed = {d.name: d.kind for d in differences}
    for lab in labs:
        state = "written" if lab.name in changed else "unchanged"
        console.print(
            f"{state:>9} {display_path(dst / lab.name)} ({len(lab.exercises)} exercises)",
            soft_wrap=True,
        )
    for name, kind in changed.items():
        if kind == "orphan":
            console.print(
                f"{'removed':>9} {display_path(dst / name)} (no solution notebook)", soft_wrap=True
            )
    return EXIT_OK


# ---------------------------------------------------------------- check / strip


def _findings_table(findings: list[Finding], root: Path) -> Any:
    from rich.table import Table

    from ddtk.course.notebooks import display_path

    table = Table(title="ddtk course check")
    table.add_column("check")
    table.add_column("notebook")
    table.add_column("cell", justify="right")
    table.add_column("problem")
    for f in findings:
        cell = "" if f.cell is None else str(f.cell)
        table.add_row(f.check, display_path(f.path, root), cell, f.message)
    return table


def cmd_check(args: argparse.Namespace) -> int:
    """Check stored outputs, labs/ freshness and parameters cells; exit 1 on any finding."""
    from ddtk.course.check import check_repo
    from ddtk.course.notebooks import NotebookError, repo_notebooks

    root = _root(args)
    try:
        findings = check_repo(root)
    except NotebookError as exc:
        return _error(str(exc))
    console = _console()
    if findings:
        console.print(_findings_table(findings, root))
        console.print(f"{len(findings)} problem(s) found")
        return EXIT_FAILED
    console.print(f"all {len(repo_notebooks(root))} notebooks under {root} pass the checks")
    if getattr(args, "mutants", False):
        return _check_mutants(root)
    return EXIT_OK


def _judged_notebooks(root: Path) -> list[tuple[Path, Any]]:
    """``(solution path, stub notebook)`` of every lab and every lecture with exercises:
    a lab's stub is its generated ``labs/`` copy, a lecture's is made here, in memory, by
    the same stub generation (``ddtk course build``)."""
    from ddtk.course.judging.mutants import solution_notebook, stub_lecture
    from ddtk.course.notebooks import read_notebook

    found = []
    for path in sorted((root / "solutions").glob("lab*.ipynb")):
        found.append((path, read_notebook(root / "labs" / path.name)))
    for path in sorted((root / "course").glob("[0-9][0-9]-*.ipynb")):
        stub, exercises = stub_lecture(solution_notebook(path), path.name)
        if exercises:
            found.append((path, stub))
    return found


def _check_mutants(root: Path) -> int:
    """The mutant matrix of every lab and lecture with judged exercises: stub fails,
    solution passes, every mutant fails; a table, and exit 1 on any other outcome."""
    from rich.markup import escape
    from rich.table import Table

    from ddtk.course.judges import judge_for
    from ddtk.course.judging.mutants import (
        load_mutants,
        mutant_matrix,
        mutants_file,
        solution_notebook,
    )

    console, bad = _console(), 0
    for solution_path, stub in _judged_notebooks(root):
        judge = judge_for(solution_path.stem)
        if judge is None:
            console.print(f"{solution_path.stem}: no judged exercises yet (checked in the kernel)")
            continue
        file = mutants_file(solution_path)
        mutants = load_mutants(file) if file.is_file() else {}
        table = Table(title=f"{solution_path.stem}: the mutant matrix ({file.relative_to(root)})")
        for name in ("exercise", "answer", "expected", "got", "message"):
            table.add_column(name, overflow="fold")
        with _progress() as progress:
            task = progress.add_task(f"judging {solution_path.stem}", total=None)
            rows = mutant_matrix(
                judge, solution_notebook(solution_path), stub, mutants,
                on_row=lambda r, t=task: progress.update(t, description=f"{r.exercise} {r.variant}"),
            )  # fmt: skip
        for r in rows:
            style = "green" if r.ok else "bold red"
            table.add_row(str(r.exercise), escape(r.variant), r.expected,
                          f"[{style}]{r.status}[/]", escape(r.message[:200]))  # fmt: skip
        console.print(table)
        wrong = sum(not r.ok for r in rows)
        if wrong:
            console.print(f"{solution_path.stem}: {wrong} unexpected outcome(s)")
        bad += wrong
    console.print(
        f"{bad} unexpected outcome(s) in all"
        if bad
        else "every mutant fails, every solution passes"
    )
    return EXIT_FAILED if bad else EXIT_OK


def cmd_strip(args: argparse.Namespace) -> int:
    """Strip outputs and execution counts in place from the given notebooks (default: all)."""
    from ddtk.course.check import strip_paths
    from ddtk.course.notebooks import NOTEBOOK_DIRS, NotebookError, display_path

    if args.paths:
        paths = [Path(p) for p in args.paths]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            return _error(f"no such file or directory: {', '.join(missing)}")
    else:
        root = _root(args)
        paths = [root / d for d in NOTEBOOK_DIRS]
    try:
        changed = strip_paths(paths)
    except NotebookError as exc:
        return _error(str(exc))
    console = _console()
    for path in changed:
        console.print(f"stripped {display_path(path)}", soft_wrap=True)
    console.print(f"{len(changed)} notebook(s) changed")
    return EXIT_OK


# ---------------------------------------------------------------- lab


def cmd_lab(args: argparse.Namespace) -> int:
    """Start JupyterLab on the course, saying what it chose; --dry-run only prints the command."""
    import importlib.util
    import shlex

    from ddtk.course import lab

    try:
        choices = lab.choose(args.port, args.no_browser, args.ip, root=_root(args))
    except OSError as exc:
        return _error(str(exc))
    console = _console()
    for line in lab.explain(choices):
        console.print(line, soft_wrap=True, markup=False)
    if args.dry_run:
        command = shlex.join(lab.lab_command(choices))
        console.print(f"JUPYTER_TOKEN={choices.token} {command}", soft_wrap=True, markup=False)
        return EXIT_OK
    if importlib.util.find_spec("jupyterlab") is None:
        return _error(
            "JupyterLab is not installed in this environment: run `make venv` "
            "(or pip install -e '.[course]')"
        )
    return lab.run(choices)


# ---------------------------------------------------------------- release


def cmd_release(args: argparse.Namespace) -> int:
    """Write the class release; exit 2 when it cannot (OUT in the way, or a leak)."""
    from ddtk.course.release import ReleaseError, make_release

    try:
        release = make_release(_root(args), Path(args.out), git=args.git)
    except (ReleaseError, OSError) as exc:
        return _error(str(exc))
    console = _console()
    console.print(f"wrote {release.out}: {len(release.files)} files, checked: no lab solution, "
                  "quiz key or project reference in it", markup=False)  # fmt: skip
    console.print(f"withheld (the grader keeps them): {', '.join(release.withheld)}", markup=False)
    if release.git:
        console.print(f"a git repository with one commit: git -C {release.out} remote add origin "
                      f"URL && git -C {release.out} push -u origin main", markup=False)  # fmt: skip
    return EXIT_OK


def cmd_collect(args: argparse.Namespace) -> int:
    """Collect a lab's notebooks from the learners' copies; exit 1 when someone handed in none."""
    from ddtk.course import catalog
    from ddtk.course.collect import CollectError, collect

    try:
        entry = catalog.find(args.lab)
        if entry.kind not in ("lab", "lecture"):
            raise CollectError(f"{args.lab!r} is not a lab or a lecture")
        # a learner's lab is labs/<name> (solutions/ is the instructor's); a lecture ships as is
        folder = "labs" if entry.kind == "lab" else Path(entry.path).parent.as_posix()
        got = collect(args.pattern, Path(entry.path).name, Path(args.out), folder)
    except (CollectError, ValueError, OSError) as exc:
        return _error(str(exc))
    console = _console()
    console.print(f"collected {len(got.handed_in)} notebook(s) into {args.out}", markup=False)
    for student in got.missing:
        console.print(f"  {student}: no {Path(entry.path).name}", markup=False)
    for what, why in sorted(got.refused.items()):
        console.print(f"  refused {what}: {why}", markup=False)
    return EXIT_FAILED if got.missing or got.refused else EXIT_OK


def cmd_book(args: argparse.Namespace) -> int:
    """Build the course site from the executed notebooks; exit 2 when it cannot."""
    from ddtk.course.book import BOOK_OUT, BookError, build

    root = _root(args)
    out = Path(args.out) if args.out else root / BOOK_OUT
    try:
        with _progress() as progress:
            progress.add_task("building the course site (Jupyter Book)", total=None)
            index = build(root, out)
    except (BookError, OSError) as exc:
        return _error(str(exc))
    _console().print(f"the course site: {index} (open it in a browser; publish the folder "
                     f"{index.parent} on any static host)", markup=False)  # fmt: skip
    return EXIT_OK


def cmd_pull_link(args: argparse.Namespace) -> int:
    """Print the nbgitpuller link for a hub and the class repository."""
    from ddtk.course.hub import nbgitpuller_link

    try:
        link = nbgitpuller_link(args.hub, args.repo, branch=args.branch, path=args.open,
                                target=args.target)  # fmt: skip
    except ValueError as exc:
        return _error(str(exc))
    print(link)
    return EXIT_OK


# ---------------------------------------------------------------- grade


def _lab_solution(name: str) -> Path:
    """The notebook to grade against: a catalog lab (``lab01``) or lecture (``01``), or a path.

    A lecture is its own solution: its exercises' checks run as they are in ``course/``."""
    from ddtk.course import catalog
    from ddtk.course.notebooks import NotebookError

    path = Path(name)
    if path.is_file():
        return path
    try:
        entry = catalog.find(name)
    except ValueError as exc:
        raise NotebookError(f"{exc}; or give the path of a solution notebook") from None
    if entry.kind == "quiz":
        raise NotebookError(f"{name!r} is the quiz: grade it with `ddtk quiz grade`")
    if entry.kind not in ("lab", "lecture") or not entry.exists:
        raise NotebookError(f"{name!r} is not a lab or a lecture of this checkout ({entry.path})")
    return entry.file


def _cache(folder: str | None) -> Any:
    """The execution cache in ``folder``, or None when not asked for."""
    if folder is None:
        return None
    from ddtk.course.executions import ExecutionCache

    return ExecutionCache(folder)


def cmd_grade(args: argparse.Namespace) -> int:
    """Grade a class's lab notebooks; exit 0 if all passed, 1 if not, 2 on bad input."""
    from ddtk.course import run
    from ddtk.course.grading.classgrade import grade_lab
    from ddtk.course.grading.jail import confinement
    from ddtk.course.grading.report import (
        OutputFolderError,
        check_output_folder,
        summary_table,
        write_results,
    )
    from ddtk.course.grading.submissions import find_submissions
    from ddtk.course.notebooks import NotebookError
    from ddtk.gradebook.canvas import RosterError, read_roster

    out, folder = Path(args.out), Path(args.submissions)
    try:
        roster = read_roster(args.canvas_roster) if args.canvas_roster else None
        lab = _lab_solution(args.lab)
        parameters = run.parse_parameters(args.param or [])
        run.check_kernel()
        check_output_folder(out)
        total = len(find_submissions(folder, (out,)))
    except (NotebookError, OSError, OutputFolderError, RosterError) as exc:
        return _error(str(exc))
    if not total:
        return _error(f"no submissions (notebooks or student folders) in {folder}")
    _console().print(confinement().summary(), markup=False)
    with _progress() as progress:
        task = progress.add_task(f"grading {lab.stem}", total=total)

        def on_start(students: list[str]) -> None:
            progress.update(task, description=f"grading {lab.stem}: {', '.join(students)}")

        def on_done(rows: list[Any]) -> None:
            progress.advance(task, len(rows))
            for r in rows:
                progress.console.print(
                    f"{r.status:>5} {r.student} {number(r.score)}/{number(r.max_score)} "
                    f"({r.seconds:.1f} s)",
                    markup=False,
                )

        try:
            result = grade_lab(
                lab, folder, parameters=parameters, jobs=args.jobs, timeout=args.timeout,
                memory_mb=args.memory_limit, skip=(out,), on_start=on_start, on_done=on_done,
                cache=_cache(args.cache),
            )  # fmt: skip
        except (NotebookError, OSError) as exc:
            return _error(str(exc))
    try:
        write_results(result, out, roster=roster, canvas_column=args.canvas_column)
    except (OSError, OutputFolderError) as exc:
        return _error(f"the results could not be written: {exc}")
    console = _console()
    console.print(summary_table(result))
    console.print(
        f"results: {out}/results.json, {out}/grades.csv; for the LMS: {out}/canvas.csv and "
        f"{out}/<student>/gradescope.json; for each student: {out}/<student>/feedback.html"
    )
    if (out / "canvas-unmatched.txt").exists():
        console.print(f"not in the Canvas roster (left out of canvas.csv): "
                      f"{out}/canvas-unmatched.txt", style="bold yellow")  # fmt: skip
    return result.exit_code


# ---------------------------------------------------------------- parser


def _add_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        help="course repository (default: the nearest directory at or above the working "
        "directory that has course/ or solutions/)",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("the timeout must be positive")
    return value


def _count(text: str, least: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {least} or more, got {value}")
    return value


def _jobs(text: str) -> int:
    return _count(text, least=1)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, got {value}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``course`` and its sub-commands on the top-level ``ddtk`` sub-parsers."""
    course = subparsers.add_parser("course", help="run, build and check the course notebooks")

    def cmd_help(_args: argparse.Namespace) -> int:
        course.print_help()
        return EXIT_USAGE

    course.set_defaults(func=cmd_help)
    sub = course.add_subparsers(dest="course_command", metavar="COMMAND")

    p = sub.add_parser("run", help="execute notebooks headless with papermill")
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="catalog short name (01, lab02) or notebook path; default: every notebook of course/ and solutions/",
    )
    p.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="override a parameter; VALUE is YAML (world_size=3, backend=gloo, use_gpu=false)",
    )
    p.add_argument(
        "--out", default="build/executed", help="where executed notebooks go (default: %(default)s)"
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds allowed per cell (default: %(default)s)",
    )
    p.add_argument(
        "--kernel",
        default="python3",
        help="Jupyter kernel (default: %(default)s, this interpreter)",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("build", help="generate labs/ from solutions/")
    _add_root(p)
    p.add_argument("--src", help="solution notebooks (default: ROOT/solutions)")
    p.add_argument("--dst", help="generated labs (default: ROOT/labs)")
    p.add_argument(
        "--check", action="store_true", help="only report whether the labs are up to date"
    )
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("check", help="check outputs, labs/ freshness and parameters cells")
    _add_root(p)
    p.add_argument(
        "--mutants", action="store_true",
        help="also judge every lab's and lecture's stub, solution and mutants (solutions/mutants/; minutes)",
    )  # fmt: skip
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("strip", help="remove outputs and execution counts from notebooks in place")
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="notebooks or directories (default: all of ROOT)"
    )
    _add_root(p)
    p.set_defaults(func=cmd_strip)

    p = sub.add_parser(
        "lab",
        help="start JupyterLab on lecture 01 (as root too; no browser when there is no display)",
    )
    p.add_argument(
        "--port", type=_port, help="port to serve on (default: the first free one from 8888)"
    )
    p.add_argument(
        "--no-browser", action="store_true", help="do not open a browser; print the URL instead"
    )
    p.add_argument(
        "--ip",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; 0.0.0.0 inside a container)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print what would run, and why, without starting"
    )
    _add_root(p)
    p.set_defaults(func=cmd_lab)

    p = sub.add_parser(
        "release", help="write the learners' tree: no solutions, quiz key, project reference"
    )
    p.add_argument("out", metavar="OUT", help="a new (or empty) folder for the release")
    p.add_argument("--git", action="store_true", help="make it a git repository, one commit")
    _add_root(p)
    p.set_defaults(func=cmd_release)

    p = sub.add_parser(
        "pull-link", help="the nbgitpuller link that gives a hub's learners the release"
    )
    p.add_argument(
        "--hub", required=True, help="the JupyterHub's URL, e.g. https://hub.example.edu"
    )
    p.add_argument("--repo", required=True, help="the class repository's URL (the pushed release)")
    p.add_argument("--branch", default="main", help="(default: %(default)s)")
    from ddtk.course.hub import FIRST_NOTEBOOK

    p.add_argument("--open", default=FIRST_NOTEBOOK, metavar="PATH",
                   help="the notebook to open, relative to the repository (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--target", help="the folder in the learner's home (default: the repository's name)"
    )
    p.set_defaults(func=cmd_pull_link)

    p = sub.add_parser("book", help="build the course site from the notebooks make test executed")
    p.add_argument("--out", help="output folder (default: build/book; the site is OUT/_build/html)")
    _add_root(p)
    p.set_defaults(func=cmd_book)

    p = sub.add_parser(
        "collect", help="copy a lab's (or a lecture's) notebooks out of the learners' copies"
    )
    p.add_argument("pattern", metavar="PATTERN",
                   help="a glob of the learners' copies; its first wildcard names the student, "
                   "e.g. '/home/*/dtas-2027'")  # fmt: skip
    p.add_argument(
        "lab", metavar="LAB", help="the lab's short name, e.g. lab01, or a lecture's, e.g. 01"
    )
    p.add_argument("--out", required=True, help="a new folder: OUT/<student>/ for each")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("grade", help="grade a class's lab (or lecture) notebooks by running them")
    p.add_argument(
        "lab",
        metavar="LAB",
        help="a lab's short name (lab01), a lecture's (01), or a solution notebook's path",
    )
    p.add_argument(
        "submissions",
        metavar="SUBMISSIONS",
        help="folder with one .ipynb per student, or one folder per student holding one",
    )
    p.add_argument("--out", default="lab-results", help="output folder (default: %(default)s)")
    p.add_argument(
        "--jobs", type=_jobs, default=1, help="notebooks run at once (default: %(default)s)"
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=900.0,
        help="seconds allowed for a whole notebook (default: %(default)s)",
    )
    p.add_argument(
        "--memory-limit",
        type=_count,
        default=8192,
        metavar="MB",
        help="address space each kernel process may map, MiB; 0: no limit (default: %(default)s)",
    )
    p.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="override a parameter of every notebook; VALUE is YAML",
    )
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="keep each run in DIR and reuse a stored run of the same code, limits and "
        "environment (re-grading after a rubric fix; the tests use build/executed)",
    )
    add_canvas_options(p)
    p.set_defaults(func=cmd_grade)
    return course


def main(argv: list[str] | None = None) -> int:
    """Run ``ddtk course`` on its own (``python -m ddtk.course.cli``), for tests and scripts."""
    parser = argparse.ArgumentParser(prog="ddtk")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["course", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
