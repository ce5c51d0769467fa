"""Plausible wrong answers to lab 01's judged exercises: each must fail its check.

Every mutant is the solution with some replacements in one answer cell: ``{exercise:
{name: (cell id, [(old, new), ...])}}``. An ``old`` text that is no longer in the
solution makes the mutant matrix fail, so the mutants follow the solution when it
changes. ``ddtk course check --mutants`` (and ``tests/test_judging_lab01.py``) prove
that the stub fails, the solution passes and every mutant fails, with the message
saying why. Exercise 7 (the interpretation) is not judged, so it has no mutants.
"""

CLUSTER, RAYCLUSTER, LOOP, QUERIES, DDP, TABLE = (
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
        "the samples counted once per epoch, not per step": (
            LOOP,
            [
                ('            samples_total.inc(len(batch["label"]), tags=tags)\n', ""),
                (
                    "        train_s = time.perf_counter() - began\n",
                    "        train_s = time.perf_counter() - began\n"
                    "        samples_total.inc(samples, tags=tags)\n",
                ),
            ],
        ),
        "the notebook's run name hard-coded in the counter's tags": (
            LOOP,
            [('"run": context.get_experiment_name()', '"run": "part2"')],
        ),
    },
    4: {
        "one series for the whole cluster: no by (instance)": (
            QUERIES,
            [('"avg by (instance) (ray_node_cpu_utilization)"', '"avg(ray_node_cpu_utilization)"')],
        ),
        "the object store in bytes, not MiB": (
            QUERIES,
            [("(ray_object_store_used_memory) / 2^20", "(ray_object_store_used_memory)")],
        ),
        "every run's workers: no matcher on the run": (
            QUERIES,
            [('ray_lab01_train_samples_total{{run="{run}"}}', "ray_lab01_train_samples_total")],
        ),
        "the notebook's window hard-coded": (
            QUERIES,
            [('{{run="{run}"}}[{window}]', '{{run="{run}"}}[4s]')],
        ),
        "the increase over the window instead of the rate": (
            QUERIES,
            [("sum by (rank) (rate(", "sum by (rank) (increase(")],
        ),
        "a rank's workers averaged instead of summed": (
            QUERIES,
            [("sum by (rank) (rate(", "avg by (rank) (rate(")],
        ),
        "report time grouped by the counter's label, which Ray Train's series lack": (
            QUERIES,
            [("sum by (ray_train_worker_world_rank) (rate(", "sum by (rank) (rate(")],
        ),
    },
    5: {
        "no DDP wrapper: each rank trains alone": (
            DDP,
            [
                ("        model = DDP(model)\n", "        pass\n"),
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
        "every epoch's seconds reported as the last epoch's": (
            DDP,
            [("        train_s += last_epoch_s\n", "        train_s += last_epoch_s\n        last_epoch_s = train_s\n")],
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
