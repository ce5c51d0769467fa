"""The Keras recipe made multi-worker with TensorFlow's ``MultiWorkerMirroredStrategy``.

    python -m ddtk.examples.cnn_tf --workers localhost:23456,localhost:23457 --index 0 &
    python -m ddtk.examples.cnn_tf --workers localhost:23456,localhost:23457 --index 1

Changed from :mod:`ddtk.examples.cnn_keras`: ``TF_CONFIG`` names every worker and
this one's index; the strategy (collective all-reduce between the workers) is
created before anything else touches TensorFlow, and the model and optimizer
are built in its scope; the global batch is the per-worker batch times the
replicas, and ``tf.data`` shards it by data; the learning rate is scaled by the
replica count; the chief (index 0) alone prints, every worker takes part in saving
and writes its own ``--json`` (with its training losses per epoch). :func:`ddtk.frameworks.tf_mwms.run_workers` starts
the processes. Keras 3 has no multi-worker support, hence ``tf-keras``.
"""

from __future__ import annotations

import argparse
import json
import os

from ddtk.examples.keras_common import (
    Warmup,
    build_parser,
    build_resnet,
    digits_arrays,
    memory_facts,
    parse_checked,
    tf,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The shared command line, and the cluster: every worker's address and this one's index."""
    p = build_parser(__doc__.splitlines()[0])
    p.add_argument("--workers", required=True, help="host:port of every worker, comma-separated")
    p.add_argument("--index", type=int, required=True, help="this worker's position in --workers")
    return parse_checked(p, argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    workers = args.workers.split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": args.index}}
    )
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    size, chief = strategy.num_replicas_in_sync, args.index == 0
    data = digits_arrays()
    (x, y), (x_val, y_val) = data["train"], data["val"]
    lr = args.lr * size
    steps_per_epoch = len(x) // (args.batch_size * size)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    train = train.batch(args.batch_size * size, drop_remainder=True).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = train.with_options(options)
    with strategy.scope():
        model = build_resnet()
        model.compile(
            optimizer=tf.keras.optimizers.SGD(lr, momentum=0.9),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    warmup = Warmup(lr, steps_per_epoch, args.warmup_epochs)
    history = model.fit(
        train, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
        validation_data=(x_val, y_val), callbacks=[warmup], verbose=0,
    )  # fmt: skip
    metrics = {
        "epoch": args.epochs,
        "loss": history.history["val_loss"][-1],
        "accuracy": history.history["val_accuracy"][-1],
        "images_per_s": steps_per_epoch * args.batch_size * size / warmup.epoch_seconds[-1],
    }
    if chief:
        print(json.dumps(metrics), flush=True)
    if args.checkpoint:  # every worker saves (a collective); only the chief's copy is kept
        model.save_weights(args.checkpoint if chief else f"{args.checkpoint}.worker{args.index}")
    if args.json:  # each worker its own file: their losses show the lock-step
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": size, "train_loss": history.history["loss"],
                       "epoch_seconds": warmup.epoch_seconds, **memory_facts(model), **vars(args)}, f)  # fmt: skip
    return metrics


if __name__ == "__main__":
    main()
