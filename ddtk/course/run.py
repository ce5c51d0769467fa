"""Execute course notebooks headless with papermill, the way ``ddtk course run`` does.

:func:`run_notebook` executes one notebook in its own directory with the kernel of
the running interpreter, injects parameters after its ``parameters`` cell, writes
the executed copy, and returns a :class:`RunResult` that says which cell failed and
why. Failures are results, not exceptions, so a caller can run many notebooks and
report them together; bad input (unknown notebook, missing ``parameters`` cell, a
kernel that is not this interpreter) raises :class:`~ddtk.course.notebooks.NotebookError`
before anything runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtk.course.notebooks import (
    PARAMETERS_TAG,
    NotebookError,
    parameter_names,
    read_notebook,
    tagged_cell_indices,
)

DEFAULT_OUT_DIR = Path("build") / "executed"
DEFAULT_KERNEL = "python3"
# Tags papermill gives the cells it adds to an executed notebook.
_PAPERMILL_TAGS = frozenset({"injected-parameters", "papermill-error-cell-tag"})
_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")
_KEY = re.compile(r"^[A-Za-z_]\w*$")
_ENGINE = "ddtk"

# Called as on_cell(done, total) after each cell, so a caller can draw progress.
CellCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class CellFailure:
    """Where and how an executed notebook failed.

    ``cell_index`` is the 0-based index in the *source* notebook (papermill's added
    cells are not counted); ``execution_count`` is the ``In [N]`` shown in the
    executed notebook, None when the cell never finished.
    """

    cell_index: int | None
    execution_count: int | None
    ename: str
    evalue: str
    source: str = ""

    def describe(self) -> str:
        """One line such as ``cell[3] (In [3]): ZeroDivisionError: division by zero``."""
        where = "an unknown cell" if self.cell_index is None else f"cell[{self.cell_index}]"
        if self.execution_count is not None:
            where += f" (In [{self.execution_count}])"
        return f"{where}: {self.ename}: {self.evalue}" if self.evalue else f"{where}: {self.ename}"


@dataclass(frozen=True)
class RunResult:
    """The outcome of one notebook run.

    ``status`` is ``"passed"``, ``"failed"`` or ``"timeout"``. ``kernel_log`` holds what
    the kernel process (and any process it started) wrote to its own stdout/stderr,
    when it wrote anything; output of the notebook's cells is in ``output``.
    """

    notebook: Path
    output: Path
    status: str
    seconds: float
    failure: CellFailure | None = None
    kernel_log: Path | None = None

    @property
    def ok(self) -> bool:
        return self.status == "passed"


def parse_parameter(text: str) -> tuple[str, Any]:
    """Parse one ``-p key=value``; the value is YAML, so ``3``, ``false`` and ``gloo`` get typed.

    Numbers in exponent form without a dot (``1e-3``), which YAML 1.1 reads as strings,
    are read as floats too.
    """
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise NotebookError(
            f"bad parameter {text!r}: expected the form key=value with key a Python name, "
            "e.g. -p world_size=4 -p backend=gloo -p use_gpu=false"
        )
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise NotebookError(
            f"bad parameter {text!r}: the value is not valid YAML ({exc})"
        ) from None
    if isinstance(value, str) and _EXPONENT.match(value):
        value = float(value)
    return key, value


def parse_parameters(items: Iterable[str]) -> dict[str, Any]:
    """Parse every ``key=value`` of ``items`` into a dict; a later key wins."""
    return dict(parse_parameter(item) for item in items)


def resolve_notebooks(names: Sequence[str]) -> list[Path]:
    """Turn catalog short names (``01``, ``lab02``) or notebook paths into notebook files.

    With no names, every notebook of the catalog that exists in ``course/`` or
    ``solutions/`` is returned, in course order.
    """
    from ddtk.course import catalog

    if not names:
        found = [
            nb.file for nb in catalog.available() if nb.path.startswith(("course/", "solutions/"))
        ]
        if not found:
            raise NotebookError("no course notebooks exist in this checkout yet")
        return found
    return [_resolve_one(name) for name in names]


def _resolve_one(name: str) -> Path:
    from ddtk.course import catalog

    path = Path(name)
    if path.is_file():
        return path
    if path.suffix == ".ipynb" and len(path.parts) > 1:
        raise NotebookError(f"{name}: no such notebook")
    try:
        entry = catalog.find(name)
    except ValueError as exc:
        raise NotebookError(f"{exc}; or give a path to an .ipynb file") from None
    if not entry.exists:
        raise NotebookError(
            f"notebook {name!r} ({entry.path}) is in the course map but not in this checkout"
        )
    return entry.file


def check_kernel(kernel_name: str = DEFAULT_KERNEL) -> None:
    """Make sure ``kernel_name`` starts this interpreter, so notebooks see the same packages.

    jupyter_client runs ``sys.executable`` for a Python kernel spec whose command is
    plain ``python``/``python3`` (as ipykernel installs it); any other command must be
    this interpreter's path.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        raise NotebookError(
            f"no Jupyter kernel named {kernel_name!r}; install ipykernel into this environment "
            f"({sys.executable} -m pip install ipykernel)"
        ) from None
    exe = spec.argv[0] if spec.argv else ""
    generic = {
        "python",
        f"python{sys.version_info[0]}",
        "python{}.{}".format(*sys.version_info[:2]),
    }
    if spec.language.lower().startswith("python") and exe in generic:
        return
    if Path(exe).absolute() != Path(sys.executable).absolute():
        raise NotebookError(
            f"Jupyter kernel {kernel_name!r} ({spec.resource_dir}) runs {exe}, not this interpreter "
            f"{sys.executable}; run `{sys.executable} -m ipykernel install --sys-prefix` or remove "
            "the other kernel spec"
        )


def _check_parameters(path: Path, parameters: Mapping[str, Any]) -> list[str]:
    """Refuse parameters for a notebook without a ``parameters`` cell; return undeclared names."""
    if not parameters:
        return []
    nb = read_notebook(path)
    tagged = tagged_cell_indices(nb, PARAMETERS_TAG)
    if not tagged:
        given = ", ".join(parameters)
        raise NotebookError(
            f"{path}: parameters given ({given}) but the notebook has no code cell tagged "
            f"'{PARAMETERS_TAG}' to override; tag its first code cell '{PARAMETERS_TAG}' "
            "(in Jupyter: View > Cell Toolbar > Tags, or the property inspector)"
        )
    declared = parameter_names(nb.cells[tagged[0]].source)
    return [] if declared is None else [k for k in parameters if k not in declared]


def unknown_parameters(
    paths: Iterable[Path], parameters: Mapping[str, Any]
) -> dict[Path, list[str]]:
    """Validate ``parameters`` against every notebook before running any.

    Raises NotebookError for a notebook without a ``parameters`` cell; returns, per
    notebook, the given names its ``parameters`` cell does not assign (likely typos,
    which papermill would inject anyway).
    """
    unknown = {path: _check_parameters(path, parameters) for path in paths}
    return {path: names for path, names in unknown.items() if names}


def output_path(notebook: Path, out_dir: Path) -> Path:
    """Where the executed copy of ``notebook`` goes: ``out_dir/<its directory name>/<its name>``.

    Keeping the directory name apart stops ``solutions/lab01.ipynb`` and ``labs/lab01.ipynb``
    from overwriting each other.
    """
    return out_dir / notebook.resolve().parent.name / notebook.name


@contextlib.contextmanager
def _quiet_papermill() -> Iterator[None]:
    """Silence papermill's logger for the run; ddtk reports problems itself."""
    logger = logging.getLogger("papermill")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@functools.cache
def _engine() -> str:
    """Register ddtk's papermill engine (on first use) and return its name.

    It is papermill's nbclient engine plus three things: a callback after each cell
    (for progress), a record of the running cell (to name it on a timeout or a dead
    kernel), and the kernel process's own stdout/stderr sent to a log file rather
    than the terminal, where it would interleave with the progress display.
    """
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines

    class ProgressEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(  # type: ignore[override]
            cls,
            nb_man: Any,
            kernel_name: str,
            start_timeout: float = 60,
            execution_timeout: float | None = None,
            on_cell: CellCallback | None = None,
            tracker: dict[str, Any] | None = None,
            kernel_log: Any = None,
            **kwargs: Any,
        ) -> Any:
            _track_cells(nb_man, on_cell, tracker if tracker is not None else {})
            kwargs.pop("input_path", None)
            client = PapermillNotebookClient(
                nb_man,
                timeout=execution_timeout,
                startup_timeout=start_timeout,
                kernel_name=kernel_name,
                log=logging.getLogger("papermill"),
                **kwargs,
            )
            return client.execute(stdout=kernel_log, stderr=kernel_log)

    papermill_engines.register(_ENGINE, ProgressEngine)
    return _ENGINE


def _track_cells(nb_man: Any, on_cell: CellCallback | None, tracker: dict[str, Any]) -> None:
    """Wrap papermill's per-cell hooks to record the running cell and report finished ones."""
    start, complete = nb_man.cell_start, nb_man.cell_complete

    def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
        tracker["index"], tracker["cells"] = cell_index, nb_man.nb.cells
        return start(cell, cell_index, **kw)

    def cell_complete(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
        result = complete(cell, cell_index, **kw)
        if on_cell is not None and cell_index is not None:
            on_cell(cell_index + 1, len(nb_man.nb.cells))
        return result

    nb_man.cell_start, nb_man.cell_complete = cell_start, cell_complete


def _source_index(cells: Sequence[Any], index: int) -> int:
    """Map an index among executed cells to the source notebook by skipping papermill's cells."""
    added = sum(
        1
        for cell in cells[:index]
        if _PAPERMILL_TAGS & set(cell.get("metadata", {}).get("tags", []))
    )
    return index - added


def _failure_from_output(path: Path) -> CellFailure | None:
    """Find the first failed cell of an executed notebook from its error output."""
    try:
        nb = read_notebook(path)
    except NotebookError:
        return None
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            if out.get("ename") == "SystemExit" and out.get("evalue") in ("", "0"):
                continue
            return CellFailure(
                _source_index(nb.cells, index),
                cell.get("execution_count"),
                out.get("ename", "Error"),
                out.get("evalue", ""),
                cell.get("source", ""),
            )
    return None


def _failure_from_tracker(tracker: Mapping[str, Any], exc: BaseException) -> CellFailure:
    """Describe a failure that left no error output (timeout, dead kernel) from the running cell."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    index, cells = tracker.get("index"), tracker.get("cells")
    if index is None or cells is None:
        return CellFailure(None, None, type(exc).__name__, message)
    source = cells[index].get("source", "")
    return CellFailure(_source_index(cells, index), None, type(exc).__name__, message, source)


def run_notebook(
    path: Path,
    parameters: Mapping[str, Any] | None = None,
    out_dir: Path = DEFAULT_OUT_DIR,
    timeout: float | None = None,
    *,
    kernel_name: str = DEFAULT_KERNEL,
    on_cell: CellCallback | None = None,
) -> RunResult:
    """Execute ``path`` with papermill and return how it went.

    The notebook runs with its own directory as working directory, ``parameters``
    injected after its ``parameters`` cell, and ``timeout`` seconds allowed per cell
    (None: no limit). The executed copy is written to :func:`output_path` even when a
    cell fails, so the traceback can be read there.
    """
    import papermill
    from nbclient.exceptions import CellTimeoutError

    path = Path(path)
    parameters = dict(parameters or {})
    _check_parameters(path, parameters)
    check_kernel(kernel_name)
    # Absolute paths: papermill changes the working directory while it executes.
    out = output_path(path, Path(out_dir)).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # never leave a previous run's copy to be mistaken for this one
    log_path = out.with_name(out.stem + ".kernel.log")
    tracker: dict[str, Any] = {}
    started = time.perf_counter()
    status, failure = "passed", None
    with _quiet_papermill(), log_path.open("w") as kernel_log:
        try:
            papermill.execute_notebook(
                str(path.absolute()),
                str(out),
                parameters=parameters,
                engine_name=_engine(),
                kernel_name=kernel_name,
                language="python",  # the kernel is this interpreter, whatever the metadata says
                progress_bar=False,
                cwd=str(path.resolve().parent),
                execution_timeout=timeout,
                # Kernel log messages (such as its notice that a local kernel talks over
                # TCP) are noise in a headless run; errors still reach the kernel log.
                extra_arguments=["--IPKernelApp.log_level=ERROR"],
                on_cell=on_cell,
                tracker=tracker,
                kernel_log=kernel_log,
            )
        except papermill.PapermillExecutionError as exc:
            status = "failed"
            failure = _failure_from_output(out) or CellFailure(
                None, exc.exec_count, exc.ename, exc.evalue, exc.source
            )
        except CellTimeoutError as exc:
            status, failure = "timeout", _failure_from_tracker(tracker, exc)
        except Exception as exc:  # a dead kernel or a kernel that does not start
            status, failure = "failed", _failure_from_tracker(tracker, exc)
    if log_path.stat().st_size == 0:
        log_path.unlink()
    seconds = time.perf_counter() - started
    return RunResult(path, out, status, seconds, failure, log_path if log_path.exists() else None)


def run_notebooks(
    paths: Sequence[Path],
    parameters: Mapping[str, Any] | None = None,
    out_dir: Path = DEFAULT_OUT_DIR,
    timeout: float | None = None,
    *,
    kernel_name: str = DEFAULT_KERNEL,
    on_start: Callable[[Path], None] | None = None,
    on_cell: CellCallback | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every notebook of ``paths`` in order, after validating parameters for all of them."""
    parameters = dict(parameters or {})
    unknown_parameters(paths, parameters)
    results = []
    for path in paths:
        if on_start is not None:
            on_start(path)
        result = run_notebook(
            path, parameters, out_dir, timeout, kernel_name=kernel_name, on_cell=on_cell
        )
        if on_done is not None:
            on_done(result)
        results.append(result)
    return results
