"""Training strategies, one per file, all sharing :class:`~ddtk.parallel.trainer.DistributedTrainer`."""
