"""The course map: every notebook of the kit, what it needs, and whether it exists yet.

One list serves the README's course map, ``ddtk doctor`` (which notebooks can run
on this machine) and ``ddtk course run`` (which notebooks to execute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class NotebookEntry:
    """One notebook of the course.

    ``needs`` names the optional pieces the notebook uses beyond torch and gloo:
    ``"ray"``, ``"horovod"`` or ``"gpu"`` (GPU-only parts are parameters, so a
    notebook that merely *can* use a GPU does not list it).
    """

    name: str
    path: str
    title: str
    kind: str  # "lecture", "appendix" (a lecture's runnable extra), "lab" or "quiz"
    needs: frozenset[str] = field(default_factory=frozenset)

    @property
    def file(self) -> Path:
        return REPO_ROOT / self.path

    @property
    def exists(self) -> bool:
        return self.file.is_file()


def _entry(name: str, path: str, title: str, kind: str, *needs: str) -> NotebookEntry:
    return NotebookEntry(name, path, title, kind, frozenset(needs))


NOTEBOOKS: tuple[NotebookEntry, ...] = (
    _entry(
        "01",
        "course/01-distributed-fundamentals.ipynb",
        "Distributed Training Fundamentals",
        "lecture",
    ),
    _entry("02", "course/02-ray.ipynb", "Ray, Ray Train and Ray Tune", "lecture", "ray"),
    _entry(
        "02-optuna",
        "course/appendix/02-optuna.ipynb",
        "Lecture 2 appendix: Optuna inside Tune and on its own",
        "appendix",
        "ray",
    ),
    _entry(
        "03",
        "course/03-horovod-and-ddp.ipynb",
        "Horovod and PyTorch DDP",
        "lecture",
        "horovod",
        "deepspeed",
        "tensorflow",
    ),
    _entry(
        "04",
        "course/04-nccl-and-networking.ipynb",
        "NCCL and High-Performance Networking",
        "lecture",
    ),
    _entry("05", "course/05-mixed-precision.ipynb", "Mixed Precision Training", "lecture"),
    _entry(
        "06",
        "course/06-fault-tolerance.ipynb",
        "Fault Tolerance and Checkpointing",
        "lecture",
        "ray",
    ),
    _entry("07", "course/07-performance-optimization.ipynb", "Performance Optimization", "lecture"),
    _entry(
        "lab01",
        "solutions/lab01-ray-train.ipynb",
        "Lab 01: Ray Train data-parallel training",
        "lab",
        "ray",
    ),
    _entry(
        "lab02",
        "solutions/lab02-horovod.ipynb",
        "Lab 02: Multi-process training with Horovod",
        "lab",
        "horovod",
    ),
    _entry(
        "lab03",
        "solutions/lab03-fault-tolerant.ipynb",
        "Lab 03: Fault-tolerant training",
        "lab",
        "ray",
    ),
    _entry("lab04", "solutions/lab04-profiling.ipynb", "Lab 04: Profiling and optimisation", "lab"),
    _entry("quiz", "quizzes/module-quiz.ipynb", "Module quiz (self-check)", "quiz"),
)


START_HERE: tuple[str, ...] = (
    "01", "02", "02-optuna", "lab01", "03", "04", "lab02", "05", "06", "lab03", "07", "lab04",
    "quiz",
)  # fmt: skip
"""The order to take the notebooks in (README's "Start here"): each uses what came before."""


def in_course_order() -> list[NotebookEntry]:
    """Every notebook, in :data:`START_HERE` order."""
    return [find(name) for name in START_HERE]


def available() -> list[NotebookEntry]:
    """Notebooks that exist in this checkout, in course order."""
    return [nb for nb in NOTEBOOKS if nb.exists]


def find(name: str) -> NotebookEntry:
    """Look a notebook up by short name (``01``, ``lab02``) or by path; raise ValueError if unknown."""
    for nb in NOTEBOOKS:
        if name in (nb.name, nb.path, Path(nb.path).name, Path(nb.path).stem):
            return nb
    known = ", ".join(nb.name for nb in NOTEBOOKS)
    raise ValueError(f"unknown notebook {name!r}; known names: {known}")
