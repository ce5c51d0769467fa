"""The notebooks as CI executed them, kept for the course site: one execution, used twice.

``make test`` runs every lecture cell by cell under nbval, once. :class:`Capture`
(fed by the root ``conftest.py``) collects each cell's outputs as nbval read them from
the kernel, and when a notebook's last code cell has run it writes the executed
notebook to ``build/executed/notebooks/<path in the repository>``, with
``metadata.ddtk.executed``: how long its cells took, when, how many raised, and the
machine (:func:`machine`). The site (``make book``) is built from those files and
never executes anything itself.

A notebook whose run was cut short (an interrupted session, a crash) is never written,
and each file is replaced whole (written beside it, then renamed), so a reader never
sees a half-written notebook.
"""

from __future__ import annotations

import copy
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXECUTED_NOTEBOOKS = Path("build") / "executed" / "notebooks"


def machine() -> dict[str, Any]:
    """What the notebooks ran on: CPUs, architecture, GPUs, Python and torch."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "gpus": gpus,
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0],
    }


def describe(meta: dict[str, Any]) -> str:
    """One line for a page: "ran in 29 s on 2 CPUs (x86_64), no GPU, Python 3.11.2, ..."."""
    m = meta.get("machine", {})
    gpu = f"{m['gpus']} x {m['gpu']}" if m.get("gpus") else "no GPU"
    return (
        f"Executed in {meta.get('seconds', 0):.0f} s on {meta.get('finished', '?')[:10]}: "
        f"{m.get('cpus')} CPUs ({m.get('arch')}), {gpu}, Python {m.get('python')}, "
        f"torch {m.get('torch')}"
    )


@dataclass
class _Run:
    notebook: Any  # the notebook as nbval read it
    cells: int  # its code cells
    outputs: dict[int, list] = field(default_factory=dict)
    seconds: float = 0.0
    errors: int = 0


class Capture:
    """Collects the cells of the notebooks under ``root`` as they run; writes each when done."""

    def __init__(self, root: Path, out: Path | None = None) -> None:
        self.root = root.resolve()
        self.out = out or self.root / EXECUTED_NOTEBOOKS
        self._runs: dict[Path, _Run] = {}
        self._machine: dict[str, Any] | None = None

    def add(
        self, path: Path, notebook: Any, cell: int, outputs: list | None, seconds: float
    ) -> Path | None:
        """Record code cell number ``cell`` of ``path``; return the file written when it
        was the notebook's last code cell, else None."""
        path = Path(path).resolve()
        run = self._runs.get(path)
        if run is None:
            code = sum(c.get("cell_type") == "code" for c in notebook.cells)
            run = self._runs[path] = _Run(notebook, code)
        run.outputs[cell] = list(outputs or [])
        run.seconds += seconds
        run.errors += any(o.get("output_type") == "error" for o in outputs or [])
        if len(run.outputs) < run.cells:
            return None
        del self._runs[path]
        return self._write(path, run)

    def _write(self, path: Path, run: _Run) -> Path:
        nb = copy.deepcopy(run.notebook)
        number = 0
        for c in nb.cells:
            if c.get("cell_type") != "code":
                continue
            c["outputs"] = run.outputs.get(number, [])
            number += 1
            c["execution_count"] = number
            for o in c["outputs"]:
                if o.get("output_type") == "execute_result":
                    o["execution_count"] = number
        if self._machine is None:
            self._machine = machine()
        nb.metadata.setdefault("ddtk", {})["executed"] = {
            "seconds": round(run.seconds, 1),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "errors": run.errors,
            "machine": self._machine,
            "by": "nbval under make test",
        }
        target = self.out / path.relative_to(self.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        import nbformat

        nbformat.write(nb, str(partial))
        partial.replace(target)
        return target


__all__ = ["EXECUTED_NOTEBOOKS", "Capture", "describe", "machine"]
