"""The final project's automatic checker: ``ddtk project check DIR``.

A submission is a folder with a ``project.yaml`` (:mod:`~ddtk.project.manifest`)
naming a training program run under torchrun, its outputs and its reports. The
rubric (:mod:`~ddtk.project.rubric`, ``project/rubric.yaml``) lists the criteria;
:mod:`~ddtk.project.check` scores the automatic ones by running the program
(:mod:`~ddtk.project.run`, :mod:`~ddtk.project.procs`), killing one of its ranks
(:mod:`~ddtk.project.sigkill`), rerunning its scaling study
(:mod:`~ddtk.project.scaling`) and recomputing its design document's numbers
(:mod:`~ddtk.project.designdoc`); :mod:`~ddtk.project.report` writes JSON and a table.

Nothing is imported here, so ``ddtk --help`` stays fast: import the modules.
"""
