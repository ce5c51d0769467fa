"""Tests of ``ddtk doctor``: the real command on this machine, and its logic on crafted facts.

The command tests run ``python -m ddtk doctor`` in a subprocess, as a learner
would, and compare its facts with what torch, psutil and os report here. The
logic tests feed :func:`ddtk.doctor.notebook_rows` and :func:`ddtk.doctor.hints`
facts that describe other machines (no GPU, GPU without NCCL, Horovod missing or
broken, Ray missing, gloo broken).
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist

from ddtk import doctor
from ddtk.course.catalog import NOTEBOOKS
from ddtk.doctor import packages as doctor_packages

CLI_TIMEOUT_S = 120


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ddtk doctor ARGS`` with a wide terminal so tables do not wrap."""
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ddtk", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def cli_json() -> tuple[int, dict[str, Any]]:
    """Exit code and parsed report of ``ddtk doctor --json`` on this machine."""
    proc = run_cli("--json")
    assert proc.stdout.strip(), f"no output; stderr:\n{proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------ the real command


def test_json_exit_code_follows_core(cli_json: tuple[int, dict[str, Any]]) -> None:
    """torch and gloo work in this test process, so the doctor must report the core OK."""
    code, rep = cli_json
    assert rep["core_ok"] is True, rep["hints"]
    assert code == 0


def test_json_torch_facts_match_this_process(cli_json: tuple[int, dict[str, Any]]) -> None:
    """torch version, build, GPUs and backends as torch reports them here."""
    facts = cli_json[1]["facts"]["torch"]
    assert facts["installed"] is True
    assert facts["version"] == torch.__version__
    assert facts["cuda_version"] == torch.version.cuda
    assert facts["build"] == (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU")
    assert facts["cuda_available"] == torch.cuda.is_available()
    expected_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert facts["gpu_count"] == expected_gpus
    assert len(facts["gpus"]) == expected_gpus
    assert facts["gloo"] == dist.is_gloo_available()
    assert facts["gloo_works"] is True, facts["gloo_error"]
    assert facts["nccl"] == dist.is_nccl_available()
    assert facts["mpi"] == dist.is_mpi_available()
    if torch.cuda.is_available() and dist.is_nccl_available():
        version = torch.cuda.nccl.version()
        assert facts["nccl_version"] == ".".join(map(str, version))
    else:
        assert facts["nccl_version"] is None


def test_json_system_facts_match_this_process(cli_json: tuple[int, dict[str, Any]]) -> None:
    """Python, cores and memory as this process sees them."""
    facts = cli_json[1]["facts"]
    assert facts["python"]["executable"] == sys.executable
    assert facts["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["system"]["cpu_count"] == os.cpu_count()
    assert facts["system"]["affinity_count"] == len(os.sched_getaffinity(0))
    assert facts["system"]["memory_total_bytes"] == psutil.virtual_memory().total
    assert 0 < facts["system"]["memory_available_bytes"] <= psutil.virtual_memory().total


def test_json_horovod_and_ray_facts(cli_json: tuple[int, dict[str, Any]]) -> None:
    """Installed versions come from package metadata; Horovod's flags from horovod.torch."""
    facts = cli_json[1]["facts"]
    assert facts["ray"]["installed"] == (_dist_version("ray") is not None)
    assert facts["ray"]["version"] == _dist_version("ray")
    hvd = facts["horovod"]
    assert hvd["version"] == _dist_version("horovod")
    try:
        import horovod.torch as hvd_torch
    except ImportError:
        assert hvd["importable"] is False
        return
    assert hvd["importable"] is True
    assert hvd["built"] == {
        flag: bool(getattr(hvd_torch, f"{flag}_built")()) for flag in doctor.HOROVOD_BUILT_FLAGS
    }


def test_json_notebooks_cover_the_catalog(cli_json: tuple[int, dict[str, Any]]) -> None:
    """One row per catalog entry, in order, consistent with whether the file exists."""
    rows = cli_json[1]["notebooks"]
    assert [row["name"] for row in rows] == [nb.name for nb in NOTEBOOKS]
    for row, nb in zip(rows, NOTEBOOKS, strict=True):
        assert ("not written yet" in row["reasons"]) == (not nb.exists)
        assert row["runs"] == (not row["reasons"])
        assert row["backend"] == (cli_json[1]["backend"] if row["runs"] else None)


def test_human_output_has_the_notebook_table(cli_json: tuple[int, dict[str, Any]]) -> None:
    """The rich output lists every notebook with the same verdict as the JSON report."""
    proc = run_cli()
    assert proc.returncode == cli_json[0], proc.stderr
    out = proc.stdout
    assert "Course notebooks" in out
    assert "core OK" in out
    runs = {row["title"]: row["runs"] for row in cli_json[1]["notebooks"]}
    for nb in NOTEBOOKS:
        line = next((ln for ln in out.splitlines() if f" {nb.title} " in ln), None)
        assert line is not None, f"{nb.title!r} missing from:\n{out}"
        cells = [cell.strip() for cell in line.split("│")]
        assert nb.name in cells
        assert ("yes" if runs[nb.title] else "no") in cells, line


def test_add_parser_registers_doctor() -> None:
    """``add_parser`` wires ``doctor --json`` to the handler the CLI calls."""
    parser = argparse.ArgumentParser()
    doctor.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "--json"])
    assert args.func is doctor.run
    assert args.json is True


# ------------------------------------------------------------ logic on crafted facts


@dataclass
class FakeNotebook:
    """A catalog entry whose existence is set by the test, not by the file system."""

    name: str
    path: str
    title: str
    kind: str
    needs: frozenset[str] = field(default_factory=frozenset)
    exists: bool = True


def catalog(exists: bool = True) -> list[FakeNotebook]:
    """The real course catalog, with every file present (or every file absent)."""
    return [FakeNotebook(nb.name, nb.path, nb.title, nb.kind, nb.needs, exists) for nb in NOTEBOOKS]


def healthy_cpu_facts() -> dict[str, Any]:
    """A laptop on which everything but a GPU is present and works."""
    return {
        "ddtk": {"version": "0.0.0"},
        "python": {
            "version": "3.11.7",
            "executable": "/venv/bin/python",
            "platform": "Linux",
            "error": None,
        },
        "torch": {
            "installed": True,
            "version": "2.13.0+cpu",
            "build": "CPU",
            "cuda_version": None,
            "distributed": True,
            "gloo": True,
            "gloo_works": True,
            "gloo_error": None,
            "nccl": False,
            "mpi": False,
            "error": None,
            "cuda_available": False,
            "gpu_count": 0,
            "gpus": [],
            "nccl_version": None,
            "gpu_error": None,
        },
        "tools": {"mpirun": None, "nvidia_smi": None, "error": None},
        "horovod": {
            "installed": True,
            "version": "0.28.1",
            "importable": True,
            "built": {flag: flag == "gloo" for flag in doctor.HOROVOD_BUILT_FLAGS},
            "horovodrun": "/venv/bin/horovodrun",
            "error": None,
        },
        "ray": {"installed": True, "version": "2.60.0", "error": None},
        "deepspeed": {
            "installed": True,
            "versions": {"deepspeed": "0.19.8", "ninja": "1.13.2"},
            "error": None,
        },
        "tensorflow": {
            "installed": True,
            "versions": {"tensorflow": "2.21.0", "tf-keras": "2.21.0"},
            "error": None,
        },
        "system": {
            "cpu_count": 2,
            "affinity_count": 2,
            "memory_total_bytes": 8 * 2**30,
            "memory_available_bytes": 6 * 2**30,
            "error": None,
        },
        "faults": {
            "op_timeout_env": "DDTK_OP_TIMEOUT",
            "op_timeout": 60.0,
            "op_timeout_error": None,
            "op_timeout_default": False,
            "torchrun": "/venv/bin/torchrun",
            "horovodrun": "/venv/bin/horovodrun",
            "ray": True,
            "injectors": ["kill_at_step"],
            "error": None,
        },
        "transport": {
            "setting": "auto",
            "setting_error": None,
            "in_force": "shm",
            "shm_unavailable": None,
            "shm_free_bytes": 4 * 2**30,
            "error": None,
        },
        "network": {
            "rdma": [],
            "iperf3": "/usr/bin/iperf3",
            "shaping_unavailable": None,
            "error": None,
        },
        "sandbox": {
            "namespaces": True,
            "own_user": True,
            "bwrap": "/usr/bin/bwrap",
            "missing": [],
            "summary": "sandbox: own PID, mount, IPC and network namespaces",
            "error": None,
        },
    }


def with_changes(**sections: dict[str, Any]) -> dict[str, Any]:
    """Healthy CPU facts with some keys of some sections replaced."""
    facts = copy.deepcopy(healthy_cpu_facts())
    for section, changes in sections.items():
        facts[section].update(changes)
    return facts


GPU = {"cuda_available": True, "gpu_count": 2, "gpus": ["H100", "H100"], "build": "CUDA 12.8"}
NO_HOROVOD = {"installed": False, "version": None, "importable": False, "built": {}}
NO_RAY = {"installed": False, "version": None}


def rows_by_name(facts: dict[str, Any], entries: list[FakeNotebook]) -> dict[str, dict]:
    return {row["name"]: row for row in doctor.notebook_rows(facts, entries)}


def hint_topics(facts: dict[str, Any]) -> dict[str, str]:
    return {item["topic"]: item["hint"] for item in doctor.hints(facts)}


def test_crafted_facts_have_the_shape_of_collected_facts() -> None:
    """The crafted facts must follow the schema ``collect()`` really produces."""
    real = doctor.collect()
    crafted = healthy_cpu_facts()
    assert real.keys() == crafted.keys()
    for section in real:
        assert real[section].keys() == crafted[section].keys(), section


def test_healthy_cpu_runs_every_notebook_on_gloo() -> None:
    rows = doctor.notebook_rows(healthy_cpu_facts(), catalog())
    assert all(row["runs"] and row["backend"] == "gloo" for row in rows), rows


def test_gpu_with_nccl_selects_nccl_and_gpu_without_nccl_falls_back() -> None:
    with_nccl = with_changes(torch={**GPU, "nccl": True, "nccl_version": "2.27.3"})
    assert doctor.backend(with_nccl) == "nccl"
    assert {row["backend"] for row in doctor.notebook_rows(with_nccl, catalog())} == {"nccl"}
    assert "gpu" not in hint_topics(with_nccl)
    without_nccl = with_changes(torch={**GPU, "nccl": False})
    assert doctor.backend(without_nccl) == "gloo"
    assert "no NCCL" in hint_topics(without_nccl)["gpu"]


def test_missing_ray_blocks_only_ray_notebooks_with_the_hint() -> None:
    rows = rows_by_name(with_changes(ray=NO_RAY), catalog())
    for nb in NOTEBOOKS:
        row = rows[nb.name]
        assert row["runs"] == ("ray" not in nb.needs), row
        if "ray" in nb.needs:
            assert row["backend"] is None
            assert any(doctor.HINT_RAY in reason for reason in row["reasons"])
    assert "pip install -e .[ray]" in hint_topics(with_changes(ray=NO_RAY))["ray"]


def test_missing_deepspeed_or_tensorflow_blocks_lecture_03_with_the_extra() -> None:
    for key, extra in (("deepspeed", ".[deepspeed]"), ("tensorflow", ".[tensorflow]")):
        missing = {"installed": False, "versions": {key: None}}
        rows = rows_by_name(with_changes(**{key: missing}), catalog())
        assert not rows["03"]["runs"], rows["03"]
        assert any(extra in reason for reason in rows["03"]["reasons"]), rows["03"]
        assert rows["01"]["runs"]


def test_missing_horovod_blocks_horovod_notebooks_with_make_horovod() -> None:
    facts = with_changes(horovod=NO_HOROVOD)
    rows = rows_by_name(facts, catalog())
    blocked = {nb.name for nb in NOTEBOOKS if "horovod" in nb.needs}
    assert blocked, "the catalog has Horovod notebooks"
    assert {name for name, row in rows.items() if not row["runs"]} == blocked
    for name in blocked:
        assert "run `make horovod`" in " ".join(rows[name]["reasons"])
    assert "about 4 minutes" in hint_topics(facts)["horovod"]


def test_broken_horovod_says_rebuild_for_this_torch() -> None:
    facts = with_changes(
        horovod={"importable": False, "built": {}, "error": "ImportError: undefined symbol"}
    )
    hint = hint_topics(facts)["horovod"]
    assert "undefined symbol" in hint and "make horovod" in hint and "2.13.0+cpu" in hint
    assert not rows_by_name(facts, catalog())["lab02"]["runs"]


def test_horovod_without_gloo_or_mpi_is_not_ready() -> None:
    facts = with_changes(horovod={"built": dict.fromkeys(doctor.HOROVOD_BUILT_FLAGS, False)})
    assert not doctor.horovod_ready(facts)
    assert "without Gloo" in hint_topics(facts)["horovod"]


def test_missing_horovodrun_gets_a_hint() -> None:
    assert "horovodrun" not in hint_topics(healthy_cpu_facts())
    facts = with_changes(horovod={"horovodrun": None})
    assert "source .venv/bin/activate" in hint_topics(facts)["horovodrun"]


def test_files_not_written_yet_are_reported_with_missing_dependencies() -> None:
    rows = rows_by_name(with_changes(ray=NO_RAY), catalog(exists=False))
    assert all(not row["runs"] for row in rows.values())
    assert rows["01"]["reasons"] == ["not written yet"]
    assert rows["02"]["reasons"][0] == "not written yet"
    assert doctor.HINT_RAY in rows["02"]["reasons"][1]


def test_gpu_need_without_gpu() -> None:
    entries = [FakeNotebook("x", "course/x.ipynb", "GPU only", "lecture", frozenset({"gpu"}))]
    assert not doctor.notebook_rows(healthy_cpu_facts(), entries)[0]["runs"]
    assert doctor.notebook_rows(with_changes(torch=GPU), entries)[0]["runs"]


def test_broken_gloo_blocks_everything_and_fails_the_core() -> None:
    facts = with_changes(torch={"gloo_works": False, "gloo_error": "RuntimeError: no device"})
    assert not doctor.core_ok(facts)
    assert not any(row["runs"] for row in doctor.notebook_rows(facts, catalog()))
    items = doctor.hints(facts)
    assert items[0]["level"] == "error" and items[0]["topic"] == "gloo"
    assert "GLOO_SOCKET_IFNAME" in items[0]["hint"]


def test_healthy_cpu_hints_are_only_informational() -> None:
    items = doctor.hints(healthy_cpu_facts())
    assert {item["level"] for item in items} == {"info"}
    gpu = next(item["hint"] for item in items if item["topic"] == "gpu")
    assert gpu == doctor.HINT_NO_GPU
    assert "fall back to gloo" in gpu


def test_gpu_machine_with_cpu_torch_says_install_cuda_torch() -> None:
    facts = with_changes(tools={"nvidia_smi": "/usr/bin/nvidia-smi"})
    assert "CPU build" in hint_topics(facts)["gpu"]


def test_single_core_gets_a_hint() -> None:
    facts = with_changes(system={"affinity_count": 1})
    assert "1 usable core" in hint_topics(facts)["cores"]


# ------------------------------------------------------------ robustness of probes


def test_failing_torch_probe_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> dict[str, Any]:
        raise OSError("libtorch_cpu.so: cannot open shared object file")

    monkeypatch.setattr(doctor, "probe_torch", broken)
    facts = doctor.collect()
    assert facts["torch"]["installed"] is False
    assert "libtorch_cpu.so" in facts["torch"]["error"]
    assert not doctor.core_ok(facts)
    assert "libtorch_cpu.so" in hint_topics(facts)["torch"]


def test_failing_gpu_probe_keeps_the_torch_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(torch: Any) -> dict[str, Any]:
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(doctor_packages, "_gpu_facts", broken)
    facts = doctor.probe_torch()
    assert facts["installed"] is True and facts["gloo_works"] is True
    assert facts["gpu_count"] == 0
    assert "CUDA driver" in facts["gpu_error"]


def test_unimportable_horovod_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_packages, "_dist_version", lambda name: "0.28.1")
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    facts = doctor.probe_horovod()
    assert facts["installed"] is True
    assert facts["importable"] is False
    assert "horovod" in facts["error"]


def test_handler_exit_codes_and_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The handler prints the report and returns 0 only when the core works."""
    monkeypatch.setattr(doctor, "collect", healthy_cpu_facts)
    assert doctor.run(argparse.Namespace(json=True)) == 0
    assert json.loads(capsys.readouterr().out)["core_ok"] is True

    monkeypatch.setattr(doctor, "collect", lambda: with_changes(torch={"gloo_works": False}))
    assert doctor.run(argparse.Namespace(json=False)) == 1
    out = capsys.readouterr().out
    assert "core broken" in out and "Course notebooks" in out


# ------------------------------------------------------------------ fault tolerance


def test_json_reports_the_failure_model_and_recovery_tools(
    cli_json: tuple[int, dict[str, Any]],
) -> None:
    """The faults facts name the launchers found here, and the failure model is complete."""
    from ddtk import faults
    from ddtk.faults.model import FAILURE_MODEL, INJECTORS

    _, rep = cli_json
    facts = rep["facts"]["faults"]
    bindir = os.path.dirname(sys.executable)
    assert facts["torchrun"] == os.path.join(bindir, "torchrun")
    assert facts["ray"] == (_dist_version("ray") is not None)
    assert facts["injectors"] == list(INJECTORS)
    assert all(callable(getattr(faults, name)) for name in INJECTORS)
    assert [case["event"] for case in rep["failure_model"]] == [c.event for c in FAILURE_MODEL]
    assert all(case["lost"] for case in rep["failure_model"])


def test_op_timeout_from_the_environment_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTK_OP_TIMEOUT", "45")
    facts = doctor.collect()["faults"]
    assert facts["op_timeout"] == 45.0 and not facts["op_timeout_default"]
    monkeypatch.delenv("DDTK_OP_TIMEOUT")
    facts = doctor.collect()["faults"]
    assert facts["op_timeout"] == 300.0 and facts["op_timeout_default"]
    monkeypatch.setenv("DDTK_OP_TIMEOUT", "off")
    assert doctor.collect()["faults"]["op_timeout"] is None
    monkeypatch.setenv("DDTK_OP_TIMEOUT", "soon")
    facts = doctor.collect()["faults"]
    assert facts["op_timeout"] is None and "'soon'" in facts["op_timeout_error"]


def test_op_timeout_off_is_an_info_hint_and_a_bad_one_an_error() -> None:
    assert "faults" not in hint_topics(healthy_cpu_facts())
    off = with_changes(faults={"op_timeout": None})
    (item,) = [h for h in doctor.hints(off) if h["topic"] == "faults"]
    assert item["level"] == "info" and "DDTK_OP_TIMEOUT is off" in item["hint"]
    bad = with_changes(faults={"op_timeout": None, "op_timeout_error": "DDTK_OP_TIMEOUT bad"})
    (item,) = [h for h in doctor.hints(bad) if h["topic"] == "faults"]
    assert item["level"] == "error" and "DDTK_OP_TIMEOUT bad" in item["hint"]


def test_human_output_has_the_fault_tolerance_tables() -> None:
    proc = run_cli()
    assert "Fault tolerance" in proc.stdout and "Failure model" in proc.stdout
    assert "a rank hangs" in proc.stdout


def test_transport_in_force_is_reported_with_why_shared_memory_is_not(monkeypatch) -> None:
    monkeypatch.setenv("DDTK_TRANSPORT", "tcp")
    facts = doctor.collect()["transport"]
    assert facts["setting"] == "tcp" and facts["in_force"] == "tcp"
    monkeypatch.setenv("DDTK_TRANSPORT", "pigeon")
    facts = doctor.collect()["transport"]
    assert "unknown transport 'pigeon'" in facts["setting_error"]
    assert "transport" not in hint_topics(healthy_cpu_facts())
    no_shm = with_changes(transport={"in_force": "tcp", "shm_unavailable": "this CPU is arm64"})
    (item,) = [h for h in doctor.hints(no_shm) if h["topic"] == "transport"]
    assert item["level"] == "info" and "gloo's sockets: this CPU is arm64" in item["hint"]
    forced = with_changes(transport={"setting": "shm", "shm_unavailable": "no /dev/shm"})
    (item,) = [h for h in doctor.hints(forced) if h["topic"] == "transport"]
    assert "DDTK_TRANSPORT=shm cannot work here" in item["hint"]
    bad = with_changes(transport={"setting_error": "unknown transport 'x'"})
    (item,) = [h for h in doctor.hints(bad) if h["topic"] == "transport"]
    assert item["level"] == "error"
    small = with_changes(transport={"shm_free_bytes": 64 << 20})
    (item,) = [h for h in doctor.hints(small) if h["topic"] == "transport"]
    assert "/dev/shm has 64 MiB free" in item["hint"]


def test_network_facts_list_rdma_ports_like_ibstat_and_the_local_tools(
    monkeypatch, tmp_path
) -> None:
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    monkeypatch.setattr(doctor, "RDMA_SYSFS", tmp_path)
    facts = doctor.probe_network()
    assert facts["rdma"] == [{"device": "mlx5_0", "port": "1", "state": "4: ACTIVE",
                              "rate": "200 Gb/sec (4X HDR)", "link_layer": "InfiniBand"}]  # fmt: skip
    monkeypatch.setattr(doctor, "RDMA_SYSFS", tmp_path / "absent")
    assert doctor.probe_network()["rdma"] == []
    proc = run_cli()
    assert "RDMA ports" in proc.stdout and "kernel shaping" in proc.stdout
    report = json.loads(run_cli("--json").stdout)
    assert set(report["facts"]["network"]) >= {"rdma", "iperf3", "shaping_unavailable"}


def test_the_doctor_says_whether_grading_can_sandbox(capsys) -> None:
    from ddtk.course.grading.jail import confinement

    report = doctor.report(doctor.collect(), [])
    assert report["facts"]["sandbox"]["summary"] == confinement().summary()
    doctor.render(report)
    assert "grading sandbox" in capsys.readouterr().out
