"""The doctor's report as rich tables: the machine, the tools, hints, notebooks, fault tolerance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddtk.doctor.packages import HOROVOD_BUILT_FLAGS, Facts
from ddtk.doctor.system import NETWORK_MISSING, TRANSPORT_MISSING


def _yes_no(value: Any) -> str:
    """A coloured yes/no cell for rich."""
    return "[green]yes[/]" if value else "[red]no[/]"


def _gib(n_bytes: int | None) -> str:
    return "?" if n_bytes is None else f"{n_bytes / 2**30:.1f} GiB"


def _machine_table(facts: Facts) -> Any:
    """Python, cores and memory, torch and its backends, as one two-column table."""
    from rich.table import Table

    py, torch, sysf, tools = facts["python"], facts["torch"], facts["system"], facts["tools"]
    table = Table(title="This machine", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("ddtk", facts["ddtk"]["version"])
    table.add_row("Python", f"{py.get('version')}  ({py.get('executable')})")
    table.add_row("cores", f"{sysf.get('cpu_count')} logical, {sysf.get('affinity_count')} usable")
    memory = f"{_gib(sysf.get('memory_total_bytes'))} total, {_gib(sysf.get('memory_available_bytes'))} available"
    table.add_row("memory", memory)
    if torch.get("installed"):
        table.add_row("torch", f"{torch['version']} ({torch['build']} build)")
    else:
        table.add_row("torch", f"[red]missing[/] {torch.get('error') or ''}")
    gpus = ", ".join(torch.get("gpus") or []) or "none"
    gpu_error = f"  {torch['gpu_error']}" if torch.get("gpu_error") else ""
    table.add_row(
        "CUDA available", f"{_yes_no(torch.get('cuda_available'))}  GPUs: {gpus}{gpu_error}"
    )
    gloo = _yes_no(torch.get("gloo") and torch.get("gloo_works"))
    table.add_row("gloo", gloo + (f"  {torch['gloo_error']}" if torch.get("gloo_error") else ""))
    nccl_version = f"  (NCCL {torch['nccl_version']})" if torch.get("nccl_version") else ""
    table.add_row("NCCL", _yes_no(torch.get("nccl")) + nccl_version)
    table.add_row(
        "MPI (torch)", f"{_yes_no(torch.get('mpi'))}  mpirun: {tools.get('mpirun') or 'not found'}"
    )
    t = facts.get("transport") or TRANSPORT_MISSING
    why = f"  ({t['shm_unavailable']})" if t.get("shm_unavailable") else ""
    free = f", /dev/shm {_gib(t['shm_free_bytes'])} free" if t.get("shm_free_bytes") else ""
    table.add_row(
        "ddtk transport", f"{t.get('in_force')} (DDTK_TRANSPORT={t.get('setting')}){free}{why}"
    )
    net = facts.get("network") or NETWORK_MISSING
    ports = ", ".join(
        f"{p['device']}:{p['port']} {p.get('state')} {p.get('rate')} {p.get('link_layer')}"
        for p in net.get("rdma") or []
    )
    table.add_row("RDMA ports", ports or "none (NCCL would use sockets between nodes)")
    shaping = net.get("shaping_unavailable")
    table.add_row(
        "network tools",
        f"iperf3: {net.get('iperf3') or 'not found'}; kernel shaping: "
        + ("yes (namespaces + tbf)" if not shaping else f"no ({shaping})"),
    )
    from rich.markup import escape

    box = facts.get("sandbox") or {}
    style = "" if not box.get("missing") else "[yellow]"
    table.add_row("grading sandbox", style + escape(box.get("summary", "not probed")))
    return table


def _tools_table(facts: Facts) -> Any:
    """Horovod (with its build flags), Ray, DeepSpeed and TensorFlow."""
    from rich.table import Table

    hvd, ray = facts["horovod"], facts["ray"]
    table = Table(
        title="Horovod, Ray, DeepSpeed, TensorFlow", show_header=False, title_justify="left"
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    if hvd.get("importable"):
        table.add_row("Horovod", f"{hvd.get('version')}")
        flags = hvd.get("built", {})
        built = " ".join(
            f"{flag}:{'yes' if flags.get(flag) else 'no'}" for flag in HOROVOD_BUILT_FLAGS
        )
        table.add_row("Horovod built with", built)
    elif hvd.get("installed"):
        table.add_row(
            "Horovod", f"[red]broken[/] {hvd.get('version') or ''} {hvd.get('error') or ''}"
        )
    else:
        table.add_row("Horovod", "[yellow]not installed[/]")
    table.add_row("horovodrun", hvd.get("horovodrun") or "not found")
    ray_text = ray.get("version") if ray.get("installed") else "[yellow]not installed[/]"
    table.add_row("Ray", str(ray_text))
    for key, label in (("deepspeed", "DeepSpeed"), ("tensorflow", "TensorFlow")):
        pkg = facts.get(key, {})
        versions = ", ".join(f"{n} {v or 'missing'}" for n, v in pkg.get("versions", {}).items())
        table.add_row(
            label, versions if pkg.get("installed") else f"[yellow]not installed[/] {versions}"
        )
    return table


def _faults_table(facts: Facts) -> Any:
    """The op timeout in force, the launchers that restart a group, and the injectors."""
    from rich.table import Table

    faults = facts.get("faults", {})
    table = Table(title="Fault tolerance", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    if faults.get("op_timeout_error"):
        timeout = f"[red]invalid[/] {faults['op_timeout_error']}"
    elif faults.get("op_timeout") is None:
        timeout = "[yellow]off[/] (hangs end only at launch's timeout)"
    else:
        where = "default" if faults.get("op_timeout_default") else "from the environment"
        timeout = f"{faults['op_timeout']:g} s ({where})"
    table.add_row(f"op timeout ({faults.get('op_timeout_env', 'DDTK_OP_TIMEOUT')})", timeout)
    for tool in ("torchrun", "horovodrun"):
        table.add_row(tool, faults.get(tool) or "[yellow]not found[/]")
    table.add_row("Ray Train", _yes_no(faults.get("ray")))
    table.add_row("injectors", ", ".join(faults.get("injectors") or []) or "none")
    return table


def _failure_model_table(cases: Sequence[dict[str, str]]) -> Any:
    """What is guaranteed when something breaks, and what is lost."""
    from rich.table import Table

    table = Table(title="Failure model", title_justify="left")
    for column in ("event", "detected as", "then", "lost"):
        table.add_column(column, style="bold" if column == "event" else None)
    for case in cases:
        table.add_row(case["event"], case["detected_as"], case["then"], case["lost"])
    return table


def _hints_table(items: Sequence[dict[str, str]]) -> Any:
    from rich.table import Table

    style = {"error": "bold red", "warn": "yellow", "info": "cyan"}
    table = Table(title="Hints", title_justify="left")
    table.add_column("level")
    table.add_column("topic", style="bold")
    table.add_column("what to do")
    for item in items:
        table.add_row(f"[{style[item['level']]}]{item['level']}[/]", item["topic"], item["hint"])
    return table


def _notebooks_table(rows: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="Course notebooks", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("title")
    table.add_column("runs here")
    table.add_column("backend / why not")
    for row in rows:
        verdict = "[green]yes[/]" if row["runs"] else "[red]no[/]"
        detail = row["backend"] if row["runs"] else "; ".join(row["reasons"])
        table.add_row(row["name"], row["title"], verdict, detail)
    return table


def render(rep: dict[str, Any], console: Any = None) -> None:
    """Print the report as rich tables."""
    from rich.console import Console

    console = console or Console()
    facts = rep["facts"]
    console.print(_machine_table(facts))
    console.print(_tools_table(facts))
    if rep["hints"]:
        console.print(_hints_table(rep["hints"]))
    console.print(_notebooks_table(rep["notebooks"]))
    console.print(_faults_table(facts))
    console.print(_failure_model_table(rep["failure_model"]))
    if rep["core_ok"]:
        console.print(
            f"[green]core OK[/]: torch + gloo work; notebooks use backend={rep['backend']}"
        )
    else:
        console.print("[bold red]core broken[/]: torch + gloo do not work here (see the hints)")
