"""The ResNet-style CNN on digits in Keras, one process: the TensorFlow recipe's baseline.

    TF_USE_LEGACY_KERAS=1 python -m ddtk.examples.cnn_keras --epochs 4

The same network as :class:`ddtk.models.ResNetSmall` (19,706 trainable
parameters), data split and schedule as :mod:`ddtk.examples.cnn_single`, written
for Keras 2 (``tf-keras``; ``TF_USE_LEGACY_KERAS=1`` selects it, and
``MultiWorkerMirroredStrategy`` needs it). :mod:`ddtk.examples.cnn_tf` is this
file made multi-worker. TensorFlow runs in its own process, never beside torch.
"""

from __future__ import annotations

import argparse
import json

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
    """The shared command line (:func:`~ddtk.examples.keras_common.build_parser`)."""
    p = build_parser(__doc__.splitlines()[0])
    return parse_checked(p, argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    data = digits_arrays()
    (x, y), (x_val, y_val) = data["train"], data["val"]
    steps_per_epoch = len(x) // args.batch_size
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    train = train.batch(args.batch_size, drop_remainder=True).repeat()
    model = build_resnet()
    model.compile(
        optimizer=tf.keras.optimizers.SGD(args.lr, momentum=0.9),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    warmup = Warmup(args.lr, steps_per_epoch, args.warmup_epochs)
    history = model.fit(
        train, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
        validation_data=(x_val, y_val), callbacks=[warmup], verbose=0,
    )  # fmt: skip
    metrics = {
        "epoch": args.epochs,
        "loss": history.history["val_loss"][-1],
        "accuracy": history.history["val_accuracy"][-1],
        "images_per_s": steps_per_epoch * args.batch_size / warmup.epoch_seconds[-1],
    }
    print(json.dumps(metrics), flush=True)
    if args.checkpoint:
        model.save_weights(args.checkpoint)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**metrics, "world_size": 1, **memory_facts(model), **vars(args)}, f)
    return metrics


if __name__ == "__main__":
    main()
