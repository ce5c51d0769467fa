"""Read the output of NVIDIA's nccl-tests (``all_reduce_perf`` and friends) into rows.

A result line of nccl-tests reads, out-of-place columns first, then in-place::

    #       size   count   type   redop   root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
         8589934592  2147483648  float  sum  -1  43980  195.31  386.56  0  44094  194.81  385.56  0

``time`` is in microseconds, the bandwidths in GB/s (1e9 bytes per second). Logs
collected by ``mpirun`` carry a prefix per line (``0:``, ``[1,0]<stdout>:``) and
older versions have no ``root`` column; :func:`parse` accepts all of them.
:func:`check` recomputes algbw from size and time and busbw from algbw with the
collective's factor, which is how to read a table you did not produce yourself.
"""

from __future__ import annotations

import re

FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:)\s*")
_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+([a-z0-9_]+)\s+([a-z]+)\s+(?:(-?\d+)\s+)?"
    r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
)
_DEVICE = re.compile(
    r"#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]+\]\s+(.+)$"
)


def parse(text: str) -> dict:
    """``{"rows": [...], "devices": [...]}`` from nccl-tests output (any prefix, with or without root)."""
    rows, devices = [], []
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw, count=1)
        if line.lstrip().startswith("#"):
            m = _DEVICE.search(line)
            if m:
                devices.append(
                    {"rank": int(m[1]), "host": m[2], "device": int(m[3]), "name": m[4].strip()}
                )
            continue
        m = _ROW.match(line)
        if not m:
            continue
        rows.append({
            "size": int(m[1]), "count": int(m[2]), "type": m[3], "redop": m[4],
            "time_us": float(m[6]), "algbw": float(m[7]), "busbw": float(m[8]),
            "inplace_time_us": float(m[10]), "inplace_algbw": float(m[11]), "inplace_busbw": float(m[12]),
        })  # fmt: skip
    return {"rows": rows, "devices": devices}


def check(rows: list[dict], ranks: int, collective: str = "all_reduce") -> list[dict]:
    """Each row with algbw and busbw recomputed (``algbw_calc``, ``busbw_calc``) from size and time."""
    if collective not in FACTORS:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(FACTORS)}")
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    factor = FACTORS[collective](ranks) if ranks > 1 else 0.0
    out = []
    for r in rows:
        algbw = r["size"] / (r["time_us"] * 1e-6) / 1e9
        out.append({**r, "algbw_calc": algbw, "busbw_calc": algbw * factor})
    return out
