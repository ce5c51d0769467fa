"""The frameworks of lecture 03 and lab 02, run for real and measured side by side.

- :mod:`ddtk.frameworks.launchers`: run ``torchrun``, ``horovodrun``, ``deepspeed``
  and TensorFlow workers from Python with live output and no orphans.
- :mod:`ddtk.frameworks.horovod_timeline`: parse a Horovod timeline, time per phase, fused groups, plot.
- :mod:`ddtk.frameworks.horovod_knobs`: sweep ``HOROVOD_CYCLE_TIME`` and the fusion threshold under horovodrun.
- :mod:`ddtk.frameworks.ddp_internals`: DDP's real buckets, its flags and comm hooks, measured on ranks.
- :mod:`ddtk.frameworks.zero_memory`: DeepSpeed ZeRO 1/2/3 model-state bytes per rank vs the formula.
- :mod:`ddtk.frameworks.tf_mwms`: TensorFlow ``MultiWorkerMirroredStrategy`` workers, one process each.
- :mod:`ddtk.frameworks.state`: the model-state bytes a rank really holds, whatever the framework's layout.
- :mod:`ddtk.frameworks.recipes`: lines changed from single-process code, by ``difflib``.
- :mod:`ddtk.frameworks.compare_job` and :mod:`ddtk.frameworks.compare`: every framework on the
  same model, data and steps, interleaved (``ddtk bench frameworks``).
"""
