"""ddtk.frameworks and the recipes of ddtk.examples: every framework really trains, and agrees.

The recipes (``cnn_ddp``, ``cnn_horovod``, ``cnn_ddtk``, ``cnn_deepspeed``,
``cnn_tf``) run under their own launchers; Horovod and ddtk's DataParallel
average gradients the same way from the same weights and data, so their
metrics must be equal. The comparison job runs at 1 and 3 ranks (odd, and
19,706 parameters do not divide by 3 for ZeRO's partitions); its frameworks
must agree on the loss and ZeRO must shrink the state a rank holds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import psutil
import pytest
import torch

from ddtk.frameworks import launchers, recipes
from ddtk.frameworks.launchers import (
    LauncherError,
    horovodrun_command,
    run_command,
    torchrun_command,
)
from ddtk.frameworks.state import state_bytes

# ------------------------------------------------------------------ fast: no launcher


def test_lines_changed_is_a_real_diff() -> None:
    assert recipes.lines_changed("single") == 0
    for name in ("ddp", "horovod", "deepspeed", "ddtk-dp", "tf-mwms"):
        assert 10 < recipes.lines_changed(name) < 80, name
    diff = recipes.unified_diff("horovod")
    assert "+    hvd.init()" in diff and "--- cnn_single.py" in diff
    assert '"""' not in diff  # docstrings are left out
    with pytest.raises(ValueError, match="unknown recipe 'jax'"):
        recipes.lines_changed("jax")


def test_state_bytes_counts_each_storage_once() -> None:
    model = torch.nn.Linear(10, 10)  # 110 parameters
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    # parameters + gradients + momentum, 4 bytes each; the optimizer's references are not recounted
    assert state_bytes(model, opt, [model, opt]) == 3 * 110 * 4
    flat = torch.zeros(100)
    assert state_bytes(flat[:10], flat[50:]) == 400  # views share one storage


def test_run_command_raises_with_the_tail_and_reaps_the_group(tmp_path) -> None:
    with pytest.raises(LauncherError, match=r"exited with 3\. Last lines:\nboom"):
        run_command([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], echo=False)
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('ready', flush=True); time.sleep(60)"
    )
    start = time.monotonic()
    with pytest.raises(LauncherError, match="ran past 3 s and was stopped"):
        run_command([sys.executable, "-c", code], timeout=3, echo=False)
    assert time.monotonic() - start < 20
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5  # SIGKILL was sent to the group; its death is not instant
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                break
        time.sleep(0.05)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_missing_launcher_and_bad_sizes_are_plain_errors(monkeypatch) -> None:
    monkeypatch.setattr(launchers, "BIN", launchers.Path("/nonexistent"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(FileNotFoundError, match=r"`horovodrun` is neither beside .* run `make horovod`"):
        launchers.tool("horovodrun")
    with pytest.raises(ValueError, match="np must be an integer >= 1, got 0"):
        horovodrun_command(0, ["x.py"])
    with pytest.raises(ValueError, match="nproc must be an integer >= 1, got True"):
        torchrun_command(True, ["x.py"])


def test_comparison_rejects_unknown_frameworks_and_world_sizes() -> None:
    from ddtk.frameworks.compare import run_comparison

    with pytest.raises(ValueError, match=r"unknown framework\(s\) \['mxnet'\]"):
        run_comparison(frameworks=["ddp", "mxnet"])
    with pytest.raises(ValueError, match="world_sizes must be integers >= 1"):
        run_comparison(world_sizes=[0, 2])


def test_bench_frameworks_rejects_bad_arguments() -> None:
    out = subprocess.run([sys.executable, "-m", "ddtk", "bench", "frameworks", "--frameworks", "ddp,mxnet"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "unknown framework(s) ['mxnet']" in out.stdout


# ------------------------------------------------------------------ the recipes, launched


def _metrics(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_and_ddtk_recipes_train_identically(tmp_path, horovodrun) -> None:
    """Same weights, data, shards and averaging: Horovod's and ddtk's runs give the same metrics."""
    args = ["--epochs", "2"]
    run_command(horovodrun_command(2, ["-m", "ddtk.examples.cnn_horovod", *args, "--json", str(tmp_path / "h.json"),
                                       "--checkpoint", str(tmp_path / "h.pt")]), echo=False)  # fmt: skip
    run_command(torchrun_command(2, ["-m", "ddtk.examples.cnn_ddtk", *args, "--json", str(tmp_path / "d.json")],
                                 master_port=launchers.free_port()), echo=False)  # fmt: skip
    h, d = _metrics(tmp_path / "h.json"), _metrics(tmp_path / "d.json")
    assert h["world_size"] == d["world_size"] == 2
    assert h["accuracy"] > 0.6, h
    assert h["loss"] == pytest.approx(d["loss"], rel=1e-4) and h["accuracy"] == d["accuracy"]
    state = torch.load(tmp_path / "h.pt")
    assert "0.weight" in state  # rank 0 saved the plain model


@pytest.mark.slow
def test_ddp_and_deepspeed_recipes_train(tmp_path) -> None:
    port = launchers.free_port()
    run_command(torchrun_command(2, ["-m", "ddtk.examples.cnn_ddp", "--epochs", "2", "--json",
                                     str(tmp_path / "ddp.json")], master_port=port), echo=False)  # fmt: skip
    run_command(torchrun_command(2, ["-m", "ddtk.examples.cnn_deepspeed", "--epochs", "2", "--zero-stage", "2",
                                     "--json", str(tmp_path / "ds.json"), "--checkpoint", str(tmp_path / "ds")],
                                 master_port=launchers.free_port()), echo=False, timeout=400)  # fmt: skip
    ddp, ds = _metrics(tmp_path / "ddp.json"), _metrics(tmp_path / "ds.json")
    assert ddp["accuracy"] > 0.6 and ds["accuracy"] > 0.6, (ddp, ds)
    assert ds["zero_stage"] == 2 and ds["world_size"] == 2
    shards = list((tmp_path / "ds").rglob("*optim_states.pt"))
    assert len(shards) == 2, sorted(p.name for p in (tmp_path / "ds").rglob("*"))  # one per rank


@pytest.mark.slow
def test_tensorflow_workers_run_in_lock_step(own_tempdir) -> None:
    from ddtk.frameworks.tf_mwms import run_workers

    reports = run_workers(2, epochs=2, echo=False)
    assert not list(own_tempdir.iterdir())  # the workers' report folder is removed
    assert [r["world_size"] for r in reports] == [2, 2]
    assert reports[0]["train_loss"] == reports[1]["train_loss"]  # one model, mirrored
    assert reports[0]["train_loss"][-1] < reports[0]["train_loss"][0]
    assert reports[0]["state_bytes"] > 19_706 * 4
    assert "tensorflow" not in sys.modules  # it ran in the workers only
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        run_workers(0)


@pytest.mark.slow
@pytest.mark.horovod
def test_comparison_frameworks_agree_and_zero_shards_state(horovodrun, own_tempdir) -> None:
    from ddtk.frameworks.compare import run_comparison

    torch_fw = ["ddp", "horovod", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "ddtk-dp"]
    rows = run_comparison(world_sizes=(1, 3), frameworks=torch_fw, steps=3, rounds=1)
    assert not list(own_tempdir.glob("ddtk-compare-*"))  # each job's result folder is removed
    by = {(r["framework"], r["world_size"]): r for r in rows}
    assert set(by) == {(f, w) for f in torch_fw for w in (1, 3)}
    for w in (1, 3):
        ref = by[("ddp", w)]["last_loss"]
        for f in ("horovod", "ddtk-dp"):  # same weights, batches and averaging as DDP
            assert by[(f, w)]["last_loss"] == pytest.approx(ref, rel=1e-4), (f, w)
        for f in torch_fw:
            assert by[(f, w)]["last_loss"] == pytest.approx(ref, rel=0.05), (f, w)
            assert by[(f, w)]["samples_per_s"] > 0
    assert by[("ddp", 1)]["efficiency"] == 1.0 and by[("ddp", 3)]["ratio_to_ddp"] == 1.0
    # Replicated state does not shrink with ranks; ZeRO's partitions do (19,706 / 3 is not whole).
    assert by[("ddp", 3)]["state_bytes_per_rank"] == by[("ddp", 1)]["state_bytes_per_rank"]
    for stage in (1, 2, 3):
        one, three = (by[(f"deepspeed-zero{stage}", w)]["state_bytes_per_rank"] for w in (1, 3))
        assert three < one, (stage, one, three)


def test_exit_without_static_destructors_flushes_and_keeps_the_code() -> None:
    code = ("import atexit; from ddtk.process_exit import exit_without_static_destructors;"
            "atexit.register(lambda: print('atexit ran')); print('done', end='');"
            "exit_without_static_destructors(3)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and out.stdout == "done"  # flushed, and no teardown ran
