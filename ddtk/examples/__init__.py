"""Complete training jobs that run by themselves with ``python -m ddtk.examples.<name>``.

Each one is the entry point that a lab builds up to and that the manifests under
``deploy/`` run on a cluster, so what a learner runs on the laptop and what the
cluster runs are the same code.

- :mod:`ddtk.examples.ray_digits`: lab 01's job, a CNN on digits with Ray Train V2
  and Ray Data (``deploy/kuberay/rayjob.yaml`` runs it).
"""
