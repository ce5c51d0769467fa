"""The runnable examples in the docstrings of the strategies, compressors and shared pieces.

Each example is what a reader copies first, so each one runs here, on real ranks
where it launches them, and its printed results are checked by doctest.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "ddtk.data",
    "ddtk.models",
    "ddtk.sizes",
    "ddtk.viz.live",
    "ddtk.parallel.data_parallel",
    "ddtk.parallel.parameter_server",
    "ddtk.parallel.ps_store",
    "ddtk.parallel.ps_trainer",
    "ddtk.parallel.federated",
    "ddtk.parallel.local_sgd",
    "ddtk.parallel.elastic",
    "ddtk.parallel.decentralized",
    "ddtk.parallel.kmeans",
    "ddtk.compression",
    "ddtk.compression.base",
    "ddtk.compression.topk",
    "ddtk.compression.randomk",
    "ddtk.compression.qsgd",
    "ddtk.compression.int8",
    "ddtk.compression.sign",
    "ddtk.compression.powersgd",
    "ddtk.compression.error_feedback",
    "ddtk.parallel.tensor_ops",
    "ddtk.parallel.tensor",
    "ddtk.parallel.pipeline",
    "ddtk.parallel.pipeline_schedules",
    "ddtk.viz.pipeline",
    "ddtk.bench.pipeline",
    "ddtk.parallel.zero",
    "ddtk.parallel.fsdp",
    "ddtk.precision",
    "ddtk.precision.loss_scaler",
    "ddtk.precision.autocast",
    "ddtk.precision.numerics",
    "ddtk.memory",
    "ddtk.memory.measure",
    "ddtk.memory.calculator",
    "ddtk.memory.activation_checkpointing",
    "ddtk.parallel.accumulation",
    "ddtk.parallel.dynamic_batching",
    "ddtk.checkpoint",
    "ddtk.checkpoint.atomic",
    "ddtk.checkpoint.manifest",
    "ddtk.checkpoint.state",
    "ddtk.checkpoint.store",
    "ddtk.checkpoint.retention",
    "ddtk.checkpoint.sharded",
    "ddtk.checkpoint.shards",
    "ddtk.checkpoint.layout",
    "ddtk.checkpoint.blobs",
    "ddtk.checkpoint.background",
    "ddtk.checkpoint.incremental",
    "ddtk.bench.checkpoint",
    "ddtk.faults",
    "ddtk.faults.injectors",
    "ddtk.faults.model",
    "ddtk.recovery",
    "ddtk.recovery.common",
    "ddtk.recovery.torchrun_train",
    "ddtk.recovery.horovod_elastic_train",
    "ddtk.recovery.ray_train",
    "ddtk.quiz",
    "ddtk.quiz.model",
    "ddtk.quiz.source",
    "ddtk.quiz.yamllines",
    "ddtk.quiz.values",
    "ddtk.quiz.seeding",
    "ddtk.quiz.answers",
    "ddtk.quiz.grading",
    "ddtk.quiz.codecheck",
    "ddtk.quiz.selfcheck",
    "ddtk.quiz.build",
    "ddtk.quiz.classgrade",
    "ddtk.quiz.cli",
    "ddtk.quiz.files",
    "ddtk.quiz.session",
    "ddtk.quiz.widget",
    "ddtk.course.checks",
    "ddtk.course.judging.audit",
    "ddtk.project.scaling",
    "ddtk.monitoring",
    "ddtk.profiling.intervals",
    "ddtk.profiling.collect",
    "ddtk.examples.digits_data",
    "ddtk.examples.softmax_tuning",
    "ddtk.examples.ray_digits",
    "ddtk.examples.cnn_common",
    "ddtk.frameworks.launchers",
    "ddtk.frameworks.state",
    "ddtk.frameworks.recipes",
    "ddtk.frameworks.horovod_timeline",
    "ddtk.frameworks.horovod_knobs",
    "ddtk.frameworks.ddp_internals",
    "ddtk.frameworks.zero_memory",
]


@pytest.mark.distributed
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, verbose=False, report=True)
    assert result.attempted > 0, f"{name} has no runnable example"
    assert result.failed == 0, f"{result.failed} example(s) of {name} failed (doctest output above)"
