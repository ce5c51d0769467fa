"""Lab 01's training job: a small CNN on the digits images with Ray Train V2 and Ray Data.

What runs where:

- the **driver** (this process) builds two Ray Data datasets, ``train`` and ``val``,
  from scikit-learn's digits (1,797 8x8 images, shipped with the package, so nothing
  is downloaded) with a ``map_batches`` step that scales pixels to [-1, 1]
  (:mod:`ddtk.examples.digits_data`, a numpy-only module, so Ray Data's workers do
  not import torch to run it), and materialises them once in the object store;
- ``TorchTrainer`` starts ``num_workers`` worker actors, forms a torch process group
  (gloo on CPU, NCCL with ``use_gpu``) and runs :func:`train_loop_per_worker` in each;
- every worker reads its own shard of ``train`` (``ray.train.get_dataset_shard``),
  trains the DDP-wrapped model, measures global validation accuracy with one
  all-reduce, and calls ``ray.train.report`` once per epoch; rank 0 attaches a
  checkpoint, so a restarted run resumes from the last finished epoch.

Per-worker metrics reach the driver while training runs: a
:class:`ReportForwarder` callback (on Ray Train's controller) puts every report of
every worker on a queue that :func:`fit` drains into ``on_report``.

On the laptop, from Python (starts a local Ray instance if none is running)::

    from ddtk.examples.ray_digits import fit
    result = fit(num_workers=2, epochs=2)
    print(result.metrics["accuracy"], result.checkpoint)

From a shell, here or on a cluster (``deploy/kuberay/rayjob.yaml`` runs exactly this)::

    python -m ddtk.examples.ray_digits --num-workers 2 --epochs 2
    python -m ddtk.examples.ray_digits --address auto --num-workers 8 --use-gpu \\
        --storage-path /mnt/shared/ray-results

>>> parse_args(["--num-workers", "3", "--epochs", "4"]).num_workers
3
>>> check_settings(num_workers=0, epochs=1, batch_size=32, lr=0.1)
Traceback (most recent call last):
...
ValueError: num_workers must be an integer >= 1, got 0
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from ray.train import UserCallback

from ddtk.examples.digits_data import digits_datasets, digits_split, scale_pixels

if TYPE_CHECKING:
    import ray.train

__all__ = [
    "ReportForwarder",
    "check_settings",
    "digits_datasets",
    "digits_split",
    "evaluate_checkpoint",
    "fit",
    "load_model",
    "main",
    "parse_args",
    "scale_pixels",
    "train_loop_per_worker",
]

CHECKPOINT_FILE = "model.pt"
Report = dict[str, Any]


# -- the training function each worker runs -------------------------------------------------
def _model(seed: int) -> torch.nn.Module:
    from ddtk.models import SmallCNN

    torch.manual_seed(seed)
    return SmallCNN()


def _resume(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the latest reported checkpoint, if Ray handed one over; return the next epoch."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / CHECKPOINT_FILE, weights_only=True)
    getattr(model, "module", model).load_state_dict(state["model"])  # saved unwrapped from DDP
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"]) + 1


def _accuracy(model: torch.nn.Module, shard: Any, batch_size: int, device: torch.device) -> float:
    """Global accuracy over every worker's validation shard: one all-reduce of two counts."""
    import torch.distributed as dist

    counts = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    with torch.no_grad():
        for batch in shard.iter_torch_batches(batch_size=batch_size, device=device):
            predicted = model(batch["image"]).argmax(dim=1)
            counts += torch.tensor(
                [(predicted == batch["label"]).sum().item(), len(predicted)],
                dtype=torch.float64,
                device=device,
            )
    model.train()
    if dist.is_initialized():
        dist.all_reduce(counts)
    return float(counts[0] / counts[1].clamp_min(1))


def _tensorboard(folder: str | None, rank: int) -> Any:
    """A tensorboardX writer for rank 0 when ``folder`` is set, else None."""
    if not folder or rank != 0:
        return None
    from tensorboardX import SummaryWriter

    return SummaryWriter(folder)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """The function ``TorchTrainer`` runs in every worker: train, evaluate, report, checkpoint.

    ``config``: ``epochs``, ``lr``, ``batch_size`` (per worker), ``seed`` and
    optionally ``tensorboard_dir`` (rank 0 writes event files there). Each epoch
    reports ``epoch``, ``loss`` (this worker's mean), ``accuracy`` (global, on
    ``val``), ``samples`` and ``samples_per_s`` (this worker's), ``train_s``,
    ``world_size``, ``rank`` and ``node``; rank 0 attaches the checkpoint.
    """
    import ray
    import ray.train
    import ray.train.torch

    torch.set_num_threads(1)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(_model(int(config.get("seed", 0))))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]), momentum=0.9)
    start = _resume(model, optimizer)
    train_shard, val_shard = (
        ray.train.get_dataset_shard("train"),
        ray.train.get_dataset_shard("val"),
    )
    batch_size = int(config["batch_size"])
    writer = _tensorboard(config.get("tensorboard_dir"), rank)
    for epoch in range(start, int(config["epochs"])):
        began, samples, loss_sum = time.perf_counter(), 0, 0.0
        for batch in train_shard.iter_torch_batches(batch_size=batch_size, device=device):
            loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            samples += len(batch["label"])
            loss_sum += loss.item() * len(batch["label"])
        train_s = time.perf_counter() - began
        metrics = {
            "epoch": epoch,
            "loss": loss_sum / max(samples, 1),
            "accuracy": _accuracy(model, val_shard, batch_size, device),
            "samples": samples,
            "train_s": train_s,
            "samples_per_s": samples / train_s if train_s > 0 else 0.0,
            "world_size": world,
            "rank": rank,
            "node": ray.get_runtime_context().get_node_id()[:8],
        }
        if writer is not None:
            for key in ("loss", "accuracy", "samples_per_s"):
                writer.add_scalar(f"train/{key}", metrics[key], epoch)
            writer.flush()
        _report(metrics, model, optimizer, epoch, rank)
    if writer is not None:
        writer.close()


def _report(
    metrics: Report, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int, rank: int
) -> None:
    """``ray.train.report`` for every worker; rank 0 attaches the checkpoint of this epoch."""
    import ray.train

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            weights = getattr(model, "module", model).state_dict()  # unwrap DDP
            state = {"model": weights, "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, Path(folder) / CHECKPOINT_FILE)
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=f"epoch-{epoch:03d}")


# -- the driver -----------------------------------------------------------------------------
class ReportForwarder(UserCallback):
    """A Ray Train callback that puts every worker's report on a ``ray.util.queue.Queue``.

    Ray Train keeps only rank 0's metrics in ``Result``; the controller, where this
    callback runs, sees all of them: ``after_report`` gets one dict per worker,
    indexed by rank, and forwards the list.
    """

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def after_report(self, run_context: Any, metrics: list[Report], checkpoint: Any) -> None:
        # A blocking put: once fit() returns, every report is on the queue.
        self.queue.put([dict(m) for m in metrics])


def check_settings(num_workers: Any, epochs: Any, batch_size: Any, lr: Any) -> None:
    """Refuse impossible settings before any Ray work starts, naming the setting."""
    for name, value in (
        ("num_workers", num_workers),
        ("epochs", epochs),
        ("batch_size", batch_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(lr, int | float) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")


def _drain(queue: Any, on_report: Callable[[list[Report]], None]) -> None:
    while not queue.empty():
        on_report(queue.get())


def fit(
    num_workers: int = 2,
    epochs: int = 2,
    batch_size: int = 64,
    lr: float = 0.05,
    *,
    use_gpu: bool = False,
    cpus_per_worker: float = 1.0,
    placement_strategy: str = "SPREAD",
    storage_path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    train_loop: Callable[[dict[str, Any]], None] = train_loop_per_worker,
    tensorboard_dir: str | os.PathLike[str] | None = None,
    on_report: Callable[[list[Report]], None] | None = None,
    seed: int = 0,
) -> ray.train.Result:
    """Train the digits CNN with ``TorchTrainer``; return Ray Train's ``Result``.

    ``train_loop`` is the per-worker function (lab 01 passes the learner's own);
    ``placement_strategy`` spreads the workers over the nodes by default. With
    ``on_report``, every report of every worker is passed to it while training runs,
    as a list indexed by rank. Starts a local Ray instance if none is running.
    Raises ``ray.train.TrainingFailedError`` when a worker fails.
    """
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    check_settings(num_workers, epochs, batch_size, lr)
    if not ray.is_initialized():
        ray.init()
    # The preprocessing is deterministic, so it runs once, here, before the workers start;
    # each epoch's shards then stream from the object store. Lazy, it would run again in
    # every epoch, and its first run would wait for cold Ray worker processes while the
    # training workers import torch on the same cores (20-27 s per fit on 2 cores).
    train, val = (dataset.materialize() for dataset in digits_datasets(seed=seed))
    queue = Queue(actor_options={"num_cpus": 0}) if on_report is not None else None
    config = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed}
    if tensorboard_dir:
        config["tensorboard_dir"] = str(tensorboard_dir)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=num_workers,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": cpus_per_worker},
            placement_strategy=placement_strategy,
        ),
        run_config=RunConfig(
            name=name or f"digits-{num_workers}w-{int(time.time())}",
            storage_path=str(storage_path) if storage_path else None,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            callbacks=[ReportForwarder(queue)] if queue is not None else None,
        ),
        datasets={"train": train, "val": val},
    )
    if queue is None:
        return trainer.fit()
    return _fit_forwarding(trainer, queue, on_report)


def _fit_forwarding(trainer: Any, queue: Any, on_report: Callable[[list[Report]], None]) -> Any:
    """Run ``trainer.fit()`` in a thread and pass the forwarded reports on as they arrive."""
    import ray

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="ray-digits-fit", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(timeout=0.5)
            _drain(queue, on_report)
        _drain(queue, on_report)
    finally:
        ray.kill(queue.actor)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def load_model(checkpoint: ray.train.Checkpoint) -> torch.nn.Module:
    """The trained CNN from a checkpoint written by :func:`train_loop_per_worker`."""
    with checkpoint.as_directory() as folder:
        path = Path(folder) / CHECKPOINT_FILE
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {checkpoint.path} has no {CHECKPOINT_FILE}")
        state = torch.load(path, weights_only=True)
    model = _model(0)
    model.load_state_dict(state["model"])
    return model.eval()


def evaluate_checkpoint(checkpoint: ray.train.Checkpoint, seed: int = 0) -> float:
    """Accuracy of a checkpoint's model on the whole ``val`` split, computed in this process.

    The same split and the same :func:`scale_pixels` as training, applied with numpy
    here: 359 rows need no Ray tasks, and a pipeline would wait seconds for worker
    processes to start.
    """
    images, labels = digits_split(seed=seed)["val"]
    batch = scale_pixels({"image": images, "label": labels})
    model = load_model(checkpoint)
    with torch.no_grad():
        predicted = model(torch.from_numpy(batch["image"])).argmax(1)
    return float((predicted == torch.from_numpy(batch["label"])).float().mean())


# -- command line ---------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m ddtk.examples.ray_digits``."""
    p = argparse.ArgumentParser(
        prog="python -m ddtk.examples.ray_digits",
        description="Train a CNN on digits with Ray Train V2 (lab 01's job).",
    )
    p.add_argument("--num-workers", type=int, default=2, help="training workers (default 2)")
    p.add_argument("--epochs", type=int, default=2, help="passes over the data (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per worker per step")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL")
    p.add_argument("--storage-path", default=None, help="shared storage for results (NFS, s3://)")
    p.add_argument("--address", default=None, help="Ray cluster to join, e.g. 'auto'")
    p.add_argument("--name", default=None, help="run name under the storage path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, print the final metrics and the checkpoint; exit 1 if training failed."""
    import ray

    args = parse_args(argv)
    try:
        check_settings(args.num_workers, args.epochs, args.batch_size, args.lr)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ray.init(address=args.address)
    try:
        result = fit(
            args.num_workers,
            args.epochs,
            args.batch_size,
            args.lr,
            use_gpu=args.use_gpu,
            storage_path=args.storage_path,
            name=args.name,
        )
    except Exception as exc:  # a failed run: one line, not Ray's whole traceback
        print(f"error: training failed: {exc}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    m = result.metrics
    print(
        f"trained {m['epoch'] + 1} epochs on {m['world_size']} workers: "
        f"val accuracy {m['accuracy']:.3f}, loss {m['loss']:.3f}"
    )
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
