"""Published nccl-tests results, and how far :mod:`ddtk.net.predict` is from each.

Every entry is a row of a real ``all_reduce_perf`` output (or a figure its
author reported in words), with where it comes from. :func:`validate` predicts
each one with the matching preset and returns the error, which lecture 04 and
``docs/benchmarks.md`` print as a table.

Two-node runs are kept apart by NCCL's maintainers for a reason the model
reproduces: "on 2 nodes, we use trees which due to some trick can reach up to 2x
the network bandwidth" (S. Jeaugey, NVIDIA/nccl #307), so their busbw is not the
NIC's rate. The model's double binary tree sends half as many bytes per NIC on
two nodes, which is that trick.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ddtk.net.predict import Prediction, predict
from ddtk.net.topology import Cluster, preset

_AZURE = "https://github.com/Azure/AI-benchmarking-guide"
_AWS = (
    "https://github.com/aws-samples/awsome-distributed-training/blob/main/"
    "micro-benchmarks/nccl-tests/README.md"
)


@dataclass(frozen=True)
class Published:
    """One published all_reduce measurement: where, what size, what busbw (GB/s), and the source."""

    system: str
    preset: str
    nodes: int
    nbytes: int
    busbw_gbps: float
    source: str
    algorithm: str | None = None  # as NCCL ran it, when the source says; None: the model's best
    changes: dict[str, Any] = field(default_factory=dict)  # fields that differ from the preset
    note: str = ""
    calibrates: str = ""  # the model constant taken from this run's thread (not a test of it)

    def cluster(self) -> Cluster:
        """The preset with this system's node count and differences."""
        return replace(preset(self.preset, self.nodes), **self.changes)


MEASUREMENTS: tuple[Published, ...] = (
    Published(
        "8 x A100 SXM4 80GB (Azure ND A100 v4), NCCL 2.18.5",
        "dgx-a100",
        1,
        8 << 30,
        231.58,
        f"{_AZURE}, Azure_Results/ND_A100_v4_results.md, in-place busbw, row 8G",
        algorithm="ring",
        note="A100 has no NVLink SHARP: a ring",
    ),
    Published(
        "8 x A100 SXM4 80GB (Azure ND A100 v4), NCCL 2.18.5",
        "dgx-a100",
        1,
        64 << 20,
        166.63,
        f"{_AZURE}, Azure_Results/ND_A100_v4_results.md, row 67M",
        note="medium size: NCCL's channels and pipeline are still filling",
    ),
    Published(
        "8 x A100 SXM4 80GB (Azure ND A100 v4), NCCL 2.18.5",
        "dgx-a100",
        1,
        1 << 20,
        36.22,
        f"{_AZURE}, Azure_Results/ND_A100_v4_results.md, row 1M",
        note="small size: launch and synchronisation costs the model does not have",
    ),
    Published(
        "8 x H100 (HGX), NVLS disabled",
        "dgx-h100",
        1,
        16 << 30,
        368.76,
        "https://github.com/NVIDIA/nccl-tests/issues/309 ('Once I disable NVLS, i got 368.76 "
        "GB/s'), peak of a sweep to 16 GB",
        algorithm="ring",
        calibrates="Simple's 80 % of NVLink (nccl-tests #212: 370 of 450 GB/s)",
    ),
    Published(
        "8 x H100 80GB HBM3 (Azure ND H100 v5), NCCL 2.18.5",
        "dgx-h100",
        1,
        8 << 30,
        478.87,
        f"{_AZURE}, Azure Results/ND_H100_v5_results.md, row 8G",
        algorithm="nvls",
        note="NVLink SHARP; busbw is then 'the NVLink bandwidth you would need "
        "... if you didn't have NVLS' (nccl-tests #212)",
    ),
    Published(
        "8 x H100 80GB HBM3 (Azure ND H100 v5), NCCL 2.18.5",
        "dgx-h100",
        1,
        64 << 20,
        361.78,
        f"{_AZURE}, Azure Results/ND_H100_v5_results.md, row 67M",
        algorithm="nvls",
        note="medium size",
    ),
    Published(
        "3 nodes x 8 A100 SXM4 40GB, 4 x HDR 200 Gb/s per node",
        "dgx-a100",
        3,
        131072008,
        96.45,
        "https://github.com/NVIDIA/nccl-tests/issues/119, last out-of-place row",
        changes={"nics_per_node": 4},
        calibrates="Simple's 96 % of a NIC ('24GB/s ... per 200G NIC', said of this run)",
    ),
    Published(
        "4 nodes x 8 H100 (HGX), one 400 Gb/s NIC per GPU",
        "dgx-h100",
        4,
        16 << 30,
        365.84,
        "https://github.com/NVIDIA/nccl-tests/issues/309 ('max busbw can get 365.84 GB/s')",
    ),
    Published(
        "8 nodes x 8 H100, InfiniBand (CoreWeave)",
        "dgx-h100",
        8,
        8 << 30,
        386.56,
        "https://github.com/coreweave/nccl-tests README, H100 64-GPU example, out-of-place",
        note="the fabric has SHARP, but the busbw sits at the ring's NIC bound",
    ),
    Published(
        "2 x AWS p4de.24xlarge (8 x A100, 4 x 100 Gb/s EFA)",
        "aws-p4d",
        2,
        2 << 30,
        78.33,
        f"{_AWS}, 2x p4de table, row 2147483648, out-of-place",
        note="two nodes",
    ),
    Published(
        "2 x AWS p5.48xlarge (8 x H100, 3200 Gb/s EFA)",
        "aws-p5",
        2,
        16 << 30,
        487.09,
        f"{_AWS}, 2x p5 table, row 17179869184, out-of-place",
        note="two nodes",
    ),
)


@dataclass(frozen=True)
class Check:
    """One published measurement next to the model's prediction."""

    published: Published
    prediction: Prediction

    @property
    def error(self) -> float:
        """(predicted - measured) / measured, on busbw."""
        return self.prediction.busbw / 1e9 / self.published.busbw_gbps - 1


def validate(measurements: tuple[Published, ...] = MEASUREMENTS) -> list[Check]:
    """Predict every published measurement with its preset."""
    return [
        Check(m, predict(m.cluster(), "all_reduce", m.nbytes, m.algorithm)) for m in measurements
    ]


def is_large(check: Check) -> bool:
    """Messages of 128 MB and more, where both the model and NCCL are bandwidth-bound."""
    return check.published.nbytes >= 128_000_000


def summary(checks: list[Check]) -> dict[str, float]:
    """Mean and worst absolute error (%) of the independent checks (not calibration runs).

    ``large_*`` keep messages of 128 MB and more; ``all_*`` every size.
    """
    independent = [c for c in checks if not c.published.calibrates]
    large = [c for c in independent if is_large(c)]

    def mean(cs: list[Check]) -> float:
        return 100 * sum(abs(c.error) for c in cs) / max(len(cs), 1)

    return {
        "independent": len(independent),
        "large": len(large),
        "all_mean_abs_error_pct": mean(independent),
        "large_mean_abs_error_pct": mean(large),
        "large_worst_abs_error_pct": 100 * max((abs(c.error) for c in large), default=0.0),
    }


def table(checks: list[Check]) -> str:
    """A markdown table: system, size, algorithm, measured, predicted, error, bottleneck, source."""
    from ddtk.bench.timing import format_bytes

    lines = [
        "| system | size | algorithm / protocol | measured busbw | predicted | error | limited by | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        p, m = c.prediction, c.published
        lines.append(
            f"| {m.system} | {format_bytes(m.nbytes)} | {p.algorithm} / {p.protocol} | "
            f"{m.busbw_gbps:.1f} GB/s | {p.busbw / 1e9:.1f} GB/s | {c.error:+.0%}"
            f"{' (calibration)' if m.calibrates else ''} | "
            f"{p.bottleneck} | {m.source} |"
        )
    return "\n".join(lines)
