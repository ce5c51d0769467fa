"""ddtk.profiling's analysis on traces written by hand, where every answer is known exactly.

The traces follow the Chrome-trace format torch.profiler writes (``X`` events in
microseconds, ``distributedInfo``, ``baseTimeNanoseconds``): a CPU rank with a
training thread and a gloo thread, and a GPU rank with kernels on a stream. The
real profiler's traces are tested in test_profiling_jobs.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ddtk.profiling import analyse, breakdown, diagnose, load_traces, stragglers
from ddtk.profiling.intervals import intersect, length, subtract, union
from ddtk.profiling.operators import self_times, top_operators
from ddtk.profiling.pyspy import hot_functions
from ddtk.profiling.trace import Event, TraceError, category, load_trace

MAIN, GLOO = 100, 101


def _x(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": tid,
        "args": args,
    }


def _write(folder: Path, rank: int, events: list, world: int = 2, base_ns: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
        "baseTimeNanoseconds": base_ns,
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": MAIN, "args": {}},
            *events,
        ],
    }
    path = folder / f"rank{rank}.json"
    path.write_text(json.dumps(doc))
    return path


def cpu_step(
    t0: float,
    n: int,
    data=100.0,
    issue=650.0,
    comm_end=1060.0,
    opt_at=1050.0,
    opt=100.0,
    step=1200.0,
    bytes_=4000,
    extra=(),
):
    """One CPU step from t0 (µs): data, forward, backward, one all-reduce, optimizer.

    The default 1200 µs: data 0-100, forward 100-400, backward 400-800 (with aten::mm
    410-610 inside); the all-reduce is issued 650-670 on the training thread and runs
    on gloo's thread 660-1060, so 670-800 is hidden under backward and 800-1050 is
    exposed; optimizer 1050-1150 (hiding 1050-1060); idle 1150-1200.
    """
    return [
        _x(f"ProfilerStep#{n}", t0, step, cat="user_annotation"),
        _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, data, cat="user_annotation"),
        _x("DistributedDataParallel.forward", t0 + 100, 300, cat="user_annotation"),
        _x("aten::addmm", t0 + 110, 280, **{"Input type": ["float"]}),
        _x("autograd::engine::evaluate_function: AddmmBackward0", t0 + 400, 400),
        _x("aten::mm", t0 + 410, 200, **{"Input type": ["float"]}),
        _x("c10d::allreduce_", t0 + issue, 20),
        _x("gloo:all_reduce", t0 + issue + 10, comm_end - issue - 10, tid=GLOO, cat="user_annotation",
           **{"Input Dims": [[bytes_ // 4]], "Input type": ["float"]}),
        _x("Optimizer.step#SGD.step", t0 + opt_at, opt, cat="user_annotation"),
        *extra,
    ]  # fmt: skip


# ---- intervals: against a brute-force reference on a grid ---------------------------------


def _cells(spans, n=80):
    return {i for i in range(n) for a, b in spans if a <= i < b}


@pytest.mark.parametrize("seed", range(25))
def test_interval_algebra_matches_a_grid(seed):
    rng = random.Random(seed)

    def rand_spans():
        return [
            (a, a + rng.randint(0, 12))
            for a in (rng.randint(0, 50) for _ in range(rng.randint(0, 7)))
        ]

    a, b = union(rand_spans()), union(rand_spans())
    assert _cells(union(a + b)) == _cells(a) | _cells(b)
    assert _cells(intersect(a, b)) == _cells(a) & _cells(b)
    assert _cells(subtract(a, b)) == _cells(a) - _cells(b)
    assert length(a) == len(_cells(a))
    assert all(x[1] < y[0] for x, y in zip(union(a + b), union(a + b)[1:]))  # disjoint, sorted


def test_union_of_nothing_and_of_empty_spans():
    assert union([]) == [] and union([(3, 3), (5, 4)]) == []
    assert subtract([], [(0, 1)]) == [] and intersect([(0, 1)], []) == []


# ---- categories and loading ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cat", "expected"),
    [
        (
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            "user_annotation",
            "data",
        ),
        ("ddtk:data", "user_annotation", "data"),
        ("Optimizer.step#AdamW.step", "user_annotation", "optimizer"),
        ("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", "optimizer"),
        ("c10d::allreduce_", "cpu_op", "communication"),
        ("gloo:all_reduce", "user_annotation", "communication"),
        ("nccl:all_reduce", "user_annotation", "communication"),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "kernel",
            "communication",
        ),
        ("ddtk:comm", "user_annotation", "communication"),
        ("aten::addmm", "cpu_op", "compute"),
        ("ampere_sgemm_128x64_tn", "kernel", "compute"),
        ("ProfilerStep#7", "user_annotation", None),
    ],
)
def test_every_event_gets_the_category_pytorch_names_imply(name, cat, expected):
    assert category(Event(name, cat, 0.0, 5.0, 1)) == expected


def test_load_trace_finds_rank_clock_steps_and_training_thread(tmp_path):
    path = _write(tmp_path, 1, cpu_step(0, 3) + cpu_step(1200, 4), base_ns=5_000_000)
    t = load_trace(path)
    assert (t.rank, t.world_size, t.backend, t.main_tid) == (1, 2, "gloo", MAIN)
    assert t.step_numbers() == [3, 4]
    assert t.steps[0].ts == 5000.0  # ts + baseTimeNanoseconds / 1000: one clock for all ranks


def test_rank_falls_back_to_the_file_name(tmp_path):
    p = tmp_path / "trace_rank_5.json"
    p.write_text(json.dumps({"traceEvents": cpu_step(0, 1)}))
    assert load_trace(p).rank == 5


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "not a readable Chrome trace"),
        (json.dumps({"foo": 1}), "no 'traceEvents'"),
        (json.dumps({"traceEvents": [_x("aten::mm", 0, 5)]}), "no ProfilerStep#N events"),
    ],
)
def test_bad_trace_files_are_named_with_the_reason(tmp_path, content, match):
    p = tmp_path / "rank0.json"
    p.write_text(content)
    with pytest.raises(TraceError, match=match) as info:
        load_trace(p)
    assert str(p) in str(info.value)


def test_load_traces_refuses_an_empty_folder_and_duplicate_ranks(tmp_path):
    with pytest.raises(TraceError, match=r"no \*\.json traces"):
        load_traces(tmp_path)
    _write(tmp_path / "a", 0, cpu_step(0, 1))
    (tmp_path / "a" / "copy.json").write_text((tmp_path / "a" / "rank0.json").read_text())
    with pytest.raises(TraceError, match="same rank"):
        load_traces(tmp_path / "a")


# ---- the breakdown of a CPU step -----------------------------------------------------------


def test_cpu_step_breakdown_is_exact(tmp_path):
    _write(tmp_path, 0, cpu_step(0, 1))
    row = breakdown(load_traces(tmp_path)).rows[0]
    assert row.step_ms == pytest.approx(1.2)
    assert row.data_ms == pytest.approx(0.1)
    assert row.compute_ms == pytest.approx(
        0.7 - 0.02
    )  # forward + backward, less the 20 µs issuing the all-reduce
    assert row.communication_ms == pytest.approx(
        0.02 + 0.25
    )  # the issue call, then 800-1050 exposed
    assert row.optimizer_ms == pytest.approx(0.1)
    assert row.idle_ms == pytest.approx(0.05)
    parts = row.compute_ms + row.communication_ms + row.data_ms + row.optimizer_ms + row.idle_ms
    assert parts == pytest.approx(row.step_ms)
    assert row.comm_total_ms == pytest.approx(0.41)  # issue 650-670 and gloo 660-1060, as one union
    assert row.overlap == pytest.approx(
        0.14 / 0.41
    )  # 670-800 under backward, 1050-1060 under the optimizer
    assert (row.collectives, row.comm_bytes) == (1, 4000)
    assert (row.forwards, row.synced_forwards, row.fp32_matmul) == (1, 1, 1.0)


def test_empty_step_and_step_with_nothing_but_idle(tmp_path):
    _write(tmp_path, 0, [_x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
                         _x("ProfilerStep#2", 1000, 0, cat="user_annotation")])  # fmt: skip
    rows = breakdown(load_traces(tmp_path)).rows
    assert rows[0].idle_ms == pytest.approx(1.0) and rows[0].compute_ms == 0
    assert rows[1].step_ms == 0 and rows[1].share("idle") == 0.0 and rows[1].overlap == 0.0


def test_skip_first_drops_steps_and_breakdown_needs_traces(tmp_path):
    _write(tmp_path, 0, cpu_step(0, 1) + cpu_step(1200, 2))
    assert [r.step for r in breakdown(load_traces(tmp_path), skip_first=1).rows] == [2]
    with pytest.raises(ValueError, match="at least one trace"):
        breakdown([])


# ---- a GPU step: the device decides --------------------------------------------------------


def test_gpu_trace_uses_kernels_for_compute_and_nccl_kernels_for_communication(tmp_path):
    k = {"cat": "kernel", "tid": 7}
    events = [
        _x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 200, cat="user_annotation"),
        _x("aten::mm", 200, 50),  # host launches are not compute on a GPU trace
        _x("Optimizer.step#SGD.step", 850, 100, cat="user_annotation"),
        _x("ampere_sgemm_128x64_tn", 150, 450, **k),  # runs while the host is still fetching (150-200)
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 500, 300, **k, **{"In msg nelems": 1000, "dtype": "Float"}),
    ]  # fmt: skip
    _write(tmp_path, 0, events)
    t = load_traces(tmp_path)[0]
    assert t.on_device
    row = breakdown([t]).rows[0]
    assert row.compute_ms == pytest.approx(0.45)  # 150-600
    assert row.communication_ms == pytest.approx(
        0.2
    )  # 600-800: the NCCL kernel after compute ended
    assert row.data_ms == pytest.approx(
        0.15
    )  # 0-150: the GPU had nothing to do while the host fetched
    assert row.optimizer_ms == pytest.approx(0.1)
    assert row.idle_ms == pytest.approx(0.1)  # 800-850 and 950-1000
    assert row.overlap == pytest.approx(100 / 300)
    assert (row.collectives, row.comm_bytes) == (1, 4000)


# ---- stragglers, spread and the diagnosis --------------------------------------------------


def _job(tmp_path, world=3, slow_rank=2, extra_us=600.0, data=100.0):
    """``world`` ranks, 2000 µs steps; ``slow_rank`` computes ``extra_us`` more (800-1400) and
    issues its all-reduce late, so the others' all-reduce waits for it until 1610."""
    for r in range(world):
        evs = []
        for n in range(3):
            t0 = n * 2000.0
            if r == slow_rank:
                evs += cpu_step(t0, n, data=data, issue=800 + extra_us, comm_end=1010 + extra_us,
                                opt_at=1700, step=2000.0, extra=[_x("aten::mm", t0 + 800, extra_us)])  # fmt: skip
            else:
                evs += cpu_step(
                    t0, n, data=data, issue=800, comm_end=1010 + extra_us, opt_at=1700, step=2000.0
                )
        _write(tmp_path, r, evs, world=world)
    return load_traces(tmp_path)


def test_straggler_is_named_and_others_are_not(tmp_path):
    bd = breakdown(_job(tmp_path))
    found = stragglers(bd)
    assert [s["rank"] for s in found] == [2]
    assert found[0]["busy_ms"] - found[0]["others_ms"] == pytest.approx(
        0.6
    )  # exposed: 0.21 against 0.81 ms
    kinds = [f.kind for f in diagnose(bd)]
    assert (
        kinds[0] == "straggler" and "communication" not in kinds
    )  # waiting for the straggler is not a link problem


def test_no_straggler_with_one_rank_or_equal_ranks(tmp_path):
    assert stragglers(breakdown(_job(tmp_path / "one", world=1, slow_rank=None))) == []
    assert stragglers(breakdown(_job(tmp_path / "eq", world=3, slow_rank=None))) == []


def test_input_bound_diagnosis_names_the_share_and_the_fix(tmp_path):
    bd = breakdown(_job(tmp_path, world=2, slow_rank=None, data=900.0))
    top = diagnose(bd)[0]
    assert top.kind == "input" and top.ranks == (0, 1)
    assert "data loading is 45% of the step on every rank (0.9 ms of 2.0 ms)" in top.message
    assert "num_workers" in top.message


def test_small_messages_and_sync_per_microbatch(tmp_path):
    for r in range(2):
        evs = [_x("ProfilerStep#1", 0, 10_000, cat="user_annotation")]
        for m in range(4):  # 4 micro-batches, each followed by 2 all-reduces of 256 KiB
            t0 = m * 2400.0
            evs += [_x("DistributedDataParallel.forward", t0, 400, cat="user_annotation"),
                    _x("aten::mm", t0 + 400, 400)]  # fmt: skip
            for b in range(2):
                evs += [_x("c10d::allreduce_", t0 + 800 + 700 * b, 10),
                        _x("gloo:all_reduce", t0 + 810 + 700 * b, 600, tid=GLOO, cat="user_annotation",
                           **{"Input Dims": [[65536]], "Input type": ["float"]})]  # fmt: skip
        _write(tmp_path, r, evs)
    bd = breakdown(load_traces(tmp_path))
    assert bd.rows[0].collectives == 8 and bd.rows[0].comm_bytes == 8 * 262144
    assert (bd.rows[0].forwards, bd.rows[0].synced_forwards) == (4, 4)
    kinds = {f.kind: f for f in diagnose(bd)}
    assert {"communication", "small-messages", "sync-per-microbatch"} <= set(kinds)
    assert "8 collectives per step averaging 256 KiB" in kinds["small-messages"].message
    assert "after 4 of the 4 micro-batches" in kinds["sync-per-microbatch"].message


def test_precision_finding_needs_compute_bound_fp32(tmp_path):
    evs = [_x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
           _x("aten::mm", 0, 900, **{"Input type": ["float"]})]  # fmt: skip
    _write(tmp_path / "fp32", 0, evs, world=1)
    assert [f.kind for f in diagnose(breakdown(load_traces(tmp_path / "fp32")))] == ["precision"]
    evs[1] = _x("aten::mm", 0, 900, **{"Input type": ["c10::BFloat16"]})
    _write(tmp_path / "bf16", 0, evs, world=1)
    assert diagnose(breakdown(load_traces(tmp_path / "bf16"))) == []


def test_spread_is_the_gap_between_ranks_per_step(tmp_path):
    _write(tmp_path, 0, cpu_step(0, 1, step=1200.0))
    _write(tmp_path, 1, cpu_step(0, 1, step=1500.0))
    assert breakdown(load_traces(tmp_path)).spread() == {
        "mean_ms": pytest.approx(0.3),
        "max_ms": pytest.approx(0.3),
    }


# ---- operators and the whole analysis ------------------------------------------------------


def test_self_time_subtracts_children():
    outer = Event("aten::linear", "cpu_op", 0, 100, 1)
    inner = Event("aten::addmm", "cpu_op", 10, 80, 1)
    leaf = Event("aten::copy_", "cpu_op", 20, 5, 1)
    got = {e.name: s for e, s in self_times([leaf, outer, inner])}
    assert got == {"aten::linear": 20, "aten::addmm": 75, "aten::copy_": 5}


def test_top_operators_and_analyse(tmp_path):
    _write(tmp_path, 0, cpu_step(0, 1) + cpu_step(1200, 2))
    ops = top_operators(load_traces(tmp_path)[0], n=3)
    assert [(o.name, o.calls_per_step) for o in ops] == [
        ("aten::addmm", 1),
        ("aten::mm", 1),
        ("autograd::engine::evaluate_function: AddmmBackward0", 1),
    ]
    assert [o.self_ms_per_step for o in ops] == pytest.approx(
        [0.28, 0.2, 0.18]
    )  # backward: 400 - mm - issue
    a = analyse(tmp_path)
    text = a.text()
    assert "step-time breakdown" in text and "diagnosis:" in text and "aten::mm" in text
    d = a.as_dict()
    assert d["per_rank"][0]["steps"] == 2 and len(d["steps"]) == 2
    json.dumps(d)


def test_hot_functions_name_the_rank_process_not_the_launcher(tmp_path):
    raw = tmp_path / "raw.txt"
    launcher = 'process 10:"python -m ddtk.profiling.jobs slow"'
    raw.write_text(
        f"{launcher};<module> (jobs.py:1);run_job (jobs.py:330) 5\n"
        f'{launcher};process 11:"python -m ddtk._rank";main (_rank.py:9);__call__ (jobs.py:179) 30\n'
        f'{launcher};process 12:"python -m ddtk._rank";main (_rank.py:9);__call__ (jobs.py:179) 20\n'
        f'{launcher};process 12:"python -m ddtk._rank";main (_rank.py:9);backward (graph.py:9) 8\n'
        "not a sample line\n"
    )
    assert hot_functions(raw, n=2) == [("__call__ (jobs.py:179)", 50), ("backward (graph.py:9)", 8)]
    per = dict(hot_functions(raw, n=10, per_process=True))
    assert per['process 11:"python -m ddtk._rank" __call__ (jobs.py:179)'] == 30
    assert per['process 12:"python -m ddtk._rank" __call__ (jobs.py:179)'] == 20
    assert per[f"{launcher} run_job (jobs.py:330)"] == 5
