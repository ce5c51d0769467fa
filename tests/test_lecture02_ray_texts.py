"""Lecture 02 quotes Ray's error texts and describes behaviours that no public API exposes.

Each test pins one of them in the installed Ray, so that an upgrade that changes the text or
the behaviour fails here and the lecture's prose (section 3, 4 and Troubleshooting) gets
updated, instead of silently teaching the old version.
"""

from __future__ import annotations

import inspect
import typing

import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")


def test_ray_data_blocks_are_arrow_tables_or_pandas_frames() -> None:
    """Section 3: numpy is a batch format, not a block format."""
    from ray.data.block import Block

    names = {
        getattr(t, "__forward_arg__", getattr(t, "__name__", str(t)))
        for t in typing.get_args(Block)
    }
    assert names == {"pyarrow.Table", "pandas.DataFrame"}, names


def test_owner_died_error_says_the_owner_exited() -> None:
    """Troubleshooting 2 prints this exception live; its explanation comes from ray/exceptions.py."""
    source = inspect.getsource(ray.exceptions.OwnerDiedError)
    assert "The object's owner has exited" in source
    assert issubclass(ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError)


def test_authentication_error_names_the_mode_and_the_token_sources() -> None:
    """Troubleshooting 3 quotes the tail that AuthenticationError appends."""
    text = str(ray.exceptions.AuthenticationError("refused"))
    assert text.startswith("refused.")
    assert "~/.ray/auth_token or via RAY_AUTH_TOKEN_PATH" in text
    assert "`RAY_AUTH_TOKEN` environment variable" in text
    from ray._private.authentication import authentication_constants as constants

    assert constants.TOKEN_AUTH_ENABLED_BUT_NO_TOKEN_FOUND_ERROR_MESSAGE == (
        "Token authentication is enabled but no authentication token was found"
    )


def test_local_ray_init_enables_token_auth_by_default() -> None:
    """Troubleshooting 3: a new local ray.init() cluster turns token authentication on."""
    from ray._private import worker

    assert "enable_token_auth_by_default()" in inspect.getsource(worker.init)


def test_object_store_full_error_text() -> None:
    assert "The local object store is full of objects that are still in scope" in str(
        ray.exceptions.ObjectStoreFullError()
    )


def test_tune_warns_only_when_a_trial_exceeds_the_cluster_total() -> None:
    """Troubleshooting 1: a request that fits the total but no node waits without a warning."""
    from ray.tune.execution import insufficient_resources_manager as irm

    source = inspect.getsource(irm._can_fulfill_no_autoscaler)
    assert "_get_cluster_resources_no_autoscaler()" in source  # cluster totals, not per node
    assert irm.MSG_TUNE_START.startswith("No trial is running and no new trial has been started")
    assert (
        "You asked for {asked_cpus} CPUs and {asked_gpus} GPUs per trial"
        in irm.MSG_TUNE_INSUFFICIENT
    )


def test_train_v2_result_metrics_come_from_the_latest_checkpoint() -> None:
    """Section 4: Result.metrics is the dict reported with the latest checkpoint."""
    controller = pytest.importorskip("ray.train.v2._internal.execution.controller.controller")
    source = inspect.getsource(controller.TrainController._build_result)
    assert "latest_checkpoint_result.metrics" in source


def test_get_dataset_shard_and_get_checkpoint_are_public() -> None:
    import ray.train

    for name in ("get_dataset_shard", "get_checkpoint", "report", "get_context"):
        assert callable(getattr(ray.train, name)), name
