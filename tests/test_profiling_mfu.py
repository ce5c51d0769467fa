"""Model FLOPs, MFU and run sizing (:mod:`ddtk.profiling.mfu`): pure arithmetic, so every
test compares with numbers worked out by hand or with the same quantity reached by
another route, and checks that each bad input is refused with its name in the message.
"""

from __future__ import annotations

import math
import random

import pytest

from ddtk.profiling.mfu import (
    CHINCHILLA_TOKENS_PER_PARAM,
    H100_SXM_BF16_DENSE_TFLOPS,
    RunSize,
    model_flops_utilization,
    size_run,
    training_flops,
)

VALID = {
    "tokens_per_param": 20,
    "peak_tflops": 989.0,
    "mfu": 0.4,
    "gpus": 1024,
    "usd_per_gpu_hour": 4.0,
}


def test_training_flops_is_two_forward_plus_four_backward_per_parameter_and_token() -> None:
    assert training_flops(1e9, 2e10) == 1.2e20
    forward, backward = 2 * 1e9 * 2e10, 4 * 1e9 * 2e10
    assert training_flops(1e9, 2e10) == forward + backward


def test_size_run_matches_a_run_worked_out_by_hand() -> None:
    # 1e9 parameters x 30 tokens = 3e10 tokens; C = 6 * 1e9 * 3e10 = 1.8e20 FLOPs;
    # 1,000 TFLOP/s at 50% = 5e14 FLOP/s per GPU -> 3.6e5 GPU-seconds = 100 GPU-hours;
    # on 25 GPUs 4 hours = 1/6 day; at 2.50 USD per GPU-hour, 250 USD.
    run = size_run(
        1e9, tokens_per_param=30, peak_tflops=1000, mfu=0.5, gpus=25, usd_per_gpu_hour=2.5
    )
    assert run == RunSize(tokens=3e10, flops=1.8e20, gpu_hours=pytest.approx(100.0),
                          days=pytest.approx(1 / 6), cost_usd=pytest.approx(250.0))  # fmt: skip
    assert run.as_dict() == {"tokens": 3e10, "flops": 1.8e20, "gpu_hours": run.gpu_hours,
                             "days": run.days, "cost_usd": run.cost_usd}  # fmt: skip


def test_the_defaults_are_chinchilla_tokens_on_an_h100() -> None:
    assert (CHINCHILLA_TOKENS_PER_PARAM, H100_SXM_BF16_DENSE_TFLOPS) == (20, 989.0)
    default = size_run(7e9, mfu=0.4, gpus=8, usd_per_gpu_hour=1.0)
    assert default == size_run(7e9, tokens_per_param=20, peak_tflops=989.0, mfu=0.4, gpus=8,
                               usd_per_gpu_hour=1.0)  # fmt: skip
    assert default.tokens == 1.4e11 and default.flops == pytest.approx(120 * 7e9**2)


def test_size_run_agrees_with_its_parts_computed_another_way() -> None:
    rng = random.Random(7)
    for _ in range(50):
        params = 10 ** rng.uniform(7, 12)
        case = {"tokens_per_param": rng.uniform(1, 400), "peak_tflops": rng.uniform(10, 3000),
                "mfu": rng.uniform(0.05, 1.0), "gpus": rng.randint(1, 20000),
                "usd_per_gpu_hour": rng.uniform(0, 10)}  # fmt: skip
        run = size_run(params, **case)
        # seconds per GPU at the achieved rate, summed over the GPUs that share the work
        wall_s = run.flops / (case["gpus"] * case["peak_tflops"] * 1e12 * case["mfu"])
        assert math.isclose(run.days, wall_s / 86400, rel_tol=1e-12)
        assert math.isclose(run.gpu_hours, run.days * 24 * case["gpus"], rel_tol=1e-12)
        assert math.isclose(run.cost_usd, run.gpu_hours * case["usd_per_gpu_hour"], rel_tol=1e-12)
        # the job's own throughput gives back the MFU it was sized at
        tokens_per_s = run.tokens / wall_s
        got = model_flops_utilization(
            training_flops(params, 1), tokens_per_s, case["peak_tflops"], case["gpus"]
        )
        assert math.isclose(got, case["mfu"], rel_tol=1e-9)


def test_compute_grows_as_n_squared_and_time_as_one_over_mfu() -> None:
    small, big = (size_run(n, **VALID) for n in (1e9, 1e10))
    assert big.gpu_hours == pytest.approx(100 * small.gpu_hours)
    half = size_run(1e9, **(VALID | {"mfu": 0.2}))
    assert half.gpu_hours == pytest.approx(2 * small.gpu_hours)
    assert half.cost_usd == pytest.approx(2 * small.cost_usd)
    twice_the_gpus = size_run(1e9, **(VALID | {"gpus": 2048}))
    assert twice_the_gpus.days == pytest.approx(small.days / 2)
    assert twice_the_gpus.gpu_hours == small.gpu_hours  # the GPU-hours do not depend on the count


def test_the_edges_are_allowed() -> None:
    one = size_run(1.0, tokens_per_param=1, peak_tflops=1e-12, mfu=1.0, gpus=1, usd_per_gpu_hour=0)
    assert one == RunSize(
        tokens=1.0, flops=6.0, gpu_hours=6 / 3600, days=6 / 3600 / 24, cost_usd=0.0
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"params": 0}, "params must be a finite number above 0"),
        ({"params": -7e9}, "params must be a finite number above 0"),
        ({"params": math.nan}, "params"),
        ({"params": math.inf}, "params"),
        ({"params": "7e9"}, "params must be a number"),
        ({"params": True}, "params must be a number"),
        ({"mfu": 0.0}, "mfu"),
        ({"mfu": -0.3}, "mfu"),
        ({"mfu": 1.0001}, "mfu is a fraction in (0, 1]"),
        ({"mfu": 40}, "40% is 0.4, not 40"),
        ({"mfu": math.nan}, "mfu"),
        ({"gpus": 0}, "gpus must be a whole number of at least 1"),
        ({"gpus": -8}, "gpus"),
        ({"gpus": 2.5}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"tokens_per_param": 0}, "tokens_per_param"),
        ({"peak_tflops": -989}, "peak_tflops"),
        ({"usd_per_gpu_hour": -1.0}, "usd_per_gpu_hour must be finite and at least 0"),
        ({"usd_per_gpu_hour": math.inf}, "usd_per_gpu_hour"),
        ({"usd_per_gpu_hour": None}, "usd_per_gpu_hour must be a number"),
    ],
)
def test_bad_input_is_refused_by_name(change: dict, words: str) -> None:
    args = {"params": 7e9, **VALID} | change
    with pytest.raises(ValueError) as err:
        size_run(args.pop("params"), **args)
    assert words in str(err.value)


def test_mfu_by_hand_and_above_one_reported_not_hidden() -> None:
    # 6e6 FLOPs per sample (1e6 parameters) at 1e6 samples/s: 6e12 FLOP/s over 2 devices
    # of 10 TFLOP/s = 30%
    assert model_flops_utilization(6e6, 1e6, 10.0, devices=2) == pytest.approx(0.3)
    assert model_flops_utilization(6e6, 1e6, 1.0) == pytest.approx(6.0)  # a peak that is not one
    for devices in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="devices"):
            model_flops_utilization(6e6, 1e6, 10.0, devices=devices)
    with pytest.raises(ValueError, match="flops_per_token"):
        model_flops_utilization(-6e6, 1e6, 10.0)
    with pytest.raises(ValueError, match="tokens_per_s"):
        model_flops_utilization(6e6, 0, 10.0)
    with pytest.raises(ValueError, match="peak_tflops"):
        model_flops_utilization(6e6, 1e6, 0)
