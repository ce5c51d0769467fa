"""Read the output of perftest's bandwidth tools (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``).

``ib_write_bw`` measures one RDMA link alone, without NCCL or a GPU: run it on a
server (``ib_write_bw -d mlx5_0 --report_gbits``) and on a client with the server's
address. Both print a header with what the test used, then one row per message size::

    ---------------------------------------------------------------------------------------
                        RDMA_Write BW Test
     Dual-port       : OFF              Device         : mlx5_0
     Number of qps   : 1                Transport type : IB
     Mtu             : 4096[B]
     Link type       : IB
    ---------------------------------------------------------------------------------------
     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     65536      5000             196.62             196.43                 0.374657

The units follow the flags: ``--report_gbits`` prints Gb/sec (1e9 bits per second);
without it perftest prints MB/sec, which is 2**20 bytes per second (its
``print_report_bw`` divides by 0x100000). :func:`parse` converts both to Gb/s, the
unit a port's line rate is quoted in (``rate: 200 Gb/sec (4X HDR)``), so the average
of the largest message can be compared with it directly.

A RoCE link measured without ``--report_gbits`` (the header's tabs may also arrive as
spaces, from a copy):

>>> out = parse('''
...                     RDMA_Write BW Test
...  Dual-port       : OFF          Device         : mlx5_0
...  Mtu             : 1024[B]
...  Link type       : Ethernet
...  GID index       : 3
...  #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
...  65536      5000             11204.88            11020.41            0.176327
... ''')
>>> out["device"], out["link_type"], out["mtu"], out["gid_index"], out["units"]
('mlx5_0', 'Ethernet', 1024, 3, 'MB/sec')
>>> round(largest(out)["bw_average_gbps"], 1)  # 11020.41 x 2**20 bytes x 8 bits, in Gb/s
92.4
"""

from __future__ import annotations

import re

__all__ = ["MIB", "largest", "parse", "to_gbps"]

MIB = 2**20  # perftest's "MB"
_TITLE = re.compile(r"^\s*(\S.*\bBW Test)\s*$")
_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(MB/sec|Gb/sec)\]\s+BW average\[(MB/sec|Gb/sec)\]"
)
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
# "Name : value", ending at a tab, at two spaces before the next "Name :", or at the line's end
_PAIR = re.compile(r"([A-Za-z][\w .*-]*?)\s*:\s*(.*?)\s*(?=\t|\s{2,}[A-Za-z][\w .*-]*?\s*:|$)")
_ERROR = re.compile(r"(?i)\b(couldn't|could not|failed|unable|error)\b")
_FIELDS = {"Device": "device", "Transport type": "transport", "Link type": "link_type",
           "Mtu": "mtu", "GID index": "gid_index", "Gid index": "gid_index",
           "Number of qps": "qps", "Connection type": "connection"}  # fmt: skip


def to_gbps(value: float, units: str) -> float:
    """A perftest bandwidth in ``units`` ("Gb/sec" or "MB/sec", 2**20 bytes) as Gb/s."""
    if units == "Gb/sec":
        return float(value)
    if units == "MB/sec":
        return float(value) * MIB * 8 / 1e9
    raise ValueError(f"unknown perftest units {units!r}; expected 'Gb/sec' or 'MB/sec'")


def _fields(line: str) -> dict[str, str]:
    """The ``Name : value`` pairs of one header line: up to two per line, separated by
    tabs as perftest prints them, or by spaces where a copy turned the tabs into spaces."""
    return {_FIELDS[name.strip()]: value for name, value in _PAIR.findall(line)
            if name.strip() in _FIELDS}  # fmt: skip


def parse(text: str) -> dict:
    """``{"test", "device", "link_type", "mtu", "gid_index", "units", "rows", "errors"}``.

    Each row holds ``bytes``, ``iterations``, ``bw_peak_gbps``, ``bw_average_gbps`` and
    ``msg_rate_mpps``; ``errors`` holds the lines that report a failure (a test that
    could not register memory or connect prints those and no row). ``ValueError`` for
    text that is no perftest output.
    """
    if not isinstance(text, str):
        raise TypeError(f"perftest output must be text, got {type(text).__name__}")
    out: dict = {"test": None, "device": None, "link_type": None, "mtu": None,
                 "gid_index": None, "units": None, "rows": [], "errors": []}  # fmt: skip
    for raw in text.splitlines():
        if m := _TITLE.match(raw):
            out["test"] = m[1]
        elif m := _HEADER.search(raw):
            out["units"] = m[2]
        elif out["units"] and (m := _ROW.match(raw)):
            out["rows"].append({
                "bytes": int(m[1]), "iterations": int(m[2]),
                "bw_peak_gbps": to_gbps(float(m[3]), out["units"]),
                "bw_average_gbps": to_gbps(float(m[4]), out["units"]),
                "msg_rate_mpps": float(m[5]),
            })  # fmt: skip
        elif _ERROR.search(raw):
            out["errors"].append(raw.strip())
        else:
            out.update({k: v for k, v in _fields(raw).items() if out.get(k) is None})
    if out["mtu"] is not None:
        out["mtu"] = int(re.sub(r"\D", "", out["mtu"]) or 0)
    if out["gid_index"] is not None:
        out["gid_index"] = int(out["gid_index"])
    if out["test"] is None and not out["rows"] and not out["errors"]:
        raise ValueError(
            f"not perftest output: no '... BW Test' title and no result row; got {text.strip()[:80]!r}"
        )
    return out


def largest(parsed: dict) -> dict | None:
    """The row of the largest message (where a link should reach its rate), or None."""
    return max(parsed["rows"], key=lambda r: r["bytes"], default=None)
