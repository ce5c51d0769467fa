"""Plausible wrong answers to lecture 04's judged exercises: each must fail its check.

Every mutant is the lecture's solution with some replacements in one answer cell:
``{exercise: {name: (cell id, [(old, new), ...])}}`` (see ``solutions/mutants/lab03.py``).
``ddtk course check --mutants`` and ``tests/test_judging_lectures.py`` prove that the
stub fails, the solution passes and every mutant fails, with the message saying why.
"""

NCCL_LOG, PORTS, GROUPS, FABRIC, CULPRITS, FIXES = (
    "27eacbee",
    "1907ac93",
    "80032d0a",
    "8389e1bf",
    "898be430",
    "l04-ex6",
)

MUTANTS = {
    1: {
        "any IB channel counts as GPUDirect RDMA": (
            NCCL_LOG,
            [
                (
                    'if re.search(r"via NET/IB/\\d+/GDRDMA", log):',
                    'if re.search(r"via NET/IB/\\d+", log):',
                )
            ],
        ),
        "the Docker bridge is looked for in the Bootstrap line only": (
            NCCL_LOG,
            [
                (
                    'r"(Bootstrap|NET/Socket) : Using (\\[\\d+\\])?docker"',
                    'r"Bootstrap : Using docker"',
                )
            ],
        ),
        "IB without GDR answered by forcing NCCL_NET_GDR_LEVEL=PHB": (
            NCCL_LOG,
            [
                (
                    '        transport = "IB"  # no GPUDirect RDMA',
                    '        fixes["NCCL_NET_GDR_LEVEL"] = "PHB"\n        transport = "IB"  # no GPUDirect RDMA',
                )
            ],
        ),
        "NCCL_IB_DISABLE=0 suggested for every socket log": (
            NCCL_LOG,
            [
                (
                    '        if re.search(r"NCCL_IB_DISABLE set by environment to 1", log):\n'
                    '            fixes["NCCL_IB_DISABLE"] = "0"\n',
                    '        fixes["NCCL_IB_DISABLE"] = "0"\n',
                )
            ],
        ),
    },
    2: {
        "the LID is never checked": (
            PORTS,
            [
                (
                    '        if field.get("link_layer") == "InfiniBand" and int(field.get("base lid", "0"), 16) == 0:\n'
                    "            ok = False  # no subnet manager: not on the managed fabric\n",
                    "",
                )
            ],
        ),
        "a zero LID is refused on RoCE too": (
            PORTS,
            [('if field.get("link_layer") == "InfiniBand" and int(', "if int(")],
        ),
        "NCCL_IB_HCA without the leading '='": (
            PORTS,
            [('    return "=" + ",".join(ports)\n', '    return ",".join(ports)\n')],
        ),
    },
    3: {
        "TP is the slowest dimension": (
            GROUPS,
            [("        return t + tp * (d + dp * p)", "        return d + dp * (p + pp * t)")],
        ),
        "the PP groups are blocks of consecutive ranks": (
            GROUPS,
            [
                (
                    '"pp": [[rank(t, p, d) for p in range(pp)] for t in range(tp) for d in range(dp)],',
                    '"pp": [list(range(i * pp, (i + 1) * pp)) for i in range(tp * dp)],',
                )
            ],
        ),
        "the DP groups are built in another rank order": (
            GROUPS,
            [
                (
                    '"dp": [[rank(t, p, d) for d in range(dp)] for t in range(tp) for p in range(pp)],',
                    '"dp": [[t + tp * (p + pp * d) for d in range(dp)] for t in range(tp) for p in range(pp)],',
                )
            ],
        ),
    },
    4: {
        "the smallest oversubscription that meets the target": (
            FABRIC,
            [
                (
                    "    return max(over for over in choices",
                    "    return min(over for over in choices",
                )
            ],
        ),
        "the notebook's choices hard-coded": (
            FABRIC,
            [
                (
                    "return max(over for over in choices if",
                    "return max(over for over in (1, 2, 4, 8) if",
                )
            ],
        ),
        "the notebook's tolerance hard-coded": (
            FABRIC,
            [("    target = (1 - tolerance) * busbw(1)", "    target = 0.9 * busbw(1)")],
        ),
    },
    5: {
        "links through a slow NIC reported as slow paths too": (
            CULPRITS,
            [
                (
                    "    paths = [(s, d) for s, d in slow if s not in nics and d not in nics]",
                    "    paths = slow",
                )
            ],
        ),
        "the notebook's threshold hard-coded": (
            CULPRITS,
            [("bandwidth[s][d] < threshold * fastest]", "bandwidth[s][d] < 0.5 * fastest]")],
        ),
        "every rank on a slow link counted as a slow NIC": (
            CULPRITS,
            [
                (
                    "    nics = [r for r in range(n) if sum(r in link for link in slow) == 2 * (n - 1)]",
                    "    nics = sorted({r for link in slow for r in link})",
                )
            ],
        ),
    },
    6: {
        "the MTU rule applied to InfiniBand ports too": (
            FIXES,
            [
                (
                    'elif p["link_layer"] == "Ethernet" and p["active_mtu"] < 4096:',
                    'elif p["active_mtu"] < 4096:',
                )
            ],
        ),
        "the line rate compared in bytes": (
            FIXES,
            [
                (
                    "write_bw_gbps < 0.8 * line_rate_gbps:",
                    "write_bw_gbps < 0.8 * line_rate_gbps / 8:",
                )
            ],
        ),
        "every IB without GDR blamed on the peer-memory module": (
            FIXES,
            [
                (
                    'fixes.append(("nccl", "PCIe path" if far else "peer memory"))',
                    'fixes.append(("nccl", "peer memory"))',
                )
            ],
        ),
        "a port in INIT sent to the cable": (
            FIXES,
            [
                (
                    'fixes.append((where, "subnet manager"))  # INIT or ARMED',
                    'fixes.append((where, "cable"))  # INIT or ARMED',
                )
            ],
        ),
    },
}
