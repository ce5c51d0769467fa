"""scripts/peak_memory.py: the peak it reports is the memory the command's tree really held,
a daemon that leaves its parent is still counted, and nothing is left running. About 3 s."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("peak_memory", ROOT / "scripts" / "peak_memory.py")
peak_memory = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("peak_memory", peak_memory)  # dataclasses look their module up there
_spec.loader.exec_module(peak_memory)  # type: ignore[union-attr]

MIB = 2**20
# A child holds 300 MiB of written pages for 2 s; it also starts a grandchild in a session
# of its own that holds 200 MiB and outlives it (as a Ray agent outlives its parent).
HOLD = (
    "import subprocess, sys, time\n"
    "code = 'import time; b = b\"y\" * (200 * 2**20); time.sleep(60)'\n"
    "subprocess.Popen([sys.executable, '-c', code], start_new_session=True)\n"
    "a = b'x' * (300 * 2**20)\n"
    "time.sleep(2)\n"
)


def test_peak_counts_the_tree_and_stops_what_it_left(tmp_path: Path) -> None:
    out = tmp_path / "peak.json"
    code = peak_memory.main(["--interval", "0.2", "--json", str(out), "--", sys.executable, "-c", HOLD])
    assert code == 0
    peaks = json.loads(out.read_text())
    assert 490 * MIB <= peaks["pss_bytes"] <= 700 * MIB, peaks["pss_bytes"] / MIB
    assert peaks["rss_bytes"] >= peaks["pss_bytes"]
    assert peaks["processes"] >= 2 and peaks["threads"] >= peaks["processes"]
    [left] = peaks["left_running"]  # the grandchild, stopped
    pid = int(left.split()[0])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_exit_status_and_bad_arguments(tmp_path: Path) -> None:
    assert peak_memory.main(["--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    with pytest.raises(SystemExit) as exc:
        peak_memory.main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        peak_memory.main(["--interval", "0", "--", "true"])
