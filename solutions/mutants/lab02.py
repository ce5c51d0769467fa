"""Plausible wrong answers to lab 02's judged exercises: each must fail its check.

Every mutant is the solution with some replacements in one answer cell: ``{exercise:
{name: (cell id, [(old, new), ...])}}``. An ``old`` text that is no longer in the
solution makes the mutant matrix fail, so the mutants follow the solution when it
changes. ``ddtk course check --mutants`` (and ``tests/test_judging_lab02.py``) prove
that the stub fails, the solution passes and every mutant fails, with the message
saying why. Several of them pass the notebook's own check cell (its fixed toy inputs)
and only the judge's seeded inputs catch them.
"""

PLACEMENT, SETUP, LR, DISTRIBUTE = "1b5bee1f", "7576f2dd", "17015b3d", "b780aa0b"
END_EPOCH, SPANS, DIAGNOSIS, SCALING = "274d414e", "6b540593", "84157591", "3860097d"

MUTANTS = {
    1: {
        "cross_rank is the host's position in the list": (
            PLACEMENT,
            [
                (
                    "    for host, host_slots in entries:\n",
                    "    for host_index, (host, host_slots) in enumerate(entries):\n",
                ),
                (
                    "            cross_rank = hosts_with_local_rank.get(local_rank, 0)\n",
                    "            cross_rank = host_index\n",
                ),
            ],
        ),
        "no ValueError when the hosts have too few slots": (
            PLACEMENT,
            [
                (
                    "    if sum(s for _, s in entries) < np:\n"
                    '        raise ValueError(f"{hosts} has {sum(s for _, s in entries)} slots, '
                    'fewer than np={np}")\n',
                    "",
                ),
            ],
        ),
        "every slot gets a rank, whatever np": (
            PLACEMENT,
            [("            if len(out) == np:\n                return out\n", "")],
        ),
    },
    2: {
        "Horovod is never initialised": (SETUP, [("    hvd.init()\n", "")]),
        "every rank takes every core": (
            SETUP,
            [
                (
                    "    torch.set_num_threads(max(1, cores // sharing))\n",
                    "    torch.set_num_threads(cores)\n",
                )
            ],
        ),
        "the ranks under this host name share the machine (local_size)": (
            SETUP,
            [
                (
                    "    sharing = hvd.allgather_object(here).count(here)\n",
                    "    sharing = hvd.local_size()\n",
                )
            ],
        ),
        "every rank of the job shares the machine (size)": (
            SETUP,
            [
                (
                    "    sharing = hvd.allgather_object(here).count(here)\n",
                    "    sharing = hvd.size()\n",
                )
            ],
        ),
        "the share rounded up": (
            SETUP,
            [("max(1, cores // sharing)", "-(-cores // sharing)")],
        ),
        "the GPU is chosen by rank, not local_rank": (
            SETUP,
            [("hvd.local_rank()", "hvd.rank()")],
        ),
        "the device is returned but never pinned": (
            SETUP,
            [("        torch.cuda.set_device(hvd.local_rank())\n", "")],
        ),
    },
    3: {
        "the warm-up rounded down to whole steps": (
            LR,
            [
                (
                    "    warmup_steps = warmup_epochs * steps_per_epoch\n",
                    "    warmup_steps = int(warmup_epochs * steps_per_epoch)\n",
                ),
            ],
        ),
        "the packaged recipe's warm-up (from the scaled rate / warm-up steps)": (
            LR,
            [
                (
                    "    progress = 1.0 if warmup_steps <= 0 else min(1.0, step / warmup_steps)\n"
                    "    return base_lr * (1.0 + (size - 1) * progress)\n",
                    "    peak = base_lr * size\n"
                    "    return peak if step >= warmup_steps else peak * (step + 1) / warmup_steps\n",
                ),
            ],
        ),
        "no plateau after the warm-up": (
            LR,
            [("min(1.0, step / warmup_steps)", "step / warmup_steps")],
        ),
    },
    4: {
        "parameters broadcast without the buffers": (
            DISTRIBUTE,
            [
                (
                    "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
                    "hvd.broadcast_parameters(dict(model.named_parameters()), root_rank=0)",
                ),
            ],
        ),
        "gradients summed, not averaged": (
            DISTRIBUTE,
            [("compression=compression\n", "compression=compression, op=hvd.Sum\n")],
        ),
        "the compression argument is ignored": (
            DISTRIBUTE,
            [(", compression=compression\n", "\n")],
        ),
    },
    5: {
        "metrics reduced in float32": (
            END_EPOCH,
            [("dtype=torch.float64", "dtype=torch.float32")],
        ),
        "the first rank of every host saves (local_rank == 0)": (
            END_EPOCH,
            [("    if hvd.rank() == 0:\n", "    if hvd.local_rank() == 0:\n")],
        ),
        "metrics in each rank's insertion order, not sorted": (
            END_EPOCH,
            [("    names = sorted(local_metrics)\n", "    names = list(local_metrics)\n")],
        ),
    },
    6: {
        "depth capped at one": (
            SPANS,
            [('"depth": len(stack),', '"depth": min(len(stack), 1),')],
        ),
        "times from the first span, not the first event": (
            SPANS,
            [
                (
                    't0 = min(e["ts"] for e in events if "ts" in e)',
                    't0 = min(e["ts"] for e in events if e.get("ph") == "B")',
                ),
            ],
        ),
        "one stack for every row": (
            SPANS,
            [
                (
                    'stack = open_spans.setdefault(e.get("pid"), [])',
                    "stack = open_spans.setdefault(0, [])",
                ),
            ],
        ),
    },
    7: {
        "overlapping spans summed, not counted once": (
            DIAGNOSIS,
            [
                (
                    'return busy_ms(grads[grads["phase"].isin(phases)]) / steps',
                    'return float(grads[grads["phase"].isin(phases)]["dur_ms"].sum()) / steps',
                )
            ],
        ),
        "the metric averages counted as gradients": (
            DIAGNOSIS,
            [
                (
                    'spans[spans["tensor"].str.startswith("allreduce.") & ~spans["tensor"].str.contains("noname")]',
                    'spans[spans["tensor"].str.startswith("allreduce.")]',
                )
            ],
        ),
        "every tensor's reduce span counted as a call": (
            DIAGNOSIS,
            [('calls = reduces["start_ms"].round(3).nunique()', "calls = len(reduces)")],
        ),
        "the threshold fixed at 256 KiB": (
            DIAGNOSIS,
            [
                (
                    'evidence["bytes_per_call"] < latency_bytes',
                    'evidence["bytes_per_call"] < 256 * 1024',
                )
            ],
        ),
        "every row's bytes, broadcasts included": (
            DIAGNOSIS,
            [
                (
                    'payload = grads.loc[(grads["phase"] == "ALLREDUCE") & (grads["depth"] == 0), "bytes"].sum()',
                    'payload = spans.loc[spans["phase"] == "ALLREDUCE", "bytes"].sum()',
                )
            ],
        ),
    },
    8: {
        "throughput extrapolated in a straight line from the largest run": (
            SCALING,
            [
                (
                    "    predicted = {n: amdahl(min(n, cores)) for n in predict}",
                    "    top = max(images_per_s)\n"
                    "    predicted = {n: images_per_s[top] * min(n, cores) / top for n in predict}",
                )
            ],
        ),
        "a growing e predicted as if it were constant": (
            SCALING,
            [
                (
                    "        f = min(1.0, max(0.0, a + b * m))",
                    "        f = min(1.0, max(0.0, a + b * sum(usable) / len(usable)))",
                )
            ],
        ),
        "no cap at one process per core": (
            SCALING,
            [
                (
                    "    predicted = {n: amdahl(min(n, cores)) for n in predict}",
                    "    predicted = {n: amdahl(n) for n in predict}",
                )
            ],
        ),
        "efficiency in place of speedup in Karp-Flatt": (
            SCALING,
            [
                (
                    "        speedup = images_per_s[n] / x1",
                    "        speedup = images_per_s[n] / (n * x1)",
                )
            ],
        ),
        "the trend read from every run, past the core count too": (
            SCALING,
            [
                (
                    "    usable = [n for n in karp_flatt if n <= cores] or list(karp_flatt)",
                    "    usable = list(karp_flatt)",
                )
            ],
        ),
    },
}
