"""How ``pytest -n 2`` (``make test``) shares the tests between its workers.

Each test belongs to a **group** that one worker runs whole, in collection order
(:func:`group_of`):

- everything that starts Ray is one group: two Ray clusters at once would compete for
  2 cores and share ``/tmp/ray``'s session link; lab 01's and lab 03's tests run in it
  after their graded classes, whose runs they read back (``build/executed``). The
  notebooks start Ray clusters of their own rather than share one with the tests: a
  notebook is tested as a learner runs it, alone, and starting and stopping its own
  cluster is part of what it teaches (lecture 02 also attaches to a running one, in
  ``tests/test_notebooks.py``); ``tests/test_recovery_ray.py`` shares one session
  between its module's tests;
- lab 02's and lab 04's graded classes and tests are a group each, for the same reading
  back (with the instructor's flow of ``tests/test_release.py``, which grades lab 04); the rest of ``tests/test_course_grade.py`` (a tiny lab's rules and class) starts
  no Ray and is a group of its own, off the Ray group, which bounds the suite's time;
- lab 02's group and lecture 03 (``AFTER_RAY``) start only once the Ray group has
  finished, unless nothing else is left to run, and then before any other group: lab 02's
  four Horovod processes beside a Ray cluster's start have pushed a raylet past Ray's
  fixed 30 s registration wait, and left last, it kept one worker busy for 7 minutes
  while the other idled before the exclusive groups; lecture 03's Horovod sweep, beside
  the Ray group's lab classes, took 156 s instead of 7 and aborted;
- **exclusive** groups measure time, where a busy neighbour is an error in the
  measurement, not a slower test: the emulated networks, and the final project's
  checker, whose scaling study reruns the reference at 1, 2 and 4 ranks and compares
  the speedups with the ones reported (a 1-rank rerun slowed by the other worker read
  a 2-rank speedup of 3.0 against 0.82), and the communication-bound profile, whose
  shares of the step a neighbour skews. They run at the end, alone, once every other
  worker has finished;
- any other test file is a group, so a module's fixtures are built once and a notebook
  under nbval keeps its cells in one kernel, in order.

``make test`` runs two workers (``TEST_JOBS=2``); ``TEST_JOBS=0`` runs every test in
one process, in collection order.

xdist's own ``--dist loadgroup`` cannot be used: it renames node ids through an
attribute pytest 9 no longer reads. :func:`scheduler` returns xdist's scope scheduler
with these groups as scopes instead.
"""

from __future__ import annotations

from typing import Any

RAY_GROUP = "ray"
RAY_FILES = frozenset({
    "tests/test_course_grade.py", "tests/test_lab01.py", "tests/test_lab03.py",
    "tests/test_notebooks.py", "tests/test_recovery_ray.py", "tests/test_ray_procs.py",
    "tests/test_lecture02_ray_texts.py",
    "course/02-ray.ipynb", "course/appendix/02-optuna.ipynb", "course/06-fault-tolerance.ipynb",
})  # fmt: skip
LAB_GROUPS = {"tests/test_lab02.py": "lab02", "tests/test_lab04.py": "lab04"}
# single tests that grade a real lab: they go after its class, whose runs they read back
GRADES_A_LAB = {
    "tests/test_release.py::test_the_instructors_flow_release_collect_grade_export": "lab04",
}
# groups that wait for the Ray group to finish: lab 02's, and lecture 03, whose horovodrun
# sweep took 156 s instead of 7 and aborted (exit 134) beside the Ray group's lab classes
AFTER_RAY = frozenset({"lab02", "course/03-horovod-and-ddp.ipynb"})
GRADE_FILE = "tests/test_course_grade.py"  # its real-lab classes go with their labs' tests
RAY_LABS = ("lab01", "lab03")  # the labs whose runs start Ray clusters
EXCLUSIVE_FILES = frozenset({
    "tests/test_net_emulate.py", "tests/test_net_shaping.py", "tests/test_project.py",
    "tests/test_profiling_comm.py", "course/04-nccl-and-networking.ipynb",
})  # fmt: skip
EXCLUSIVE_PREFIX = "exclusive:"


def group_of(nodeid: str) -> str:
    """The group of the test ``nodeid`` (see the module docstring)."""
    path = nodeid.split("::", 1)[0]
    if nodeid in GRADES_A_LAB:
        return GRADES_A_LAB[nodeid]
    if path == GRADE_FILE:
        for lab in LAB_GROUPS.values():
            if f"[{lab}]" in nodeid:
                return lab
        if not any(f"[{lab}]" in nodeid for lab in RAY_LABS):
            return path  # the tiny lab's class and the restoration rules start no Ray
    if path in LAB_GROUPS:
        return LAB_GROUPS[path]
    if path in RAY_FILES:
        return RAY_GROUP
    if path in EXCLUSIVE_FILES:
        return EXCLUSIVE_PREFIX + path
    return path


def scheduler(config: Any, log: Any) -> Any:
    """xdist's scope scheduler with :func:`group_of` as the scope: ``AFTER_RAY`` waits for the
    Ray group, exclusive groups go last."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Exclusive scopes wait for a worker that is alone: the others are shut down first."""

        runner: Any = None  # the worker kept for the exclusive scopes

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _ray_pending(self) -> bool:
            """The Ray group is still queued, or some of its tests have not finished."""
            return RAY_GROUP in self.workqueue or any(
                not all(work[RAY_GROUP].values())
                for work in self.assigned_work.values()
                if RAY_GROUP in work
            )

        def _assign_work_unit(self, node: Any) -> None:
            shared = [s for s in self.workqueue if not s.startswith(EXCLUSIVE_PREFIX)]
            if shared:
                waiting = self._ray_pending()  # AFTER_RAY groups wait, then go first
                ready = [s for s in shared if (s in AFTER_RAY) != waiting]
                self.workqueue.move_to_end((ready or shared)[0], last=False)
                super()._assign_work_unit(node)
                return
            if self.runner is None:
                self.runner = node  # waits, holding its last test, until it is alone
            elif node is not self.runner:
                node.shutdown()
            self._start_exclusive()

        def remove_node(self, node: Any) -> Any:
            crashed = super().remove_node(node)
            if node is self.runner:
                self.runner = None
            self._start_exclusive()
            return crashed

        def _start_exclusive(self) -> None:
            """Give every exclusive scope to the runner once no other worker is left."""
            if self.runner is None or any(n is not self.runner for n in self.assigned_work):
                return
            while self.workqueue:
                super()._assign_work_unit(self.runner)
            self.runner.shutdown()

    return GroupScheduling(config, log)


__all__ = [
    "AFTER_RAY",
    "EXCLUSIVE_FILES",
    "GRADE_FILE",
    "LAB_GROUPS",
    "RAY_FILES",
    "RAY_GROUP",
    "RAY_LABS",
    "group_of",
    "scheduler",
]
