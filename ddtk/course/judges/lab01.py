"""Lab 01 (Ray Train): the judged exercises 1 to 6.

Each check calls the learner's code on inputs seeded with the judge's secret, in a
worker process (see :mod:`ddtk.course.judging`), and computes what a correct answer
gives with the judge's own code. What each check carries forward that only a working
answer can:

1. **start a local cluster**: ``ray.cluster_utils.Cluster`` is replaced, for the call,
   by a stand-in that records every node the function asks for (no Ray process
   starts: a real three-node cluster costs 30 to 60 s on two cores, more than the
   whole judge may take). With seeded node and CPU counts, the judge checks from that
   record the number of nodes, each node's CPUs, the head's dashboard on a port that
   ``free_port()`` really handed out, the metrics interval, that every node was waited
   for, that the driver did not connect, and that the function returned the cluster
   it started. The notebook's own check starts the real cluster.
2. **complete the RayCluster**: several seeded sizes on seeded variants of the
   template (other names, images, head sizes, an extra label and environment variable),
   so neither the numbers nor the rest of the manifest can be hard-coded; each result
   is validated against KubeRay's CRD schema, compared field by field with the judge's
   expectation, and the template passed in must come back untouched.
3. **the training loop**: the learner's ``train_loop_per_worker`` runs on two real
   ranks (``ddtk.launch``, gloo) under a stand-in of Ray Train's worker API
   (``ray.train.get_context``, ``get_dataset_shard``, ``report``, ``Checkpoint``,
   ``ray.train.torch.prepare_model`` and ``get_device``), with seeded data shards that
   differ between the ranks, a seeded learning rate and batch size, and rank 1's
   validation labels planted so that a rank's own accuracy differs from the global one.
   The probe, not the learner, counts the gradient all-reduces DDP really ran and reads
   each rank's final parameters: they must be bitwise equal on both ranks and match
   the judge's own two-rank data-parallel SGD; each report's loss, accuracy (global),
   samples and ids, rank 0's checkpoint of every epoch (the unwrapped model's weights
   at that epoch) and the TensorBoard scalars are compared with the judge's reference.
   A stand-in of ``ray.util.metrics`` records what the loop exports: a Counter
   ``lab01_train_samples`` tagged with the run's seeded name and the rank must add up
   to every sample the rank trained on, one ``inc`` per step at least.
   Ray Train itself does not run here (a real ``TorchTrainer`` costs about 35 s):
   the notebook's own check runs it, and reads the counter back from Prometheus.
4. **PromQL queries**: the judge writes two to four nodes' and two Ray Train runs'
   series in the shape Ray exports them (per-node CPU and object store, per-worker
   sample counters in bursts and report-blocked seconds, a worker restarted halfway),
   imports them into a real Prometheus with ``promtool`` (:mod:`._recorded`), and
   runs the learner's ``cluster_queries(run, window)`` for seeded run names and
   windows at seeded instants next to its own queries: the series (label sets) and
   every value must be the same. A missing run matcher, ``by`` clause or unit
   conversion, another window, ``increase`` for ``rate`` or ``avg`` for ``sum`` each
   give other numbers.
5. **plain DDP**: ``ddtk.launch(ddp_train, world_size=2, backend="gloo")`` as the lab
   does, with ``digits_split`` serving a seeded subset of digits and a seeded
   learning rate, batch size and epoch count. The probe counts DDP's gradient
   all-reduces and reads each rank's final parameters (the learner's reported
   checksum is compared with the one the judge computes from them); samples per rank,
   the accuracy on the whole validation split and the parameters are compared with
   the judge's own two-rank data-parallel SGD on every ``world_size``-th sample; the
   last epoch's seconds must be positive and below all epochs' (the epoch count is 3).
6. **scaling table**: seeded measurements (worker counts in shuffled order, extra
   fields) and the two missing-baseline cases that must raise ``ValueError``; the
   judge computes every cell.

Exercise 7 (the interpretation) is free text that only a reader can judge: it is not
judged here; the notebook's check only looks for blanks left, and the instructor reads
it in the hand-in report.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ddtk.course.checks import CheckFailed, expect
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
_TRAINING = ("ddtk.examples", "ddtk.parallel", "ddtk.frameworks", "ddtk.recovery",
             "ddtk.profiling", "ddtk.bench")  # fmt: skip
_DATA = tuple(f"ddtk.examples.{m}.{n}" for m in ("ray_digits", "digits_data")
              for n in ("digits_split", "scale_pixels"))  # fmt: skip


def _plain(value: Any, depth: int = 12) -> Any:
    """``value`` as plain data (numbers, strings, lists, dicts) for the way back to the judge:
    numpy and one-element torch scalars become numbers, anything else its type's name."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if type(value).__module__ in ("numpy", "torch") and hasattr(value, "item"):
        try:
            return value.item()
        except (ValueError, RuntimeError):  # more than one element
            pass
    if depth > 0 and isinstance(value, Mapping):
        return {str(k): _plain(v, depth - 1) for k, v in value.items()}
    if depth > 0 and isinstance(value, list | tuple):
        return [_plain(v, depth - 1) for v in value]
    return f"<{type(value).__name__}>"


def _close(got: Any, want: float, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    """``got`` is a number within ``rel`` (relative) or ``abs_`` of ``want`` (NaN equals NaN)."""
    if isinstance(got, bool) or not isinstance(got, int | float):
        return False
    if math.isnan(want):
        return math.isnan(got)
    return math.isclose(got, want, rel_tol=rel, abs_tol=abs_)


# ------------------------------------------------------------------ exercise 1


class _Recorder:
    """The calls the function under test made on its cluster, in order, as plain data."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.clusters: list[Any] = []


def _stand_in_cluster(rec: _Recorder) -> type:
    """A class with ``ray.cluster_utils.Cluster``'s interface that starts nothing and
    records what it was asked for (the node arguments are kept as data)."""

    class _Node:
        def __init__(self, index: int, head: bool) -> None:
            self.index, self.head = index, head
            self.node_id = f"{index:02d}" * 28

        def __repr__(self) -> str:
            return f"<node {self.index}{' (head)' if self.head else ''}>"

    class Cluster:
        """Stand-in for ``ray.cluster_utils.Cluster`` (records, starts nothing)."""

        def __init__(self, initialize_head: bool = False, connect: bool = False,
                     head_node_args: dict | None = None, shutdown_at_exit: bool = True) -> None:  # fmt: skip
            rec.clusters.append(self)
            rec.events.append({"call": "Cluster", "initialize_head": bool(initialize_head),
                               "connect": bool(connect)})  # fmt: skip
            self.head_node: Any = None
            self.worker_nodes: set = set()
            self.connected = False
            if not initialize_head and connect:
                raise RuntimeError("Cannot connect to uninitialized cluster.")
            if initialize_head:
                self.add_node(**(head_node_args or {}))
                if connect:
                    self.connect()

        @property
        def address(self) -> str | None:
            return None if self.head_node is None else "127.0.0.1:6379"

        gcs_address = address

        def add_node(self, wait: bool = True, **node_args: Any) -> Any:
            node = _Node(
                len(self.worker_nodes) + (self.head_node is not None), self.head_node is None
            )
            rec.events.append({"call": "add_node", "wait": bool(wait), "head": node.head,
                               "args": _plain(node_args)})  # fmt: skip
            if self.head_node is None:
                self.head_node = node
            else:
                self.worker_nodes.add(node)
            return node

        def wait_for_nodes(self, timeout: float = 30) -> None:
            rec.events.append({"call": "wait_for_nodes"})

        def list_all_nodes(self) -> list:
            return ([self.head_node] if self.head_node else []) + sorted(
                self.worker_nodes, key=lambda n: n.index
            )

        def connect(self, namespace: str | None = None) -> None:
            rec.events.append({"call": "connect"})
            self.connected = True

        def remove_node(self, node: Any, allow_graceful: bool = True) -> None:
            rec.events.append({"call": "remove_node"})
            self.worker_nodes.discard(node)

        def shutdown(self) -> None:
            rec.events.append({"call": "shutdown"})

    return Cluster


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_cluster(ns: dict[str, Any], cases: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """``start_local_cluster(nodes, cpus)`` for each case, against a recording stand-in of
    ``Cluster`` (and of ``free_port`` and ``ray.init``): what it asked for, as data."""
    out = []
    for num_nodes, cpus in cases:
        rec, ports = _Recorder(), []

        def free_port(ports: list[int] = ports) -> int:
            port = _free_port()
            ports.append(port)
            return port

        def ray_init(*_a: Any, _rec: _Recorder = rec, **_k: Any) -> None:
            _rec.events.append({"call": "ray.init"})

        stand_in = _stand_in_cluster(rec)
        patched = [(ns, "Cluster", stand_in), (ns, "free_port", free_port)]
        for module, name, value in (("ray.cluster_utils", "Cluster", stand_in),
                                    ("ray", "init", ray_init)):  # fmt: skip
            if module in sys.modules:
                patched.append((vars(sys.modules[module]), name, value))
        saved = [(where, name, where.get(name, _MISSING)) for where, name, _ in patched]
        for where, name, value in patched:
            where[name] = value
        try:
            returned = ns["start_local_cluster"](num_nodes, cpus)
        finally:
            for where, name, old in saved:
                if old is _MISSING:
                    where.pop(name, None)
                else:
                    where[name] = old
        clusters = rec.clusters
        out.append({
            "events": rec.events, "ports": ports, "clusters": len(clusters),
            "returned": "cluster" if clusters and returned is clusters[-1]
            else type(returned).__name__,
        })  # fmt: skip
    return out


_MISSING = object()


@functools.lru_cache(maxsize=1)
def _ray_node_arguments() -> frozenset[str]:
    """The keyword arguments a Ray node accepts (``RayParams``), for catching typos."""
    import inspect

    from ray._private.parameter import RayParams

    return frozenset(inspect.signature(RayParams).parameters)


def _cluster_problems(record: dict[str, Any], num_nodes: int, cpus: int) -> list[str]:
    """What is wrong with what ``start_local_cluster(num_nodes, cpus)`` asked for."""
    call = f"start_local_cluster({num_nodes}, {cpus})"
    events = record["events"]
    if record["clusters"] != 1:
        return [f"{call} created {record['clusters']} Cluster objects: expected one"]
    problems = []
    if record["returned"] != "cluster":
        problems.append(f"{call} returned {record['returned']}, not the Cluster it started")
    nodes = [e for e in events if e["call"] == "add_node"]
    if not nodes or not nodes[0]["head"]:
        return [*problems, f"{call} started no head node"]
    if len(nodes) != num_nodes:
        problems.append(
            f"{call} started {len(nodes)} node(s): expected {num_nodes} "
            f"(the head and {num_nodes - 1} worker node(s))"
        )
    per_node = [n["args"].get("num_cpus", 1) for n in nodes]
    if per_node != [cpus] * len(nodes):
        problems.append(
            f"{call}: the CPUs each node advertises (num_cpus, head first) are {per_node}, "
            f"expected {cpus} on every node"
        )
    try:
        known = _ray_node_arguments()
    except Exception:  # pragma: no cover - Ray's internals moved: skip the typo check
        known = frozenset()
    unknown = sorted({k for n in nodes for k in n["args"] if known and k not in known})
    if unknown:
        problems.append(f"{call}: node arguments Ray does not know: {unknown}")
    head = nodes[0]["args"]
    if head.get("include_dashboard") is not True:
        problems.append(
            f"{call}: the head's include_dashboard is {head.get('include_dashboard')!r}, expected True"
        )
    if head.get("dashboard_port") not in record["ports"]:
        problems.append(
            f"{call}: the head's dashboard_port is {head.get('dashboard_port')!r}, expected a "
            "port from free_port() (a fixed port clashes with another Ray on the machine)"
        )
    system = head.get("_system_config")
    interval = system.get("metrics_report_interval_ms") if isinstance(system, dict) else None
    if interval != 1000:
        problems.append(
            f"{call}: the head's _system_config metrics_report_interval_ms is {interval!r}, "
            "expected 1000 (metrics every second, not every ten)"
        )
    last_add = max(i for i, e in enumerate(events) if e["call"] == "add_node")
    waited = any(e["call"] == "wait_for_nodes" for e in events[last_add:]) or all(
        n["wait"] for n in nodes
    )
    if not waited:
        problems.append(
            f"{call} returned before every node had registered (add_node(wait=False) and no "
            "wait_for_nodes() after the last node)"
        )
    if any(e["call"] in ("connect", "ray.init") for e in events):
        problems.append(
            f"{call} connected the driver (connect=True or ray.init): expected connect=False"
        )
    if any(e["call"] in ("shutdown", "remove_node") for e in events):
        problems.append(f"{call} shut the cluster (or a node) down before returning it")
    return problems


def check_cluster(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = [(rng.randint(2, 5), rng.choice([1, 3, 4, 5, 6, 8])), (1, rng.choice([3, 4, 6]))]
    got = ctx.worker().probe(f"{_P}:probe_cluster", cases=cases)
    for (num_nodes, cpus), record in zip(cases, got):
        problems = _cluster_problems(record, num_nodes, cpus)
        if problems:
            raise CheckFailed(
                "; ".join(problems)
                + " (seen by the grader's stand-in for ray.cluster_utils.Cluster, which records "
                "what your function asks for and starts nothing)"
            )


# ------------------------------------------------------------------ exercise 2

RAYCLUSTER_TEMPLATE = {
    "apiVersion": "ray.io/v1",
    "kind": "RayCluster",
    "metadata": {"name": "lab01"},
    "spec": {
        "rayVersion": "2.60.0",
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray:2.60.0-py311",
                "resources": {"limits": {"cpu": "1", "memory": "4Gi"},
                              "requests": {"cpu": "1", "memory": "4Gi"}},
            }]}},
        },
        "workerGroupSpecs": [{
            "groupName": "TODO",
            "rayStartParams": {},
            "template": {"spec": {"containers": [{
                "name": "ray-worker", "image": "rayproject/ray:2.60.0-py311", "resources": {},
            }]}},
        }],
    },
}  # fmt: skip


def raycluster_template(rng: random.Random) -> dict[str, Any]:
    """The lab's template with seeded names, versions, head size, a label and an env var."""
    t = copy.deepcopy(RAYCLUSTER_TEMPLATE)
    version = rng.choice(["2.60.0", "2.49.1", "2.44.1"])
    python = rng.choice(["py310", "py311", "py312"])
    t["metadata"]["name"] = f"lab01-{rng.randrange(16**6):06x}"
    t["metadata"]["labels"] = {"team": rng.choice(["ml-platform", "vision", "research"])}
    t["spec"]["rayVersion"] = version
    head = t["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["image"] = f"rayproject/ray:{version}-{python}"
    size = {"cpu": str(rng.randint(1, 4)), "memory": f"{rng.randint(2, 16)}Gi"}
    head["resources"] = {"limits": dict(size), "requests": dict(size)}
    worker = t["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["image"] = f"rayproject/ray:{version}-{python}"
    worker["env"] = [
        {"name": "RAY_GRAFANA_HOST", "value": f"http://grafana-{rng.randint(1, 9)}:3000"}
    ]
    return t


def probe_raycluster(ns: dict[str, Any], cases: list[tuple[dict, int, int, str]]) -> list[dict]:
    """``complete_raycluster`` on each case; the manifest and the template afterwards."""
    out = []
    for template, workers, cpus, memory in cases:
        manifest = ns["complete_raycluster"](template, workers=workers, cpus=cpus, memory=memory)
        out.append({"manifest": _plain(manifest), "template": _plain(template)})
    return out


_OWNED_WORKER_FIELDS = ("groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams")


def _without_owned(manifest: Any) -> Any:
    """``manifest`` without the fields the exercise fills in: what must stay the template's."""
    m = copy.deepcopy(manifest)
    try:
        m["spec"]["headGroupSpec"].pop("rayStartParams", None)
        for group in m["spec"]["workerGroupSpecs"]:
            for key in _OWNED_WORKER_FIELDS:
                group.pop(key, None)
            for container in group["template"]["spec"]["containers"]:
                container.pop("resources", None)
    except (KeyError, TypeError, AttributeError):
        return m
    return m


def _raycluster_problems(
    got: Any, template: dict, workers: int, cpus: int, memory: str
) -> list[str]:
    """What is wrong with ``complete_raycluster(template, workers, cpus, memory)``'s answer."""
    from ddtk.manifests import validate

    if not isinstance(got, dict):
        return [f"it returned {type(got).__name__}, not a manifest dict"]
    errors = validate(got)
    if errors:
        return [f"the manifest fails KubeRay's CRD schema: {errors[:3]}"]
    problems = []
    if _without_owned(got) != _without_owned(template):
        problems.append(
            "the rest of the template changed (name, images, head resources, labels, env): "
            "expected a copy of the template passed in, with only the exercise's fields filled"
        )
    head = got["spec"]["headGroupSpec"].get("rayStartParams", {})
    want_head = {"num-cpus": "0", "dashboard-host": "0.0.0.0"}
    seen_head = {k: head.get(k) for k in want_head}
    if seen_head != want_head:
        problems.append(f"head rayStartParams: expected {want_head}, got {seen_head}")
    groups = got["spec"]["workerGroupSpecs"]
    if len(groups) != 1:
        return [*problems, f"expected one worker group, got {len(groups)}"]
    g = groups[0]
    seen = {k: g.get(k) for k in ("groupName", "replicas", "minReplicas", "maxReplicas")}
    want = {"groupName": "cpu-workers", "replicas": workers, "minReplicas": workers,
            "maxReplicas": 2 * workers}  # fmt: skip
    if seen != want:
        problems.append(f"worker group fields: expected {want}, got {seen}")
    if g.get("rayStartParams", {}).get("num-cpus") != str(cpus):
        problems.append(
            f"worker rayStartParams num-cpus: expected {str(cpus)!r}, "
            f"got {g.get('rayStartParams', {}).get('num-cpus')!r}"
        )
    resources = g["template"]["spec"]["containers"][0].get("resources", {})
    amount = {"cpu": str(cpus), "memory": memory}
    seen_res = {
        k: {r: (resources.get(k) or {}).get(r) for r in amount} for k in ("requests", "limits")
    }
    if seen_res != {"requests": amount, "limits": amount}:
        problems.append(
            f"worker container resources: expected requests and limits {amount}, got {seen_res}"
        )
    return problems


def check_raycluster(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = []
    for _ in range(3):
        workers = rng.randint(1, 9)
        cpus = rng.choice([c for c in range(1, 17) if c != 4])
        memory = rng.choice([f"{rng.randint(1, 64)}Gi", f"{512 * rng.randint(1, 12)}Mi"])
        cases.append((raycluster_template(rng), workers, cpus, memory))
    got = ctx.worker().probe(f"{_P}:probe_raycluster", cases=cases)
    for (template, workers, cpus, memory), answer in zip(cases, got):
        call = f"complete_raycluster(<a template with name {template['metadata']['name']}>, workers={workers}, cpus={cpus}, memory={memory!r})"
        if answer["template"] != template:
            raise CheckFailed(
                f"{call} changed the template passed in: expected a new dict (copy it first)"
            )
        problems = _raycluster_problems(answer["manifest"], template, workers, cpus, memory)
        if problems:
            raise CheckFailed(f"{call}: " + "; ".join(problems))


# ------------------------------------------------------------------ the data of exercises 3 and 5


@functools.lru_cache(maxsize=1)
def _digits() -> dict[str, tuple[Any, Any]]:
    """The lab's digits split (scaled to [-1, 1]) as numpy arrays."""
    from ddtk.examples.digits_data import digits_split, scale_pixels

    out = {}
    for name, (x, y) in digits_split().items():
        scaled = scale_pixels({"image": x, "label": y})
        out[name] = (scaled["image"], scaled["label"])
    return out


def _reference_ddp(shards: list[tuple[Any, Any]], epochs: int, batch_size: int, lr: float,
                   evaluate: Callable[[Any], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """What DDP over ``len(shards)`` ranks computes, in this process: ``SmallCNN`` seeded 0,
    SGD with momentum 0.9, each rank's batches in order, gradients averaged over ranks.

    Returns the final parameters, each rank's mean loss per epoch, the parameters after
    each epoch and, with ``evaluate``, its value on the model after each epoch.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: one thread is faster, and fair to a busy machine
    try:
        return _reference_run(shards, epochs, batch_size, lr, evaluate)
    finally:
        torch.set_num_threads(threads)


def _reference_run(shards: list[tuple[Any, Any]], epochs: int, batch_size: int, lr: float,
                   evaluate: Callable[[Any], Any] | None) -> dict[str, Any]:  # fmt: skip
    """The body of :func:`_reference_ddp`: each step, every rank's gradient on its own
    batch, averaged (what DDP's all-reduce leaves on every rank), then one SGD step."""
    import torch

    from ddtk.models import SmallCNN

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    data = [(torch.as_tensor(x), torch.as_tensor(y)) for x, y in shards]
    losses, batch_losses, states, evals = [], [], [], []
    steps = max(math.ceil(len(y) / batch_size) for _, y in data)
    for _ in range(epochs):
        sums, batch_sums = [0.0] * len(data), [0.0] * len(data)
        for step in range(steps):
            grads = []
            for r, (x, y) in enumerate(data):
                xb, yb = x[step * batch_size :][:batch_size], y[step * batch_size :][:batch_size]
                model.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                sums[r] += loss.item() * len(yb)
                batch_sums[r] += loss.item() / steps
                grads.append([p.grad.clone() for p in model.parameters()])
            for i, p in enumerate(model.parameters()):
                p.grad = sum(g[i] for g in grads) / len(grads)
            optimizer.step()
        losses.append([s / len(y) for s, (_, y) in zip(sums, data)])
        batch_losses.append(batch_sums)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        if evaluate is not None:
            with torch.no_grad():
                evals.append(evaluate(model))
    return {"params": states[-1], "losses": losses, "batch_losses": batch_losses,
            "states": states, "evals": evals}  # fmt: skip


def _accuracy(model: Any, x: Any, y: Any) -> float:
    import torch

    predicted = model(torch.as_tensor(x)).argmax(1)
    return float((predicted == torch.as_tensor(y)).sum().item() / len(y))


def _param_gap(want: Mapping[str, Any], got: Any) -> str | None:
    """None when ``got`` holds ``want``'s tensors (to float tolerance), else what differs."""
    import torch

    if not isinstance(got, Mapping) or not got:
        return "no parameters"
    if sorted(got) != sorted(want):
        return f"other parameter names {sorted(got)[:3]}... (expected {sorted(want)[:3]}...)"
    worst = 0.0
    for k, w in want.items():
        g = got[k]
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            return f"{k} has another shape"
        worst = max(worst, float((g.double() - w.double()).abs().max()))
    return None if worst <= 2e-4 else f"they differ by up to {worst:.3g}"


def _bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    return (
        isinstance(a, Mapping) and isinstance(b, Mapping) and sorted(a) == sorted(b)
        and all(isinstance(a[k], torch.Tensor) and isinstance(b[k], torch.Tensor)
                and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)
    )  # fmt: skip


# ------------------------------------------------------------------ in a rank: what the probes observe


class _Observer:
    """What the probe sees in one rank: the models built, the DDP gradient all-reduces that
    ran, and the learner's own ``torch.distributed.all_reduce`` calls."""

    def __init__(self) -> None:
        self.models: list[Any] = []
        self.prepared: list[Any] = []
        self.grad_reductions = 0
        self.all_reduces = 0

    def install(self) -> None:
        """Patch, in this rank only: SmallCNN records its instances, every DDP counts
        the buckets its reducer all-reduces (a comm hook), all_reduce counts its calls."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from ddtk.models import SmallCNN

        observer = self
        build, wrap, reduce = SmallCNN.__init__, DistributedDataParallel.__init__, dist.all_reduce

        def built(model: Any, *a: Any, **k: Any) -> None:
            build(model, *a, **k)
            observer.models.append(model)

        def counting(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations
            # DDP's own averaging all-reduce (default_hooks.allreduce_hook), through the
            # unpatched all_reduce, so that the learner's calls are counted apart
            observer.grad_reductions += 1
            tensor = bucket.buffer().div_(dist.get_world_size())
            return reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

        def wrapped(ddp: Any, *a: Any, **k: Any) -> None:
            wrap(ddp, *a, **k)
            ddp.register_comm_hook(None, counting)

        def all_reduce(*a: Any, **k: Any) -> Any:
            observer.all_reduces += 1
            return reduce(*a, **k)

        SmallCNN.__init__ = built
        DistributedDataParallel.__init__ = wrapped
        dist.all_reduce = all_reduce

    def final_params(self) -> dict[str, Any] | None:
        """The trained model's parameters (unwrapped): the prepared one, else the last built."""
        found = self.prepared or self.models
        if not found:
            return None
        model = getattr(found[-1], "module", found[-1])
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _rank_failure(exc: Exception) -> RuntimeError:
    """A rank's failure in a few lines (its traceback's end), keeping a stub's message."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return RuntimeError("; ".join(lines[-3:]) if lines else str(exc))


# ------------------------------------------------------------------ exercise 3: Ray Train's worker API, stood in for


class _StandInModule(types.ModuleType):
    """A module of the stand-in Ray API: a name it lacks says what the stand-in has."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"the grader runs your loop under a stand-in of Ray Train's worker API, which has "
            f"no {self.__name__}.{name}; it has ray.train.get_context, get_dataset_shard, report, "
            "get_checkpoint, Checkpoint, ray.train.torch.prepare_model and get_device, "
            "ray.get_runtime_context, and ray.util.metrics's Counter, Gauge and Histogram"
        )


class MetricsLog:
    """What a loop did with ``ray.util.metrics`` in one rank: the metrics it created and
    every value it recorded, kept as data by the stand-in classes of :func:`metrics_module`."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []

    def totals(self) -> list[dict[str, Any]]:
        """One entry per (kind, name, tags): how many values were recorded and their sum."""
        out: dict[tuple, dict[str, Any]] = {}
        for r in self.records:
            key = (r["kind"], r["name"], tuple(sorted(r["tags"].items())))
            entry = out.setdefault(key, {"kind": r["kind"], "name": r["name"],
                                         "tags": r["tags"], "calls": 0, "sum": 0.0})  # fmt: skip
            entry["calls"] += 1
            entry["sum"] += r["value"]
        return list(out.values())


def metrics_module(log: MetricsLog) -> types.ModuleType:
    """A stand-in of ``ray.util.metrics`` that records into ``log``, with Ray 2.60's own
    checks (tag keys a tuple of str, tag values str, every tag key given, values int or
    float, ``inc`` > 0, a histogram's boundaries positive), so that what runs under it
    runs under Ray, and the other way round."""
    module = _StandInModule("ray.util.metrics")

    class Metric:
        kind = "metric"

        def __init__(self, name: str, description: str = "",
                     tag_keys: tuple[str, ...] | None = None) -> None:  # fmt: skip
            if not name:
                raise ValueError("Empty name is not allowed. Please provide a metric name.")
            keys = tag_keys or ()
            if not isinstance(keys, tuple):
                raise TypeError(f"tag_keys should be a tuple type, got: {type(keys)}")
            if not all(isinstance(k, str) for k in keys):
                raise TypeError(f"Tag keys must be str, got {[type(k) for k in keys]}.")
            self._name, self._keys, self._defaults = str(name), keys, {}
            log.created.append({"kind": self.kind, "name": self._name, "tag_keys": list(keys)})

        def set_default_tags(self, default_tags: dict[str, str]) -> Metric:
            for key, value in default_tags.items():
                if key not in self._keys:
                    raise ValueError(f"Unrecognized tag key {key}.")
                if not isinstance(value, str):
                    raise TypeError(f"Tag values must be str, got {type(value)}.")
            self._defaults = dict(default_tags)
            return self

        def _record(self, value: float, tags: dict[str, str] | None) -> None:
            for v in (tags or {}).values():
                if not isinstance(v, str):
                    raise TypeError(f"Tag values must be str, got {type(v)}.")
            final = {**self._defaults, **(tags or {})}
            missing = [k for k in self._keys if k not in final]
            if missing:
                raise ValueError(f"Missing value for tag key(s): {','.join(missing)}.")
            log.records.append({"kind": self.kind, "name": self._name,
                                "tags": {str(k): v for k, v in final.items()}, "value": float(value)})  # fmt: skip

    def _number(value: Any) -> float:
        if not isinstance(value, int | float):  # as Ray: a bool is an int
            raise TypeError(f"value must be int or float, got {type(value)}.")
        return float(value)

    class Counter(Metric):
        kind = "counter"

        def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
            if _number(value) <= 0:
                raise ValueError(f"value must be >0, got {value}")
            self._record(value, tags)

    class Gauge(Metric):
        kind = "gauge"

        def set(self, value: float | None, tags: dict[str, str] | None = None) -> None:
            if value is not None:  # Ray ignores a None
                self._record(_number(value), tags)

    class Histogram(Metric):
        kind = "histogram"

        def __init__(self, name: str, description: str = "", boundaries: Any = None,
                     tag_keys: tuple[str, ...] | None = None) -> None:  # fmt: skip
            super().__init__(name, description, tag_keys)
            if not boundaries:
                raise ValueError("boundaries argument should be provided when using the "
                                 'Histogram class. e.g., Histogram("name", boundaries=[1.0, 2.0])')  # fmt: skip
            for i, boundary in enumerate(boundaries):
                if boundary <= 0:
                    raise ValueError(f"Invalid `boundaries` argument at index {i}, {boundaries}. "
                                     "Use positive values for the arguments.")  # fmt: skip

        def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
            self._record(_number(value), tags)

    module.Counter, module.Gauge, module.Histogram = Counter, Gauge, Histogram
    return module


class _Shard:
    """Stand-in for the ``DataIterator`` of ``ray.train.get_dataset_shard``: rows in order."""

    def __init__(self, image: Any, label: Any) -> None:
        self.image, self.label = image, label

    def _batches(self, batch_size: int | None, drop_last: bool) -> Any:
        n = len(self.label)
        size = n if batch_size is None else int(batch_size)
        for i in range(0, n, size):
            if drop_last and i + size > n:
                break
            yield {"image": self.image[i : i + size], "label": self.label[i : i + size]}

    def iter_batches(
        self, *, batch_size: int | None = 256, drop_last: bool = False, **_: Any
    ) -> Any:
        yield from self._batches(batch_size, drop_last)

    def iter_torch_batches(self, *, batch_size: int | None = 256, dtypes: Any = None,
                           device: Any = "auto", collate_fn: Any = None, drop_last: bool = False,
                           **_: Any) -> Any:  # fmt: skip
        import torch

        for batch in self._batches(batch_size, drop_last):
            if collate_fn is not None:
                yield collate_fn(batch)
                continue
            out = {k: torch.as_tensor(v) for k, v in batch.items()}
            if isinstance(dtypes, Mapping):
                out = {k: v.to(dtypes.get(k, v.dtype)) for k, v in out.items()}
            elif dtypes is not None:
                out = {k: v.to(dtypes) for k, v in out.items()}
            yield out


def _install_ray_stand_in(rank: int, world: int, node_id: str, shards: dict[str, _Shard],
                          storage: str, observer: _Observer, *, checkpoint: str | None = None,
                          read: Callable[[Any, str], dict[str, Any]] | None = None,
                          experiment: str = "lab01-judge", metrics: MetricsLog | None = None,
                          ) -> list[dict[str, Any]]:  # fmt: skip
    """Put stand-ins of ``ray``, ``ray.train`` and ``ray.train.torch`` in ``sys.modules``
    of this rank; return the list each ``ray.train.report`` appends to.

    ``checkpoint``: the directory ``ray.train.get_checkpoint()`` hands out (None: a fresh
    run); ``read(folder, name)``: what a reported checkpoint's copy holds, as data (by
    default :func:`_read_checkpoint`, lab 01's ``model.pt``); ``experiment``: the run's
    name (``get_experiment_name()``); ``metrics``: where ``ray.util.metrics`` records
    (None: the stand-in has no ``ray.util``)."""
    import shutil
    from pathlib import Path

    import torch

    reports: list[dict[str, Any]] = []

    class TrainContext:
        def get_world_rank(self) -> int:
            return rank

        def get_world_size(self) -> int:
            return world

        def get_local_rank(self) -> int:
            return rank

        def get_local_world_size(self) -> int:
            return world

        def get_node_rank(self) -> int:
            return 0

        def get_experiment_name(self) -> str:
            return experiment

    class Checkpoint:
        def __init__(self, path: str) -> None:
            self.path = str(path)

        @classmethod
        def from_directory(cls, path: Any) -> Checkpoint:
            return cls(str(path))

        def to_directory(self, path: Any = None) -> str:
            return self.path

        def as_directory(self) -> Any:
            import contextlib

            return contextlib.nullcontext(self.path)

    def report(metrics: Mapping[str, Any], checkpoint: Any = None,
               checkpoint_dir_name: str | None = None, **_: Any) -> None:  # fmt: skip
        entry: dict[str, Any] = {"metrics": _plain(dict(metrics)), "checkpoint": None}
        if checkpoint is not None:
            name = checkpoint_dir_name or f"checkpoint_{len(reports):06d}"
            target = Path(storage) / f"rank{rank}" / name
            shutil.copytree(checkpoint.path, target)
            entry["checkpoint"] = (read or _read_checkpoint)(target, name)
        reports.append(entry)

    class RuntimeContext:
        def get_node_id(self) -> str:
            return node_id

    def prepare_model(model: Any, move_to_device: Any = True, parallel_strategy: str | None = "ddp",
                      parallel_strategy_kwargs: dict | None = None, **_: Any) -> Any:  # fmt: skip
        from torch.nn.parallel import DistributedDataParallel

        observer.prepared.append(model)
        if world > 1 and parallel_strategy:
            return DistributedDataParallel(model, **(parallel_strategy_kwargs or {}))
        return model

    ray = _StandInModule("ray")
    train = _StandInModule("ray.train")
    train_torch = _StandInModule("ray.train.torch")
    ray.__path__ = []  # a package, so `import ray.train` finds its submodule
    train.__path__ = []
    ray.train, train.torch = train, train_torch
    ray.get_runtime_context = RuntimeContext
    ray.is_initialized = lambda: True
    train.get_context = TrainContext
    train.get_dataset_shard = lambda name: shards[name]
    train.report = report
    train.get_checkpoint = lambda: None if checkpoint is None else Checkpoint(checkpoint)
    train.Checkpoint = Checkpoint
    train_torch.prepare_model = prepare_model
    train_torch.get_device = lambda: torch.device("cpu")
    train_torch.get_devices = lambda: [torch.device("cpu")]
    sys.modules.update({"ray": ray, "ray.train": train, "ray.train.torch": train_torch})
    if metrics is not None:
        util = _StandInModule("ray.util")
        util.__path__ = []
        ray.util, util.metrics = util, metrics_module(metrics)
        sys.modules.update({"ray.util": util, "ray.util.metrics": util.metrics})
    return reports


def _read_checkpoint(folder: Any, name: str) -> dict[str, Any]:
    """A reported checkpoint directory's files and its ``model.pt``, as data."""
    import torch

    files = sorted(p.name for p in folder.iterdir())
    out: dict[str, Any] = {"dir": name, "files": files}
    if "model.pt" not in files:
        return out
    try:
        state = torch.load(folder / "model.pt", weights_only=True)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return out
    if not isinstance(state, Mapping):
        out["error"] = f"model.pt holds a {type(state).__name__}, not a dict"
        return out
    out["keys"] = sorted(str(k) for k in state)
    model = state.get("model")
    if isinstance(model, Mapping):
        out["model"] = {str(k): v for k, v in model.items() if isinstance(v, torch.Tensor)}
    out["epoch"] = _plain(state.get("epoch"))
    out["optimizer"] = isinstance(state.get("optimizer"), Mapping)
    return out


def _train_rank(ctx: Any, loop: bytes, data: dict[str, list], config: dict[str, Any],
                storage: str, node_ids: list[str]) -> dict[str, Any]:  # fmt: skip
    """One rank of the exercise-3 probe: stand-ins installed, then the learner's loop."""
    import cloudpickle

    observer, metrics = _Observer(), MetricsLog()
    observer.install()
    shards = {name: _Shard(*parts[ctx.rank]) for name, parts in data.items()}
    reports = _install_ray_stand_in(ctx.rank, ctx.world_size, node_ids[ctx.rank], shards, storage,
                                    observer, experiment=run_name(node_ids), metrics=metrics)  # fmt: skip
    cloudpickle.loads(loop)(dict(config))
    return {"reports": reports, "params": observer.final_params(),
            "prepared": len(observer.prepared), "grad_reductions": observer.grad_reductions,
            "all_reduces": observer.all_reduces, "metrics_created": metrics.created,
            "metrics": metrics.totals()}  # fmt: skip


def run_name(node_ids: list[str]) -> str:
    """The seeded name of the judge's run (``get_experiment_name()``), never the lab's."""
    return f"judge-{node_ids[0][:6]}"


def probe_loop(ns: dict[str, Any], data: dict[str, list], config: dict[str, Any],
               node_ids: list[str]) -> dict[str, Any]:  # fmt: skip
    """``train_loop_per_worker(config)`` on two gloo ranks under the stand-in of Ray Train's
    worker API, with the judge's shards; what each rank reported and ended with."""
    import shutil
    import tempfile
    from pathlib import Path

    import cloudpickle

    import ddtk

    folder = Path(tempfile.mkdtemp(prefix="lab01-loop-"))
    try:
        config = {**config, "tensorboard_dir": str(folder / "tensorboard")}
        loop = cloudpickle.dumps(ns["train_loop_per_worker"])
        try:
            ranks = ddtk.launch(_train_rank, world_size=2, backend="gloo", timeout=120, echo=False,
                                args=(loop, data, config, str(folder / "storage"), node_ids))  # fmt: skip
        except ddtk.RankError as exc:
            raise _rank_failure(exc) from None
        scalars: Any = None
        if (folder / "tensorboard").exists():
            from ddtk.monitoring import read_scalars

            try:
                scalars = read_scalars(folder / "tensorboard")
            except FileNotFoundError:
                scalars = None
        return {"ranks": ranks, "tensorboard": scalars}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _learning_rate(rng: Any) -> float:
    """A seeded learning rate, never within 0.01 of the notebook's 0.05."""
    lr = round(float(rng.uniform(0.02, 0.08)), 3)
    return lr + 0.02 if abs(lr - 0.05) < 0.01 else lr


def _loop_inputs(seed: int) -> tuple[dict[str, list], dict[str, Any], list[str]]:
    """Seeded shards (different on each rank; rank 1's val labels shifted by one, so its
    own accuracy is not the global one), config and node ids of the exercise-3 probe."""
    import numpy as np

    rng = np.random.default_rng(seed)
    (tx, ty), (vx, vy) = _digits()["train"], _digits()["val"]
    n_train, n_val = int(rng.integers(56, 97)), int(rng.integers(24, 41))
    train_idx = rng.permutation(len(ty))[: 2 * n_train]
    val_idx = rng.permutation(len(vy))[: 2 * n_val]
    train = [(tx[train_idx[r::2]], ty[train_idx[r::2]]) for r in range(2)]
    val = [(vx[val_idx[r::2]], vy[val_idx[r::2]]) for r in range(2)]
    val[1] = (val[1][0], (val[1][1] + 1) % 10)
    config = {"epochs": 2, "batch_size": int(rng.choice([12, 16, 20, 24])),
              "lr": _learning_rate(rng), "seed": 0}  # fmt: skip
    node_ids = [f"{int(rng.integers(16**8)):08x}" + "ab" * 24 for _ in range(2)]
    return {"train": train, "val": val}, config, node_ids


def _loop_case(seed: int) -> tuple[dict[str, list], dict[str, Any], list[str], dict]:
    """Exercise 3's inputs and the grader's reference run on them. A model near chance can
    score the same on both val shards, and then a rank's own accuracy is the global one:
    such draws are replaced (seeds derived from ``seed``), so that reporting a rank's own
    accuracy fails under every seed."""
    import numpy as np

    for attempt in range(50):
        data, config, node_ids = _loop_inputs(seed + 7919 * attempt)
        vx = np.concatenate([x for x, _ in data["val"]])
        vy = np.concatenate([y for _, y in data["val"]])
        local = [data["val"][r] for r in range(2)]
        ref = _reference_ddp(data["train"], config["epochs"], config["batch_size"], config["lr"],
                             evaluate=lambda m, vx=vx, vy=vy, local=local: [
                                 _accuracy(m, vx, vy), *(_accuracy(m, x, y) for x, y in local)])  # fmt: skip
        if any(abs(own - ev[0]) > 1e-3 for ev in ref["evals"] for own in ev[1:]):
            break
    return data, config, node_ids, ref


def check_loop(ctx: Context) -> None:
    data, config, node_ids, ref = _loop_case(ctx.seed)
    got = ctx.worker().probe(f"{_P}:probe_loop", data=data, config=config, node_ids=node_ids)
    epochs, bs, lr = config["epochs"], config["batch_size"], config["lr"]
    setting = f"(2 ranks, seeded shards, batch_size {bs}, lr {lr}, {epochs} epochs)"
    ranks = got["ranks"]
    for r, rank in enumerate(ranks):
        calls = len(rank["reports"])
        expect(calls == epochs, f"ray.train.report calls on rank {r} {setting}",
               expected=f"{epochs} (one per epoch, on every worker: it is a barrier)", got=calls)  # fmt: skip
    # distribution, observed by the probe: the reports cannot stand in for it
    reductions = [rank["grad_reductions"] for rank in ranks]
    steps = epochs * math.ceil(len(data["train"][0][1]) / bs)
    expect(
        all(n >= steps for n in reductions),
        f"gradient all-reduces DDP ran on each rank, counted by the grader {setting}",
        expected=f">= {steps} (one per step at least)",
        got=f"{reductions}: the model was not wrapped in DistributedDataParallel "
        f"(ray.train.torch.prepare_model was called {[r['prepared'] for r in ranks]} times), "
        "so each rank trained alone",
    )
    expect(_bitwise_equal(ranks[0]["params"], ranks[1]["params"]),
           f"the two ranks' parameters after training on different shards {setting}",
           expected="bitwise equal (DDP keeps the replicas identical)", got="different")  # fmt: skip
    gap = _param_gap(ref["params"], ranks[0]["params"])
    expect(gap is None, f"the parameters after training {setting}",
           expected="those of the grader's data-parallel SGD (SmallCNN seeded 0, SGD with config['lr'] "
           "and momentum 0.9, config['batch_size'] per worker, batches in order)", got=gap)  # fmt: skip
    for r, rank in enumerate(ranks):
        for e, entry in enumerate(rank["reports"]):
            m = entry["metrics"]
            where = f"rank {r}'s report of epoch {e} {setting}"
            ids = {k: m.get(k) for k in ("epoch", "world_size", "rank", "node", "samples")}
            want_ids = {"epoch": e, "world_size": 2, "rank": r, "node": node_ids[r][:8],
                        "samples": len(data["train"][r][1])}  # fmt: skip
            expect(ids == want_ids, f"epoch, world_size, rank, node and samples in {where}",
                   expected=want_ids, got=ids)  # fmt: skip
            loss = m.get("loss")
            expect(_close(loss, ref["losses"][e][r], rel=1e-4)
                   or _close(loss, ref["batch_losses"][e][r], rel=1e-4),
                   f"loss (this worker's mean over its samples) in {where}",
                   expected=round(ref["losses"][e][r], 6), got=loss)  # fmt: skip
            acc, own = ref["evals"][e][0], ref["evals"][e][1 + r]
            expect(_close(m.get("accuracy"), acc, rel=1e-6),
                   f"accuracy in {where}",
                   expected=f"{acc:.6f}, the global accuracy over both ranks' val shards (this "
                   f"rank's own shard alone gives {own:.6f}: all_reduce the counts)",
                   got=f"{m.get('accuracy')} (the grader counted {ranks[r]['all_reduces']} "
                   "torch.distributed.all_reduce calls on this rank)")  # fmt: skip
            train_s = m.get("train_s")
            expect(isinstance(train_s, int | float) and train_s > 0, f"train_s in {where}",
                   expected="> 0 seconds", got=train_s)  # fmt: skip
            expect(_close(m.get("samples_per_s"), want_ids["samples"] / train_s, rel=1e-3),
                   f"samples_per_s in {where}", expected="samples / train_s",
                   got=m.get("samples_per_s"))  # fmt: skip
            ckpt = entry["checkpoint"]
            if r:
                expect(ckpt is None, f"the checkpoint in {where}",
                       expected="none (rank 0 attaches it)", got=ckpt and ckpt.get("dir"))  # fmt: skip
                continue
            _check_checkpoint(ckpt, e, ref["states"][e], where)
    _check_tensorboard(got["tensorboard"], [rep["metrics"] for rep in ranks[0]["reports"]], epochs)
    for r, rank in enumerate(ranks):
        steps = epochs * math.ceil(len(data["train"][r][1]) / bs)
        _check_samples_counter(rank, r, run_name(node_ids), epochs * len(data["train"][r][1]), steps)


SAMPLES_COUNTER = "lab01_train_samples"  # Prometheus: ray_lab01_train_samples_total


def _check_samples_counter(rank: Mapping[str, Any], r: int, run: str, samples: int, steps: int) -> None:
    """Rank ``r`` counted every sample it trained on, step by step, in the Counter
    ``lab01_train_samples`` tagged with the run's name and its rank."""
    made = [m for m in rank["metrics_created"] if m["name"] == SAMPLES_COUNTER]
    expect(made and made[0]["kind"] == "counter" and sorted(made[0]["tag_keys"]) == ["rank", "run"],
           f"the ray.util.metrics metric {SAMPLES_COUNTER!r} rank {r} created",
           expected="a Counter with tag_keys ('run', 'rank')",
           got=made or f"none (created: {[m['name'] for m in rank['metrics_created']]})")  # fmt: skip
    tags = {"run": run, "rank": str(r)}
    mine = [t for t in rank["metrics"] if t["name"] == SAMPLES_COUNTER]
    got = [(t["tags"], t["calls"], round(t["sum"], 6)) for t in mine]
    expect([(t["tags"], t["sum"]) for t in mine] == [(tags, float(samples))],
           f"what rank {r} added to {SAMPLES_COUNTER} (the grader's run is named {run!r})",
           expected=f"{samples} (every sample it trained on) under tags {tags}",
           got=f"(tags, inc calls, sum) {got}")  # fmt: skip
    expect(mine[0]["calls"] >= steps, f"inc calls on {SAMPLES_COUNTER} by rank {r}",
           expected=f">= {steps}, one per training step (Prometheus sees the count grow while "
           "the epoch runs)", got=mine[0]["calls"])  # fmt: skip


def _check_checkpoint(ckpt: Any, epoch: int, want: Mapping[str, Any], where: str) -> None:
    expect(ckpt is not None, f"the checkpoint in {where}", expected="one, from rank 0", got=None)
    name = f"epoch-{epoch:03d}"
    expect(ckpt["dir"] == name and "model.pt" in ckpt["files"],
           f"the checkpoint directory in {where}", expected=f"{name} holding model.pt",
           got=f"{ckpt['dir']} holding {ckpt['files']}")  # fmt: skip
    expect("error" not in ckpt, f"model.pt in {where}", expected="a dict saved with torch.save",
           got=ckpt.get("error"))  # fmt: skip
    expect({"model", "optimizer", "epoch"} <= set(ckpt.get("keys", ())),
           f"the keys of model.pt in {where}", expected="model, optimizer, epoch",
           got=ckpt.get("keys"))  # fmt: skip
    expect(ckpt.get("epoch") == epoch and ckpt.get("optimizer"),
           f"the epoch and optimizer state in model.pt in {where}",
           expected=f"epoch {epoch} and an optimizer state_dict",
           got=f"epoch {ckpt.get('epoch')!r}, optimizer {'present' if ckpt.get('optimizer') else 'missing'}")  # fmt: skip
    gap = _param_gap(want, ckpt.get("model"))
    expect(gap is None, f"the model weights in model.pt in {where}",
           expected="the unwrapped model's state_dict at the end of that epoch (no 'module.' prefix)",
           got=gap)  # fmt: skip


def _check_tensorboard(scalars: Any, reported: list[dict[str, Any]], epochs: int) -> None:
    expect(isinstance(scalars, dict) and scalars, "TensorBoard event files under config['tensorboard_dir']",
           expected="rank 0's train/loss and train/accuracy", got="none")  # fmt: skip
    for tag, key in (("train/loss", "loss"), ("train/accuracy", "accuracy")):
        points = scalars.get(tag, [])
        steps = [step for step, _ in points]
        expect(steps == list(range(epochs)), f"the steps of {tag} in TensorBoard",
               expected=f"{list(range(epochs))} (one per epoch, from rank 0 only)", got=steps)  # fmt: skip
        for (step, value), m in zip(points, reported):
            expect(_close(value, float(m.get(key, float("nan"))), rel=1e-5, abs_=1e-6),
                   f"{tag} at epoch {step} in TensorBoard", expected=f"rank 0's reported {key} {m.get(key)}",
                   got=value)  # fmt: skip


# ------------------------------------------------------------------ exercise 4

PANELS = ("cpu_percent", "object_store_mib", "samples_per_s", "report_blocked")
_WANT = {  # what each query's result must be, in the words of the exercise
    "cpu_percent": "each node's ray_node_cpu_utilization (percent), one series per node "
                   "labelled by instance only",
    "object_store_mib": "each node's ray_object_store_used_memory in MiB (bytes / 2^20), one "
                        "series per node labelled by instance only",
    "samples_per_s": "the per-second rate over the window passed in of "
                     "ray_lab01_train_samples_total for that run only, summed by rank",
    "report_blocked": "the per-second rate over the window passed in of "
                      "ray_train_report_total_blocked_time_s for that run only "
                      "(ray_train_run_name), summed by ray_train_worker_world_rank",
}  # fmt: skip


def reference_queries(run: str, window: str) -> dict[str, str]:
    """The judge's own PromQL for exercise 4, evaluated on the same server as the answer's."""
    return {
        "cpu_percent": "avg by (instance) (ray_node_cpu_utilization)",
        "object_store_mib": "sum by (instance) (ray_object_store_used_memory) / 2^20",
        "samples_per_s": f'sum by (rank) (rate(ray_lab01_train_samples_total{{run="{run}"}}[{window}]))',
        "report_blocked": "sum by (ray_train_worker_world_rank) (rate("
        f'ray_train_report_total_blocked_time_s{{ray_train_run_name="{run}"}}[{window}]))',
    }


@dataclass(frozen=True)
class Recorded:
    """Seeded series shaped like a Ray cluster's (OpenMetrics text, one sample per second),
    and the cases to query them at: ``(run, window, unix time)``."""

    text: str
    cases: list[tuple[str, str, float]]


def _family(lines: list[str], name: str, kind: str, series: list[tuple[dict, list]]) -> None:
    """One OpenMetrics family: its TYPE line, then each series' ``(time, value)`` samples."""
    lines.append(f"# TYPE {name} {kind}")
    sample = f"{name}_total" if kind == "counter" else name
    for labels, points in series:
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines += [f"{sample}{{{body}}} {v:.6g} {t:.1f}" for t, v in points]


def _walk(rng: random.Random, times: list[float], step: Callable[[], float], start: float = 0.0,
          low: float = 0.0, high: float = math.inf) -> list[tuple[float, float]]:  # fmt: skip
    """A seeded path: ``start`` plus ``step()`` each second, kept within ``[low, high]``."""
    value, out = start, []
    for t in times:
        value = min(high, max(low, value + step()))
        out.append((t, value))
    return out


def recorded_cluster(rng: random.Random, now: float) -> Recorded:
    """Two to four nodes and two Ray Train runs over 150 s ending a minute before ``now``:
    per-node CPU and object store, per-worker sample counters and report-blocked seconds.
    Rank 1 of the first run restarts halfway (a new worker, its counter from 0), the runs
    overlap, and the counters move in bursts: a query without the run's matcher, without
    ``sum by``, or over another window gives other numbers."""
    end = math.floor(now) - 60.5
    times = [end - 149 + i for i in range(150)]
    session = f"session_{rng.randrange(16**8):08x}"
    nodes = []
    for i in range(rng.randint(2, 4)):
        ip = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{i + 2}"
        nodes.append({"instance": f"{ip}:{rng.randint(40000, 65000)}", "ip": ip,
                      "IsHeadNode": str(i == 0).lower(), "SessionName": session, "job": "ray"})  # fmt: skip
    cpu = [(n, _walk(rng, times, lambda: rng.uniform(-15, 15), rng.uniform(5, 95), 0, 100))
           for n in nodes]  # fmt: skip
    store = [({"Component": "raylet", "NodeAddress": n["ip"], "instance": n["instance"],
               "SessionName": session, "job": "ray"},
              [(t, round(v)) for t, v in _walk(rng, times, lambda: rng.uniform(-4e6, 4e6),
                                               rng.uniform(1e6, 3e8), 0, 4e8)])
             for n in nodes]  # fmt: skip
    runs = []
    while len(runs) < 2:
        name = f"{rng.choice(['part2', 'digits', 'scale', 'resnet'])}-{rng.randrange(16**4):04x}"
        if name not in runs:
            runs.append(name)
    mid = len(times) // 2
    samples, blocked = [], []
    for k, run in enumerate(runs):
        span = times if k == 0 else times[rng.randint(10, 40):]
        for rank in range(rng.randint(2, 4)):
            node = nodes[rank % len(nodes)]
            pieces = [span[:mid], span[mid:]] if (k, rank) == (0, 1) else [span]
            for j, piece in enumerate(pieces):
                worker = f"{rng.randrange(16**12):012x}"
                labels = {"Component": "core_worker", "WorkerId": worker, "instance": node["instance"],
                          "job": "ray", "SessionName": session}  # fmt: skip
                # bursts, like epochs; a worker that is replaced was busy until it went
                cut = len(piece) - 3 if j < len(pieces) - 1 else len(piece)
                steps = iter([rng.randint(32, 900) if i >= cut else rng.choice([0, 0, 0, rng.randint(32, 900)])
                              for i in range(len(piece))])  # fmt: skip
                samples.append(({**labels, "run": run, "rank": str(rank)},
                                _walk(rng, piece, lambda steps=steps: next(steps))))  # fmt: skip
                blocked.append(({**labels, "ray_train_run_name": run,
                                 "ray_train_worker_world_rank": str(rank)},
                                _walk(rng, piece, lambda: rng.choice([0.0, rng.uniform(0, 0.9)]))))  # fmt: skip
    lines: list[str] = []
    _family(lines, "ray_node_cpu_utilization", "gauge", cpu)
    _family(lines, "ray_object_store_used_memory", "gauge", store)
    _family(lines, "ray_lab01_train_samples", "counter", samples)
    _family(lines, "ray_train_report_total_blocked_time_s", "gauge", blocked)
    lines.append("# EOF")
    w1, w2, w3 = rng.sample([6, 8, 12, 15, 20, 25, 40], 3)
    cases = [
        (runs[0], f"{w1}s", times[mid] + w1 / 2),  # the restart inside the window
        (runs[1], f"{w2}s", times[rng.randint(100, 149)]),
        (runs[0], f"{w3}s", times[rng.randint(60, 149)]),
    ]
    return Recorded("\n".join(lines) + "\n", cases)


def probe_queries(ns: dict[str, Any], cases: list[tuple[str, str]]) -> list[Any]:
    """``cluster_queries(run, window)`` for each case, as data."""
    return [_plain(ns["cluster_queries"](run, window)) for run, window in cases]


def _by_labels(samples: list[Any]) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for s in samples}


def _shown(result: dict[tuple, float]) -> str:
    """A query result in a line: ``{instance=...}: 12.5``, at most four series."""
    items = [f"{{{', '.join(f'{k}={v}' for k, v in key)}}}: {value:.6g}"
             for key, value in sorted(result.items())]  # fmt: skip
    return "; ".join(items[:4]) + (f"; ... ({len(items)} series)" if len(items) > 4 else "") or "empty"


def _query_problem(prom: Any, query: Any, want: dict[tuple, float], at: float) -> str | None:
    """None when ``query`` gives ``want`` at ``at``, else what differs."""
    from ddtk.monitoring.prometheus import PrometheusError

    if not isinstance(query, str) or not query.strip() or len(query) > 2000:
        return f"expected a PromQL string, got {str(query)[:100]!r}"
    try:
        got = _by_labels(prom.query(query, at=at))
    except (PrometheusError, OSError) as exc:
        return f"Prometheus refused it: {str(exc)[-300:]}"
    if sorted(got) != sorted(want):
        return f"its series (label sets) are {_shown(got)}; expected {_shown(want)}"
    off = [k for k in want if not _close(got[k], want[k], rel=1e-6, abs_=1e-9)]
    return f"values {_shown(got)}; expected {_shown(want)}" if off else None


def check_queries(ctx: Context) -> None:
    import time

    from ddtk.course.judges._recorded import recorded_prometheus

    recorded = recorded_cluster(random.Random(ctx.seed), time.time())
    calls = [(run, window) for run, window, _ in recorded.cases]
    answers = ctx.worker().probe(f"{_P}:probe_queries", cases=calls)
    for (run, window), answer in zip(calls, answers):
        keys = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
        expect(keys == sorted(PANELS), f"cluster_queries({run!r}, {window!r})",
               expected=f"a dict with the keys {list(PANELS)}", got=keys)  # fmt: skip
    with recorded_prometheus(recorded.text) as prom:
        for (run, window, at), answer in zip(recorded.cases, answers):
            reference = reference_queries(run, window)
            for key in PANELS:
                want = _by_labels(prom.query(reference[key], at=at))
                problem = _query_problem(prom, answer[key], want, at)
                if problem:
                    raise CheckFailed(
                        f"cluster_queries({run!r}, {window!r})[{key!r}] = {answer[key]!r}, run by "
                        f"the grader's Prometheus on its seeded series of a Ray cluster (two runs, "
                        f"a restarted worker) at one instant: {problem}. Expected {_WANT[key]}"
                    )


# ------------------------------------------------------------------ exercise 5


@functools.lru_cache(maxsize=1)
def _raw_digits() -> dict[str, tuple[Any, Any]]:
    from ddtk.examples.digits_data import digits_split

    return digits_split()


def _ddp_inputs(seed: int) -> tuple[dict[str, tuple[Any, Any]], int, int, float]:
    """A seeded subset of the digits split (raw pixels, an even train size) and settings:
    3 epochs, a batch size and a learning rate, none of them the notebook's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    (tx, ty), (vx, vy) = _raw_digits()["train"], _raw_digits()["val"]
    n_train, n_val = 2 * int(rng.integers(60, 101)), int(rng.integers(50, 91))
    ti, vi = rng.permutation(len(ty))[:n_train], rng.permutation(len(vy))[:n_val]
    split = {"train": (tx[ti], ty[ti]), "val": (vx[vi], vy[vi])}
    return split, 3, int(rng.choice([12, 16, 20, 24, 40])), _learning_rate(rng)


def _ddp_rank(ctx: Any, fn: bytes, split: dict[str, tuple[Any, Any]], epochs: int,
              batch_size: int, lr: float) -> dict[str, Any]:  # fmt: skip
    """One rank of the exercise-5 probe: ``digits_split`` serves the judge's split, the
    observer counts, then the learner's ``ddp_train`` runs."""
    import cloudpickle

    from ddtk.examples import digits_data

    observer = _Observer()
    observer.install()

    def digits_split(val_fraction: float = 0.2, seed: int = 0) -> dict[str, tuple[Any, Any]]:
        return {name: (x.copy(), y.copy()) for name, (x, y) in split.items()}

    digits_data.digits_split = digits_split
    if "ddtk.examples.ray_digits" in sys.modules:
        sys.modules["ddtk.examples.ray_digits"].digits_split = digits_split
    train = cloudpickle.loads(fn)
    out = train(ctx, epochs, batch_size, lr)
    return {"out": _plain(out), "params": observer.final_params(),
            "grad_reductions": observer.grad_reductions}  # fmt: skip


def probe_ddp(ns: dict[str, Any], split: dict, epochs: int, batch_size: int, lr: float) -> list:
    """``ddtk.launch(ddp_train, world_size=2, backend="gloo")`` as the lab runs it, each rank
    observed: what ``ddp_train`` returned, its final parameters, DDP's all-reduces."""
    import cloudpickle

    import ddtk

    fn = cloudpickle.dumps(ns["ddp_train"])
    try:
        return ddtk.launch(_ddp_rank, world_size=2, backend="gloo", timeout=120, echo=False,
                           args=(fn, split, epochs, batch_size, lr))  # fmt: skip
    except ddtk.RankError as exc:
        raise _rank_failure(exc) from None


def check_ddp(ctx: Context) -> None:
    from ddtk.examples.digits_data import scale_pixels

    split, epochs, bs, lr = _ddp_inputs(ctx.seed)
    ranks = ctx.worker().probe(f"{_P}:probe_ddp", split=split, epochs=epochs, batch_size=bs, lr=lr)
    scaled = {k: scale_pixels({"image": x, "label": y}) for k, (x, y) in split.items()}
    tx, ty = scaled["train"]["image"], scaled["train"]["label"]
    shards = [(tx[r::2], ty[r::2]) for r in range(2)]
    vx, vy = scaled["val"]["image"], scaled["val"]["label"]
    ref = _reference_ddp(shards, epochs, bs, lr, evaluate=lambda m: _accuracy(m, vx, vy))
    accuracy = ref["evals"][-1]
    setting = (f"(2 ranks on a seeded subset of digits: {len(ty)} train and "
               f"{len(scaled['val']['label'])} val samples, {epochs} epoch(s), batch_size {bs}, lr {lr})")  # fmt: skip
    outs = [rank["out"] for rank in ranks]
    expect(all(isinstance(o, dict) for o in outs), f"what ddp_train returns {setting}",
           expected="a dict with samples, train_s, last_epoch_s, accuracy, checksum", got=outs)  # fmt: skip
    want_samples = [epochs * len(y) for _, y in shards]
    got_samples = [o.get("samples") for o in outs]
    expect(got_samples == want_samples, f"samples per rank {setting}",
           expected=f"{want_samples} (every 2nd sample, each epoch)", got=got_samples)  # fmt: skip
    reductions = [rank["grad_reductions"] for rank in ranks]
    steps = epochs * math.ceil(len(shards[0][1]) / bs)
    expect(all(n >= steps for n in reductions),
           f"gradient all-reduces DDP ran on each rank, counted by the grader {setting}",
           expected=f">= {steps} (one per step at least)",
           got=f"{reductions}: the model was not wrapped in DistributedDataParallel, so each rank "
           "trained alone")  # fmt: skip
    expect(_bitwise_equal(ranks[0]["params"], ranks[1]["params"]),
           f"the two ranks' parameters after training, read by the grader {setting}",
           expected="bitwise equal (DDP keeps the replicas identical)", got="different")  # fmt: skip
    gap = _param_gap(ref["params"], ranks[0]["params"])
    expect(gap is None, f"the parameters after training {setting}",
           expected="those of the grader's data-parallel SGD (pixels scaled to [-1, 1], every 2nd "
           "sample from the rank, SmallCNN seeded 0, SGD with lr and momentum 0.9, batches in order)",
           got=gap)  # fmt: skip
    for r, (o, rank) in enumerate(zip(outs, ranks)):
        expect(_close(o.get("accuracy"), accuracy, rel=1e-6),
               f"rank {r}'s accuracy {setting}",
               expected=f"{accuracy:.6f}, the final model's accuracy on the whole val split",
               got=o.get("accuracy"))  # fmt: skip
        checksum = float(sum(p.sum() for p in rank["params"].values()))
        expect(_close(o.get("checksum"), checksum, rel=1e-5, abs_=1e-5),
               f"rank {r}'s checksum {setting}",
               expected=f"{checksum:.6f}, the sum of the parameters the grader read from the rank",
               got=o.get("checksum"))  # fmt: skip
        train_s, last = o.get("train_s"), o.get("last_epoch_s")
        expect(isinstance(train_s, int | float) and train_s > 0, f"rank {r}'s train_s {setting}",
               expected="> 0 seconds", got=train_s)  # fmt: skip
        expect(isinstance(last, int | float) and 0 < last < train_s,
               f"rank {r}'s last_epoch_s {setting}",
               expected=f"more than 0 and less than train_s ({train_s}) over {epochs} epochs",
               got=last)  # fmt: skip


# ------------------------------------------------------------------ exercise 6

_COLUMNS = ("ray_samples_per_s", "ray_efficiency", "ddp_samples_per_s", "ddp_efficiency",
            "ray_over_ddp", "ray_wall_s", "ddp_wall_s")  # fmt: skip


def scaling_cases(rng: random.Random) -> list[tuple[dict, dict]]:
    """Seeded measurements in shuffled order with extra fields, and two without a 1-worker run."""
    counts = [1, *rng.sample([2, 3, 4, 6, 8, 16], rng.randint(2, 3))]

    def runs() -> dict[int, dict[str, Any]]:
        base = rng.uniform(50, 2000)
        out = {n: {"samples_per_s": base * n * rng.uniform(0.3, 1.05) if n > 1 else base,
                   "wall_s": rng.uniform(2, 120), "accuracy": rng.uniform(0.5, 1.0),
                   "nodes": ["a1b2c3d4"][: n % 2 + 1]} for n in counts}  # fmt: skip
        order = list(out)
        while order == sorted(order):  # never sorted, whatever the seed: order must be made
            rng.shuffle(order)
        return {n: out[n] for n in order}

    ray_runs, ddp_runs = runs(), runs()
    no_ray_1 = {n: v for n, v in ray_runs.items() if n != 1}
    no_ddp_1 = {n: v for n, v in ddp_runs.items() if n != 1}
    return [(ray_runs, ddp_runs), (no_ray_1, ddp_runs), (ray_runs, no_ddp_1)]


def probe_scaling(ns: dict[str, Any], cases: list[tuple[dict, dict]]) -> list[dict[str, Any]]:
    """``scaling_table`` on each case: the table as data, or the ValueError it raised."""
    out = []
    for ray_runs, ddp_runs in cases:
        try:
            table = ns["scaling_table"](copy.deepcopy(ray_runs), copy.deepcopy(ddp_runs))
        except ValueError as exc:
            out.append({"error": "ValueError", "message": str(exc)[:300]})
            continue
        index = getattr(table, "index", None)
        columns = getattr(table, "columns", [])
        out.append({
            "index": [_plain(i) for i in index] if index is not None else None,
            "name": _plain(getattr(index, "name", None)),
            "columns": {str(c): [_plain(v) for v in table[c]] for c in columns},
        })  # fmt: skip
    return out


def expected_table(ray_runs: dict, ddp_runs: dict) -> dict[str, list[float]] | None:
    """The judge's table (column -> values by worker count), or None when it must raise."""
    if 1 not in ray_runs or 1 not in ddp_runs:
        return None
    cols: dict[str, list[float]] = {c: [] for c in _COLUMNS}
    for n in sorted(set(ray_runs) & set(ddp_runs)):
        r, d = ray_runs[n]["samples_per_s"], ddp_runs[n]["samples_per_s"]
        row = (r, r / (n * ray_runs[1]["samples_per_s"]), d, d / (n * ddp_runs[1]["samples_per_s"]),
               r / d, ray_runs[n]["wall_s"], ddp_runs[n]["wall_s"])  # fmt: skip
        for c, v in zip(_COLUMNS, row):
            cols[c].append(v)
    return cols


def check_scaling(ctx: Context) -> None:
    cases = scaling_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_scaling", cases=cases)
    for (ray_runs, ddp_runs), table in zip(cases, got):
        want = expected_table(ray_runs, ddp_runs)
        call = (f"scaling_table on seeded runs (Ray workers {list(ray_runs)}, "
                f"DDP workers {list(ddp_runs)})")  # fmt: skip
        if want is None:
            missing = "Ray Train" if 1 not in ray_runs else "DDP"
            expect(table.get("error") == "ValueError", call,
                   expected=f"ValueError ({missing} has no 1-worker run)", got="a table")  # fmt: skip
            continue
        expect(
            "error" not in table,
            call,
            expected="a table",
            got=f"ValueError: {table.get('message')}",
        )
        workers = sorted(set(ray_runs) & set(ddp_runs))
        expect(table["index"] == workers and table["name"] == "workers", f"the index of {call}",
               expected=f"workers {workers} (sorted, named 'workers')",
               got=f"{table['index']} named {table['name']!r}")  # fmt: skip
        for column in _COLUMNS:
            values = table["columns"].get(column)
            ok = (
                values is not None
                and len(values) == len(workers)
                and all(_close(v, w, rel=1e-9) for v, w in zip(values, want[column]))
            )
            expect(ok, f"column {column} of {call}",
                   expected=[round(v, 6) for v in want[column]],
                   got=values if values is None else [round(v, 6) if isinstance(v, float) else v for v in values])  # fmt: skip


JUDGE = LabJudge(
    lab="lab01-ray-train",
    setup=(("fd07d9d9", "all"), ("94bbe4b5", "imports"), ("a8b3465f", "imports")),
    exercises={
        1: Exercise(1, "start a local cluster", ("c497dfd5",), check_cluster,
                    ("ddtk.examples", "ddtk.recovery", "ddtk.faults")),
        2: Exercise(2, "complete the RayCluster", ("7f0c1c5d",), check_raycluster,
                    ("ddtk.manifests", "ddtk.examples")),
        3: Exercise(3, "training loop", ("a8b3465f",), check_loop, _TRAINING),
        4: Exercise(4, "PromQL queries", ("28124bec",), check_queries,
                    ("ddtk.monitoring", "ddtk.profiling", "ddtk.examples")),
        5: Exercise(5, "plain DDP", ("661c2225",), check_ddp, _TRAINING, _DATA),
        6: Exercise(6, "scaling table", ("cb951e0e",), check_scaling,
                    ("ddtk.profiling", "ddtk.project", "ddtk.bench")),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
