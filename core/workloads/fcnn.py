"""The hyper-parameterised fully-connected network of the AI4NP roofline study.

l hidden layers of width D_H between an input of width D_I and an output of width D_O:
``Linear(D_I, D_H), ReLU, (l-1) x [Linear(D_H, D_H), ReLU], Linear(D_H, D_O)``.

Parameter count, as the paper defines it, counts weights only:
``Phi = D_H^2 (l-1) + D_H (D_I + D_O)``. The model also has ``l * D_H + D_O`` bias terms;
they are left out of Phi (and so of the FLOP count) to keep figures comparable with the paper.
FLOPs per update = 6 Phi bs (2 forward, 4 backward per weight per sample).

Bytes moved per sample (the roofline's denominator, :func:`bytes_per_sample`) are counted the
same way, each tensor read or written once per use with no cache reuse: a model of compulsory
traffic, documented with a worked example in docs/concepts.md#bytes-moved-per-sample.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from core.base.config import Framework, RunConfig
from core.base.precision import policy_for
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec, Workload

LEARNING_RATE = 0.01
MOMENTUM = 0.9


class FcnnOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    layers: int = Field(default=4, ge=1, le=1024, description="hidden layers, l")
    hidden_width: int = Field(default=512, ge=1, le=1 << 17, description="nodes per hidden layer, D_H")
    input_width: int = Field(default=2000, ge=1, le=1 << 20, description="input features, D_I")
    output_width: int = Field(default=200, ge=2, le=1 << 20, description="output classes, D_O")
    synthetic_pool_samples: int = Field(
        default=1024, ge=1, le=1 << 20, description="distinct synthetic samples; sample i is pool[i % pool]"
    )


def weight_count(o: FcnnOptions) -> int:
    """Phi of the paper: weights only."""
    return o.hidden_width**2 * (o.layers - 1) + o.hidden_width * (o.input_width + o.output_width)


def bias_count(o: FcnnOptions) -> int:
    return o.layers * o.hidden_width + o.output_width


# Bytes per stored value. Parameters, gradients and optimizer state stay fp32 under core's policies
# (autocast and Keras' mixed precision keep fp32 variables); activations take the compute type
# (PrecisionPolicy.activation_bytes).
PARAMETER_BYTES = 4
# Per update, SGD with momentum reads the weight, its gradient and the momentum and writes the
# momentum and the weight: 3 + 2 x (state values per parameter) values per parameter.
MOMENTUM_STATE_VALUES = 1


def linear_shapes(o: FcnnOptions) -> list[tuple[int, int]]:
    """(inputs, outputs) of each Linear layer, first to last."""
    return (
        [(o.input_width, o.hidden_width)]
        + [(o.hidden_width, o.hidden_width)] * (o.layers - 1)
        + [(o.hidden_width, o.output_width)]
    )


def activation_values_per_sample(o: FcnnOptions, training: bool = True) -> int:
    """Activation values one sample moves through memory in one step (forward and, in training, backward).

    Each Linear (n inputs, m outputs) reads its input and writes its output going forward (n + m);
    backward, its weight gradient reads the saved input and the output gradient (n + m) and, but
    for the first layer, its input gradient reads the output gradient and writes the input's
    (m + n). Each ReLU (width D_H) reads and writes going forward (2 D_H) and, backward, reads the
    gradient and its saved output and writes the input gradient (3 D_H). The loss is left out.
    """
    shapes = linear_shapes(o)
    forward = sum(n + m for n, m in shapes) + 2 * o.layers * o.hidden_width
    if not training:
        return forward
    weight_gradients = sum(n + m for n, m in shapes)
    input_gradients = sum(n + m for n, m in shapes[1:])
    return forward + weight_gradients + input_gradients + 3 * o.layers * o.hidden_width


def bytes_per_sample(
    o: FcnnOptions, micro_batch_size: int, gradient_accumulation: int, precision: str, training: bool = True
) -> float:
    """Bytes one device moves per sample (a lower bound: each tensor once per use, no re-reads).

    Training: per micro-batch the weights are read forward and backward and the gradient written
    (3 Phi values, shared by the micro-batch's samples); per update the optimizer moves
    3 + 2 x 1 = 5 Phi values (shared by micro-batch x accumulation samples); each sample moves its
    own activations (:func:`activation_values_per_sample`). Inference: the weights once per
    micro-batch, and the forward activations.
    """
    phi = weight_count(o)
    activations = activation_values_per_sample(o, training) * policy_for(precision).activation_bytes()
    if not training:
        return phi * PARAMETER_BYTES / micro_batch_size + activations
    per_micro_batch = 3 * phi * PARAMETER_BYTES / micro_batch_size
    per_update = (3 + 2 * MOMENTUM_STATE_VALUES) * phi * PARAMETER_BYTES / (micro_batch_size * gradient_accumulation)
    return per_micro_batch + per_update + activations


class Fcnn(Workload):
    name: ClassVar[str] = "fcnn"
    description: ClassVar[str] = "AI4NP hyper-parameterised fully-connected network (synthetic data)"
    task: ClassVar[str] = "classification"
    sample_unit: ClassVar[str] = "samples"
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    default_micro_batch_size: ClassVar[int] = 64
    options_model: ClassVar[type[BaseModel]] = FcnnOptions
    #: feature vectors of input_width: no image or token file holds them
    data_formats: ClassVar[tuple[str, ...] | None] = ()

    def toy_options(self, options: dict[str, Any]) -> dict[str, Any]:
        # The paper's grid goes to 128 layers of 8192 nodes; a toy keeps the shape of each cell small.
        caps = {"layers": 4, "hidden_width": 64, "input_width": 64, "output_width": 16, "synthetic_pool_samples": 64}
        toy = {
            key: min(value, caps[key]) if key in caps and isinstance(value, int) else value
            for key, value in options.items()
        }
        for key in ("input_width", "output_width", "synthetic_pool_samples"):
            toy.setdefault(key, caps[key])
        return toy

    def parameter_count(self, options: BaseModel) -> int:
        assert isinstance(options, FcnnOptions)
        return weight_count(options)

    def optimizer_state_per_parameter(self, options: BaseModel) -> int:
        return MOMENTUM_STATE_VALUES  # SGD with momentum: one buffer per parameter

    def memory_bytes_per_sample(self, options: BaseModel, config: RunConfig) -> float | None:
        assert isinstance(options, FcnnOptions)
        if config.micro_batch_size is None:
            return None
        return bytes_per_sample(
            options,
            config.micro_batch_size,
            config.gradient_accumulation,
            config.precision,
            training=config.mode != "inference",
        )

    def flops_per_sample(self, options: BaseModel) -> float:
        assert isinstance(options, FcnnOptions)
        return 6.0 * weight_count(options)

    def details(self, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, FcnnOptions)
        return {
            "source": "core.workloads.fcnn (AI4NP FCNN, written here)",
            "options": options.model_dump(),
            "weights": weight_count(options),
            "biases": bias_count(options),
            "parameter_count_counts": "weights only (Phi); biases listed apart",
        }

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch
        from torch import nn

        assert isinstance(options, FcnnOptions)
        o = options
        # fork_rng keeps the caller's global RNG untouched while the weights come from ``seed``.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            layers: list[nn.Module] = [nn.Linear(o.input_width, o.hidden_width), nn.ReLU()]
            for _ in range(o.layers - 1):
                layers += [nn.Linear(o.hidden_width, o.hidden_width), nn.ReLU()]
            layers.append(nn.Linear(o.hidden_width, o.output_width))
            model = nn.Sequential(*layers)
        generator = torch.Generator().manual_seed(seed + 1)
        inputs = torch.randn(o.synthetic_pool_samples, o.input_width, generator=generator)
        targets = torch.randint(0, o.output_width, (o.synthetic_pool_samples,), generator=generator)
        return TorchTrainingSpec(
            model=model,
            loss_fn=nn.CrossEntropyLoss(),
            make_optimizer=lambda params: torch.optim.SGD(params, lr=LEARNING_RATE, momentum=MOMENTUM),
            inputs=inputs,
            targets=targets,
        )

    def build_keras(self, options: BaseModel, seed: int) -> KerasTrainingSpec:
        import numpy as np

        assert isinstance(options, FcnnOptions)
        o = options

        def make_model() -> Any:
            from tensorflow import keras

            if hasattr(keras.utils, "set_random_seed"):
                keras.utils.set_random_seed(seed)
            else:  # TensorFlow < 2.7 (the Poplar SDK's 2.6): the seeds set_random_seed sets
                import random

                import tensorflow as tf

                random.seed(seed)
                np.random.seed(seed)
                tf.random.set_seed(seed)
            model = keras.Sequential(name="fcnn")
            model.add(keras.Input(shape=(o.input_width,)))
            for _ in range(o.layers):
                model.add(keras.layers.Dense(o.hidden_width, activation="relu"))
            model.add(keras.layers.Dense(o.output_width))
            # Logits in float32 so mixed-precision policies keep a stable softmax.
            model.add(keras.layers.Activation("linear", dtype="float32"))
            return model

        def make_loss() -> Any:
            from tensorflow import keras

            return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        def make_optimizer() -> Any:
            from tensorflow import keras

            return keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM)

        rng = np.random.default_rng(seed + 1)
        return KerasTrainingSpec(
            make_model=make_model,
            make_loss=make_loss,
            make_optimizer=make_optimizer,
            inputs=rng.standard_normal((o.synthetic_pool_samples, o.input_width), dtype=np.float32),
            targets=rng.integers(0, o.output_width, size=(o.synthetic_pool_samples,), dtype=np.int64),
        )
