"""Tests for ddtk.viz: the ring all-reduce stepper and the shared plot helpers.

The stepper's state is replayed from ``ddtk.comm.ring.ring_schedule``, so these tests
also pin down the schedule's meaning: after the reduce-scatter half every rank owns a
different fully reduced chunk, and after all ``2(n-1)`` steps every rank owns them all.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from ddtk.comm.ring import ring_schedule
from ddtk.viz import plots
from ddtk.viz import ring_stepper as rs

WORLD_SIZES = [2, 3, 4, 5, 6]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_every_rank_ends_with_every_chunk_fully_reduced(n: int) -> None:
    schedule = ring_schedule(n)
    assert len(schedule) == 2 * (n - 1)
    final = rs.ring_states(schedule, n)[-1]
    everyone = frozenset(range(n))
    assert all(chunk == everyone for row in final for chunk in row)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_reduce_scatter_half_leaves_one_distinct_full_chunk_per_rank(n: int) -> None:
    schedule = ring_schedule(n)
    mid = rs.ring_states(schedule[: n - 1], n)[-1]
    everyone = frozenset(range(n))
    full = [[c for c, contrib in enumerate(row) if contrib == everyone] for row in mid]
    assert all(len(chunks) == 1 for chunks in full), full
    assert sorted(chunks[0] for chunks in full) == list(range(n))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_no_state_before_the_end_is_complete(n: int) -> None:
    states = rs.ring_states(ring_schedule(n), n)
    everyone = frozenset(range(n))
    for state in states[:-1]:
        assert not all(chunk == everyone for row in state for chunk in row)


def test_reduce_scatter_counts_grow_by_one_per_step() -> None:
    n = 4
    states = rs.ring_states(ring_schedule(n), n)
    # The chunk a rank receives in reduce-scatter step s ends with s + 2 contributions.
    for s, step in enumerate(ring_schedule(n)[: n - 1]):
        for st in step:
            assert len(states[s + 1][st.rank][st.recv_chunk]) == s + 2


def test_inconsistent_schedule_is_rejected() -> None:
    n = 4
    schedule = ring_schedule(n)
    broken = [list(step) for step in schedule]
    broken[0][1] = replace(broken[0][1], recv_chunk=(broken[0][1].recv_chunk + 1) % n)
    with pytest.raises(ValueError, match="expects chunk"):
        rs.ring_states(broken, n)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_figure_has_one_panel_per_step_plus_final(n: int) -> None:
    fig = rs.ring_steps_figure(n)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2 * (n - 1) + 1
    assert fig.axes[-1].get_title().startswith("done")
    assert "reduce-scatter" in fig.axes[0].get_title()
    assert "all-gather" in fig.axes[n - 1].get_title()


def test_draw_ring_step_marks_one_sent_chunk_per_rank() -> None:
    n = 4
    schedule = ring_schedule(n)
    _fig, ax = plt.subplots()
    rs.draw_ring_step(ax, schedule, 0, n)
    red_edges = [p for p in ax.patches if p.get_linewidth() > 2]
    assert len(red_edges) == n  # one highlighted chunk square per rank
    with pytest.raises(ValueError):
        rs.draw_ring_step(ax, schedule, len(schedule) + 1, n)


def test_describe_step_names_every_rank() -> None:
    text = rs.describe_step(ring_schedule(3), 0, 3)
    assert text.count("\n") == 2
    assert "adds it to" in text
    assert "overwrites" in rs.describe_step(ring_schedule(3), 2, 3)


def test_widget_builds_and_steps() -> None:
    widgets = pytest.importorskip("ipywidgets")
    w = rs.ring_stepper(4)
    assert isinstance(w, widgets.VBox)
    controls, _out = w.children
    play, slider = controls.children
    assert slider.max == 6 and play.max == 6
    slider.value = 3  # triggers a redraw; must not raise
    slider.value = 6


def test_stepper_falls_back_to_static_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # makes `import ipywidgets` fail
    assert isinstance(rs.ring_stepper(3), Figure)


# ---------------------------------------------------------------- plots


@pytest.mark.parametrize("s", [0.0, 0.05, 0.3, 0.9])
def test_fit_serial_fraction_recovers_amdahl(s: float) -> None:
    ns = [1, 2, 4, 8]
    speedups = [plots.amdahl_speedup(n, s) for n in ns]
    assert plots.fit_serial_fraction(ns, speedups) == pytest.approx(s, abs=1e-9)


def test_fit_serial_fraction_needs_more_than_one_rank() -> None:
    with pytest.raises(ValueError):
        plots.fit_serial_fraction([1], [1.0])


def test_amdahl_limits() -> None:
    assert plots.amdahl_speedup(1, 0.3) == pytest.approx(1.0)
    assert plots.amdahl_speedup(10**9, 0.25) == pytest.approx(4.0, rel=1e-6)


def test_format_bytes() -> None:
    assert plots.format_bytes(512) == "512 B"
    assert plots.format_bytes(4096) == "4 KiB"
    assert plots.format_bytes(3 * 2**20) == "3 MiB"
    assert plots.format_bytes(1536) == "1.5 KiB"


def _rows() -> list[dict]:
    rows = []
    for algo, scale in (("ring", 1.0), ("naive", 2.0)):
        for nbytes in (1024, 4096, 16384):
            t = scale * (1e-4 + nbytes * 1e-9)
            rows.append(
                {"algorithm": algo, "nbytes": nbytes, "time_median_s": t, "time_p10_s": 0.9 * t,
                 "time_p90_s": 1.1 * t, "busbw_gbps": nbytes / t / 1e9}
            )  # fmt: skip
    return rows


def test_time_and_busbw_plots_draw_one_line_per_algorithm_and_model() -> None:
    rows = _rows()
    assert plots.algorithms_in(rows) == ["ring", "naive"]
    assert [r["nbytes"] for r in plots.series(list(reversed(rows)), "ring")] == [1024, 4096, 16384]
    _fig, (a, b) = plt.subplots(1, 2)
    plots.plot_time_vs_size(a, rows, models={"ring": lambda m: 1e-4 + m * 1e-9})
    plots.plot_busbw(b, rows, algorithms=["naive"])
    assert len(a.get_lines()) == 3  # ring, naive, ring model
    assert len(b.get_lines()) == 1
    assert a.get_xscale() == "log"


def test_scaling_plot_has_ideal_measured_and_fit() -> None:
    _fig, ax = plt.subplots()
    plots.plot_scaling(ax, [1, 2, 4], [1.0, 1.8, 3.0], serial_fraction=0.1)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[0].startswith("ideal") and "Amdahl" in labels[-1]
    _fig, ax = plt.subplots()
    plots.plot_stacked_times(ax, ["1", "2"], {"compute": [2.0, 1.0], "comm": [0.0, 0.5]})
    assert len(ax.patches) == 4


def test_live_plot_collects_reports_per_rank_and_draws_statically() -> None:
    from ddtk.viz.live import LivePlot

    live = LivePlot(["loss", "accuracy"], kind="step")
    for step in range(1, 4):
        for rank in (0, 1):
            live(rank, {"kind": "step", "step": step, "loss": 1.0 / step + rank})
    live(0, {"kind": "epoch", "epoch": 1, "loss": 99.0})  # filtered out by kind
    live(0, "not a dict")  # ignored
    assert live.data[(1, "loss")] == [(1.0, 2.0), (2.0, 1.5), (3.0, 1.0 + 1 / 3)]
    assert (0, "accuracy") not in live.data
    fig = live.close()  # not in a notebook: returns the figure
    loss_ax, acc_ax = fig.axes
    assert [line.get_label() for line in loss_ax.lines] == ["rank 0", "rank 1"]
    assert list(loss_ax.lines[0].get_ydata()) == [1.0, 0.5, pytest.approx(1 / 3)]
    assert not acc_ax.lines
