"""Name the bottleneck of a profiled job in plain words, with the numbers behind it.

:func:`diagnose` reads a :class:`~ddtk.profiling.breakdown.Breakdown` and returns
:class:`Finding` objects, the largest share of the step first. Each rule is one row of
the taxonomy lecture 07 teaches:

===============  ===========================================  ==============================
finding          evidence in the trace                        usual fix
===============  ===========================================  ==============================
input            batch fetches take a share of the step       DataLoader workers, prefetch
straggler        one rank's busy time is well above the       replace or rebalance the node
                 others'; they wait for it in all-reduce
communication    collectives in flight that nothing hides     bigger buckets, fewer syncs,
                                                              compression, faster links
small-messages   many collectives of a few hundred KB         a larger ``bucket_cap_mb``
sync-per-micro   a collective after every micro-batch         ``no_sync()`` while accumulating
optimizer        ``optimizer.step`` takes a share             foreach/fused, ZeRO
host/idle        nothing runs (sleeps, Python, host waits)    remove syncs, CUDA graphs
precision        compute-bound in float32 matmuls             bf16 autocast
===============  ===========================================  ==============================

The thresholds are module constants; a share below them is not worth a sentence.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ddtk.profiling.breakdown import Breakdown, stragglers
from ddtk.sizes import format_bytes

__all__ = ["THRESHOLDS", "Finding", "diagnose", "explain"]

THRESHOLDS = {
    "input": 0.15,
    "communication": 0.20,
    "optimizer": 0.15,
    "idle": 0.15,
    "precision": 0.50,
    "small_message_bytes": 1 << 20,
    "small_message_count": 6,
}


@dataclass(frozen=True)
class Finding:
    """One diagnosed bottleneck: a kind from the taxonomy, its share of the step, and why."""

    kind: str
    share: float
    ranks: tuple[int, ...]
    message: str
    evidence: dict = field(default_factory=dict)


def _ranks_text(ranks: list[int], world: int) -> str:
    if len(ranks) == world and world > 1:
        return "on every rank"
    return ("on rank " if len(ranks) == 1 else "on ranks ") + ", ".join(map(str, ranks))


def _share_finding(
    bd: Breakdown, part: str, kind: str, threshold: float, advice: str, what: str
) -> Finding | None:
    shares = {r: bd.share(r, part) for r in bd.ranks}
    hit = [r for r, s in shares.items() if s >= threshold]
    if not hit:
        return None
    mean = statistics.fmean(shares[r] for r in hit)
    ms = statistics.fmean(bd.mean(r, f"{part}_ms") for r in hit)
    step = statistics.fmean(bd.mean(r, "step_ms") for r in hit)
    return Finding(
        kind, mean, tuple(hit),
        f"{what} is {mean:.0%} of the step {_ranks_text(hit, len(bd.ranks))} "
        f"({ms:.1f} ms of {step:.1f} ms): {advice}",
        {"share_by_rank": shares, "ms_per_step": ms, "step_ms": step},
    )  # fmt: skip


def _straggler_findings(bd: Breakdown) -> list[Finding]:
    out = []
    for s in stragglers(bd):
        others = [r for r in bd.ranks if r != s["rank"]]
        waited = statistics.fmean(bd.mean(r, "communication_ms") for r in others)
        step = bd.mean(s["rank"], "step_ms")
        excess = s["busy_ms"] - s["others_ms"]
        out.append(Finding(
            "straggler", excess / step if step else 0.0, (s["rank"],),
            f"rank {s['rank']} is a straggler: it is busy {s['busy_ms']:.1f} ms per step against "
            f"{s['others_ms']:.1f} ms on the other ranks ({s['ratio']:.1f}x), and they wait "
            f"{waited:.1f} ms per step for it in their collectives: find what slows that node "
            "(a slower device, a noisy neighbour, a throttled link) or give it less work",
            {**s, "others_wait_ms": waited},
        ))  # fmt: skip
    return out


def _communication_findings(bd: Breakdown, straggling: set[int]) -> list[Finding]:
    """Communication that nothing hides, small messages, and a sync per micro-batch.

    With a straggler, the other ranks' exposed communication is mostly waiting for it,
    so only the stragglers' own is counted: they arrive last at every collective and
    wait for nobody, so what they spend there is the transfer itself.
    """
    ranks = sorted(straggling) if straggling else bd.ranks
    if len(bd.ranks) < 2:
        return []
    out = []
    rows = [row for row in bd.per_rank() if row["rank"] in ranks]
    share = statistics.fmean(bd.share(r, "communication") for r in ranks)
    count = statistics.fmean(row["collectives"] for row in rows)
    size = statistics.fmean(row["comm_bytes"] for row in rows) / count if count else 0.0
    overlap = statistics.fmean(row["overlap"] for row in rows)
    if share >= THRESHOLDS["communication"]:
        who = (
            f"even on straggling rank {', '.join(map(str, ranks))}, which waits for nobody"
            if straggling
            else _ranks_text(ranks, len(bd.ranks))
        )
        out.append(Finding(
            "communication", share, tuple(ranks),
            f"communication nothing hides is {share:.0%} of the step {who}; "
            f"only {overlap:.0%} of the time collectives were in flight overlapped other work. "
            "Fewer or larger all-reduces (bucket size, accumulation with no_sync), compression "
            "(a DDP comm hook) or a faster transport",
            {"share": share, "overlap": overlap, "collectives_per_step": count, "bytes_per_collective": size},
        ))  # fmt: skip
    if count >= THRESHOLDS["small_message_count"] and 0 < size < THRESHOLDS["small_message_bytes"]:
        out.append(Finding(
            "small-messages", share, tuple(ranks),
            f"{count:.0f} collectives per step averaging {format_bytes(size)}: each pays the "
            "per-message latency. Raise DDP's bucket_cap_mb (25 MB by default) so gradients go out in a few large buckets",
            {"collectives_per_step": count, "bytes_per_collective": size},
        ))  # fmt: skip
    synced = statistics.fmean(row["synced_forwards"] for row in rows)
    forwards = statistics.fmean(row["forwards"] for row in rows)
    if forwards > 1 and synced > 1.5:
        out.append(Finding(
            "sync-per-microbatch", share, tuple(ranks),
            f"gradients are all-reduced after {synced:.0f} of the {forwards:.0f} micro-batches of every "
            "optimizer step: run all but the last micro-batch under model.no_sync(), so the "
            "accumulated gradient is all-reduced once",
            {"forwards_per_step": forwards, "synced_forwards_per_step": synced},
        ))  # fmt: skip
    return out


def _precision_finding(bd: Breakdown) -> Finding | None:
    rows = bd.per_rank()
    compute = statistics.fmean(bd.share(r["rank"], "compute") for r in rows)
    fp32 = statistics.fmean(r["fp32_matmul"] for r in rows)
    if compute < THRESHOLDS["precision"] or fp32 < 0.5:
        return None
    return Finding(
        "precision", compute * fp32, tuple(bd.ranks),
        f"compute is {compute:.0%} of the step and {fp32:.0%} of the matrix-multiply time runs in "
        "float32: autocast to bfloat16 (GPUs since Ampere; CPUs with AVX512-BF16 or AMX) halves "
        "the bytes and, where the hardware has bf16 units, the time",
        {"compute_share": compute, "fp32_matmul_share": fp32},
    )  # fmt: skip


def diagnose(bd: Breakdown) -> list[Finding]:
    """Every bottleneck above its threshold, the largest share of the step first."""
    findings: list[Finding] = []
    strag = _straggler_findings(bd)
    findings += strag
    for part, kind, what, advice in (
        ("data", "input", "data loading",
         "the model waits for batches. Raise the DataLoader's num_workers, keep prefetch_factor "
         "batches ready, pin memory, or move decoding out of the training process"),
        ("optimizer", "optimizer", "the optimizer step",
         "use a foreach or fused implementation, or shard optimizer state (ZeRO)"),
        ("idle", "idle", "time where nothing runs",
         "look for sleeps, host-device synchronisation (.item(), printing a tensor) or Python "
         "between operators; on GPUs, CUDA graphs or torch.compile cut launch overhead"),
    ):  # fmt: skip
        f = _share_finding(bd, part, kind, THRESHOLDS[kind], advice, what)
        if f:
            findings.append(f)
    findings += _communication_findings(bd, {f.ranks[0] for f in strag})
    p = _precision_finding(bd)
    if p:
        findings.append(p)
    return sorted(findings, key=lambda f: -f.share)


def explain(findings: list[Finding]) -> str:
    """The findings as numbered sentences, or a sentence saying nothing stands out."""
    if not findings:
        return "No bottleneck above the thresholds: compute dominates and little waits."
    return "\n".join(f"{i}. {f.message}" for i, f in enumerate(findings, 1))
