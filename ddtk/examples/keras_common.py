"""What the Keras recipes share: the command line, the ResNet twin, the data, warm-up and memory facts.

:mod:`ddtk.examples.cnn_keras` (one process) and :mod:`ddtk.examples.cnn_tf`
(``MultiWorkerMirroredStrategy``) import these, so each recipe file holds only
its ``parse_args`` and ``main``, and :func:`ddtk.frameworks.recipes.lines_changed`
counts what the strategy changes. Importing this module imports TensorFlow (with
``TF_USE_LEGACY_KERAS=1``): only worker processes do, never a torch process.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from ddtk.examples.digits_data import digits_split


def parse_checked(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv`` and refuse values no recipe can train with, naming the flags."""
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or args.warmup_epochs < 0:
        p.error("--epochs and --batch-size must be >= 1, --lr > 0 and --warmup-epochs >= 0")
    return args


def build_parser(description: str) -> argparse.ArgumentParser:
    """The command line shared by every recipe (sizes are per process)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="samples per process per step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate for one process")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--checkpoint", default=None, help="save the final model here")
    p.add_argument("--json", default=None, help="write the final metrics here")
    return p


def residual_block(x: tf.Tensor, width: int, stride: int = 1) -> tf.Tensor:
    """Keras twin of :class:`ddtk.models.ResidualBlock` (channels last)."""
    layers = tf.keras.layers
    out = layers.Conv2D(width, 3, stride, padding="same", use_bias=False)(x)
    out = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(out))
    out = layers.BatchNormalization(momentum=0.9)(layers.Conv2D(width, 3, padding="same", use_bias=False)(out))
    shortcut = x
    if stride != 1 or x.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, stride, use_bias=False)(x)
        shortcut = layers.BatchNormalization(momentum=0.9)(shortcut)
    return layers.ReLU()(out + shortcut)


def build_resnet(width: int = 16, num_classes: int = 10) -> tf.keras.Model:
    """Keras twin of :class:`ddtk.models.ResNetSmall` for 8x8x1 digits.

    BatchNorm momentum 0.9 is torch's default (0.1, counted the other way); Keras's 0.99
    leaves the running statistics far from the data after a few hundred steps.
    """
    layers = tf.keras.layers
    inputs = tf.keras.Input((8, 8, 1))
    x = layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(x))
    x = residual_block(residual_block(x, width), 2 * width, stride=2)
    outputs = layers.Dense(num_classes)(layers.GlobalAveragePooling2D()(x))
    return tf.keras.Model(inputs, outputs)


def digits_arrays() -> dict[str, tuple]:
    """The seeded digits split, channels last, pixels scaled to [0, 1] as in ddtk.data."""
    return {k: (x.transpose(0, 2, 3, 1) / 16.0, y) for k, (x, y) in digits_split().items()}


class Warmup(tf.keras.callbacks.Callback):
    """Linear learning-rate warm-up per step, and each epoch's training time (validation excluded)."""

    def __init__(self, lr: float, steps_per_epoch: int, warmup_epochs: float):
        super().__init__()
        self.lr, self.warmup_steps, self.step = lr, warmup_epochs * steps_per_epoch, 0
        self.epoch_seconds: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        ramp = 1.0 if self.step >= self.warmup_steps else (self.step + 1) / self.warmup_steps
        self.model.optimizer.learning_rate.assign(self.lr * ramp)
        self.step += 1

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_test_begin(self, logs: dict | None = None) -> None:  # validation: stop the clock
        self.epoch_seconds.append(time.perf_counter() - self._start)


def memory_facts(model: tf.keras.Model) -> dict[str, int]:
    """Bytes of the model's and optimizer's variables, and this process's peak RSS."""
    variables = model.variables + model.optimizer.variables()
    return {
        "state_bytes": sum(int(v.numpy().nbytes) for v in variables),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


