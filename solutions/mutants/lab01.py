"""Plausible wrong answers to lab 01's judged exercises: each must fail its check.

Every mutant is the solution with some replacements in one answer cell: ``{exercise:
{name: (cell id, [(old, new), ...])}}``. An ``old`` text that is no longer in the
solution makes the mutant matrix fail, so the mutants follow the solution when it
changes. ``ddtk course check --mutants`` (and ``tests/test_judging_lab01.py``) prove
that the stub fails, the solution passes and every mutant fails, with the message
saying why. Exercise 7 (the interpretation) is not judged, so it has no mutants.
"""

CLUSTER, RAYCLUSTER, LOOP, PARSER, DDP, TABLE = (
    "c497dfd5", "7f0c1c5d", "a8b3465f", "28124bec", "661c2225", "cb951e0e",
)  # fmt: skip

MUTANTS = {
    1: {
        "one node too many: num_nodes worker nodes besides the head": (
            CLUSTER,
            [("    for _ in range(num_nodes - 1):\n", "    for _ in range(num_nodes):\n")],
        ),
        "the head advertises Ray's default CPUs": (
            CLUSTER,
            [('            "num_cpus": cpus_per_node,\n', "")],
        ),
        "the CPU count hard-coded to the laptop default": (
            CLUSTER,
            [
                ('"num_cpus": cpus_per_node,', '"num_cpus": 2,'),
                ("cluster.add_node(num_cpus=cpus_per_node)", "cluster.add_node(num_cpus=2)"),
            ],
        ),
        "returns before the nodes have registered": (
            CLUSTER,
            [
                (
                    "cluster.add_node(num_cpus=cpus_per_node)",
                    "cluster.add_node(num_cpus=cpus_per_node, wait=False)",
                ),
                ("    cluster.wait_for_nodes()\n", ""),
            ],
        ),
        "a fixed dashboard port": (
            CLUSTER,
            [('"dashboard_port": free_port(),', '"dashboard_port": 8265,')],
        ),
    },
    2: {
        "the notebook's sizes hard-coded": (
            RAYCLUSTER,
            [
                (
                    "replicas=workers, minReplicas=workers, maxReplicas=2 * workers",
                    "replicas=2, minReplicas=2, maxReplicas=4",
                ),
                ('{"num-cpus": str(cpus)}', '{"num-cpus": "4"}'),
                (
                    'amount = {"cpu": str(cpus), "memory": memory}',
                    'amount = {"cpu": "4", "memory": "8Gi"}',
                ),
            ],
        ),
        "a number where rayStartParams needs a string": (
            RAYCLUSTER,
            [('{"num-cpus": str(cpus)}', '{"num-cpus": cpus}')],
        ),
        "maxReplicas equal to the workers": (
            RAYCLUSTER,
            [("maxReplicas=2 * workers", "maxReplicas=workers")],
        ),
        "the template passed in is edited in place": (
            RAYCLUSTER,
            [("    manifest = copy.deepcopy(template)\n", "    manifest = template\n")],
        ),
        "the notebook's template instead of the one passed in": (
            RAYCLUSTER,
            [
                (
                    "    manifest = copy.deepcopy(template)\n",
                    "    manifest = yaml.safe_load(RAYCLUSTER_TEMPLATE)\n",
                )
            ],
        ),
    },
    3: {
        "no DDP: the model is never prepared": (
            LOOP,
            [("model = ray.train.torch.prepare_model(SmallCNN())", "model = SmallCNN()")],
        ),
        "the accuracy of this worker's shard only": (
            LOOP,
            [("        dist.all_reduce(counts)\n", "")],
        ),
        "the checkpoint holds the DDP wrapper's keys": (
            LOOP,
            [
                (
                    '"model": model.module.state_dict()\n'
                    '                    if hasattr(model, "module")\n'
                    "                    else model.state_dict(),",
                    '"model": model.state_dict(),',
                )
            ],
        ),
        "the notebook's learning rate hard-coded": (
            LOOP,
            [('lr=config["lr"]', "lr=0.05")],
        ),
    },
    4: {
        "labels split on every comma": (
            PARSER,
            [
                (
                    "            i = 0\n            while True:\n"
                    '                while i < len(rest) and rest[i] in ", ":\n',
                    '            inside, rest = rest.split("}", 1)\n'
                    '            for pair in filter(None, inside.split(",")):\n'
                    '                key, raw = pair.split("=", 1)\n'
                    "                labels[key.strip()] = raw.strip().strip('\"')\n"
                    "            i = 0\n            while False:\n"
                    '                while i < len(rest) and rest[i] in ", ":\n',
                )
            ],
        ),
        "escapes kept as written": (
            PARSER,
            [
                (
                    "                        value.append(\n"
                    r"""                            {"n": "\n", "\\": "\\", '"': '"'}.get(rest[j + 1], rest[j + 1])"""
                    "\n                        )\n",
                    "                        value.append(rest[j : j + 2])\n",
                )
            ],
        ),
        "the timestamp read as the value": (
            PARSER,
            [("float(fields[0])", "float(fields[-1])")],
        ),
        "the check cell's reference parser instead of one's own": (
            PARSER,
            [
                (
                    "    for line in text.splitlines():\n",
                    "    return reference_samples(text)\n    for line in text.splitlines():\n",
                )
            ],
        ),
    },
    5: {
        "no DDP wrapper: each rank trains alone": (
            DDP,
            [
                ("model = DDP(SmallCNN())", "model = SmallCNN()"),
                ("model.module(torch.from_numpy", "model(torch.from_numpy"),
            ],
        ),
        "contiguous halves instead of every world_size-th sample": (
            DDP,
            [
                (
                    'data["train"]["image"][ctx.rank :: ctx.world_size]',
                    'np.array_split(data["train"]["image"], ctx.world_size)[ctx.rank]',
                ),
                (
                    'data["train"]["label"][ctx.rank :: ctx.world_size]',
                    'np.array_split(data["train"]["label"], ctx.world_size)[ctx.rank]',
                ),
            ],
        ),
        "pixels not scaled": (
            DDP,
            [
                (
                    'scale_pixels({"image": x, "label": y})',
                    '{"image": x.astype("float32"), "label": y}',
                )
            ],
        ),
        "a checksum reported instead of computed": (
            DDP,
            [
                (
                    "checksum = float(sum(p.detach().sum() for p in model.parameters()))",
                    "checksum = 0.0  # equal on every rank",
                )
            ],
        ),
    },
    6: {
        "efficiency without the worker count": (
            TABLE,
            [('r / (n * ray_runs[1]["samples_per_s"])', 'r / ray_runs[1]["samples_per_s"]')],
        ),
        "DDP over Ray instead of Ray over DDP": (
            TABLE,
            [('"ray_over_ddp": r / d,', '"ray_over_ddp": d / r,')],
        ),
        "rows in the order the runs came": (
            TABLE,
            [
                (
                    "for n in sorted(set(ray_runs) & set(ddp_runs)):",
                    "for n in [k for k in ray_runs if k in ddp_runs]:",
                )
            ],
        ),
        "no check for DDP's 1-worker run": (
            TABLE,
            [('(("Ray Train", ray_runs), ("DDP", ddp_runs))', '(("Ray Train", ray_runs),)')],
        ),
    },
}
