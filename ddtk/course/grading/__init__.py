"""``ddtk course grade``: grade a class's lab notebooks by running them.

One concept per module, in the order a class goes through them:

- :mod:`.submissions`: find each student's notebook, turn a bad file into a reason;
- :mod:`.restore`: put the instructor's check and parameters cells back;
- :mod:`.sandbox` (with :mod:`.jail` and :mod:`.limits`): run one notebook in a fresh,
  confined kernel and folder, with time, memory, task, disk and output limits, and kill
  everything it started;
- :mod:`.score`: each check cell's outcome as the exercises' pass, fail or error, and
  the verdicts of the exercises judged outside the kernel (:mod:`ddtk.course.judging`);
- :mod:`.classgrade`: the class, with identical notebooks run once;
- :mod:`.report`: ``results.json`` per student, ``grades.csv``, ``results.json``, the table.
"""
