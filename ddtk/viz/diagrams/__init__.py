"""Diagrams of the structures the lectures explain, drawn by code so they stay true.

One module per subject; each public ``draw_*`` function takes keyword parameters with
defaults and returns a :class:`matplotlib.figure.Figure` (the notebook shows it, and the
executed notebook keeps it as a PNG). Where a diagram can be computed from ddtk's own
code (a schedule, a tree's sends, DDP's bucket assignment), it is, so the picture
changes when the code does.

- :mod:`~ddtk.viz.diagrams.collectives`: ddtk's binomial-tree all-reduce, traced from
  :mod:`ddtk.comm.tree`, and NCCL's double binary tree (lecture 01);
- :mod:`~ddtk.viz.diagrams.ray`: Ray's architecture and Ray Train V2's controller and
  worker group (lecture 02);
- :mod:`~ddtk.viz.diagrams.ddp`: DDP's buckets overlapping the backward pass, and
  Horovod's background thread, coordinator and fusion buffer (lecture 03);
- :mod:`~ddtk.viz.diagrams.network`: a rail-optimised fat tree, NCCL's tree, and the two
  forms of hierarchical all-reduce (lecture 04);
- :mod:`~ddtk.viz.diagrams.precision`: the bit layouts of the floating-point formats
  (lecture 05);
- :mod:`~ddtk.viz.diagrams.checkpointing`: the checkpoint commit protocol and elastic
  training's timeline (lecture 06);
- :mod:`~ddtk.viz.diagrams.pipeline_schedules`: GPipe, 1F1B and interleaved 1F1B with
  their bubbles (lecture 07).
"""
