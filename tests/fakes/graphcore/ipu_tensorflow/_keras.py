"""The fake IPU Keras extensions (graphcore/keras ``keras/ipu/extensions``), patched onto
``keras.Model`` while an IPUStrategy exists: the option setters with the real argument checks and
messages; ``fit`` refusing what IPU Keras refuses before it compiles (a pipelined model without
gradient accumulation; ``steps_per_execution`` not a multiple of the gradient accumulation); and
``fit`` and ``predict`` reading their step counts as IPU Keras does, over all replicas together.
Every call is appended to ``calls``. The fake runs Keras on the CPU, one weight update per
micro-batch and every replica's micro-batches one after the other: it checks configurations and
counts, it does not emulate accumulation."""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from . import config
from .gradient_accumulation import GradientAccumulationReductionMethod

calls: list[tuple] = []
_ORIGINAL_FIT: dict[str, Any] = {}


def _state(model: Any) -> dict[str, Any]:
    state = model.__dict__.get("_fake_ipu_state")
    if state is None:
        state = {"ga": None, "pipeline_ga": None, "assignment": None, "reduction": None}
        object.__setattr__(model, "_fake_ipu_state", state)
    return state


def _positive(value: Any) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(
            f"Expected `gradient_accumulation_steps_per_replica` to be a positive integer, but got {value} instead."
        )


def set_gradient_accumulation_options(
    self: Any,
    gradient_accumulation_steps_per_replica: Any = None,
    gradient_accumulation_reduction_method: Any = "sum",
    use_v2_gradient_accumulation_optimizer: bool = False,
    **gradient_accumulation_optimizer_kwargs: Any,
) -> None:
    calls.append(
        (
            "set_gradient_accumulation_options",
            gradient_accumulation_steps_per_replica,
            gradient_accumulation_reduction_method,
        )
    )
    state = _state(self)
    state["reduction"] = GradientAccumulationReductionMethod.parse(gradient_accumulation_reduction_method)
    if gradient_accumulation_steps_per_replica is not None:
        _positive(gradient_accumulation_steps_per_replica)
        state["ga"] = gradient_accumulation_steps_per_replica


def set_pipelining_options(
    self: Any,
    gradient_accumulation_steps_per_replica: Any = None,
    device_mapping: Any = None,
    accumulate_outfeed: Any = None,
    gradient_accumulation_reduction_method: Any = "sum",
    **pipelining_kwargs: Any,
) -> None:
    calls.append(
        ("set_pipelining_options", gradient_accumulation_steps_per_replica, gradient_accumulation_reduction_method)
    )
    state = _state(self)
    state["reduction"] = GradientAccumulationReductionMethod.parse(gradient_accumulation_reduction_method)
    if gradient_accumulation_steps_per_replica is not None:
        _positive(gradient_accumulation_steps_per_replica)
        state["pipeline_ga"] = gradient_accumulation_steps_per_replica
    if device_mapping is not None and (
        not isinstance(device_mapping, list) or not all(isinstance(x, int) for x in device_mapping)
    ):
        raise ValueError("Expected `device_mapping` to be a list of integers.")


def set_pipeline_stage_assignment(self: Any, pipeline_stage_assignment: Any) -> None:
    calls.append(
        (
            "set_pipeline_stage_assignment",
            list(pipeline_stage_assignment)
            if isinstance(pipeline_stage_assignment, list)
            else pipeline_stage_assignment,
        )
    )
    if not isinstance(pipeline_stage_assignment, list):
        raise ValueError("`pipeline_stage_assignment` needs to be a list.")
    if len(pipeline_stage_assignment) != len(self.layers):
        raise ValueError(
            f"The length of the provided `pipeline_stage_assignment` ({len(pipeline_stage_assignment)}) does not "
            f"match the number of layers in the graph ({len(self.layers)}). Each layer needs to be assigned a "
            "pipeline stage (excluding input layers)."
        )
    _state(self)["assignment"] = list(pipeline_stage_assignment)


def _compiled_steps_per_execution(model: Any) -> int:
    value = model.steps_per_execution
    return int(value.numpy()) if hasattr(value, "numpy") else int(value)


def _pipeline_stages(model: Any) -> int:
    """``_get_shard_count`` (extensions_base.py): the highest stage assigned + 1, else 1."""
    assignment = _state(model)["assignment"]
    return max(assignment) + 1 if assignment is not None and len(set(assignment)) > 1 else 1


def _replication_factor(model: Any) -> int:
    """``_get_replication_factor`` (extensions_base.py): the IPUs of the configured device divided by
    the shard count rounded up to a power of two."""
    if not config.configured or not config.configured[-1].auto_select_ipus:
        raise ValueError(f"{type(model).__name__} can only be used on an IPU device.")
    num_ipus = int(config.configured[-1].auto_select_ipus[0])
    shards = _pipeline_stages(model)
    rounded = 2 ** math.ceil(math.log2(shards))
    if shards > num_ipus:
        raise ValueError(
            f"Current device has {num_ipus} IPUs attached, however the current model requires a multiple of "
            f"{rounded} IPUs."
        )
    return num_ipus // rounded


def _steps_per_replica(model: Any, steps: Any) -> tuple[int, int]:
    """(steps per replica, steps per execution) as ``IPUDataHandler`` infers and validates them
    (graphcore/keras ``keras/ipu/extensions/data_adapter.py``: ``_infer_steps`` divides the steps asked
    for by the replication factor; ``_truncate_execution_to_epoch`` caps ``steps_per_execution`` at
    that; ``_validate_data_handler`` refuses 0 steps and a per-replica count it does not divide)."""
    if steps is None:
        raise ValueError("Could not infer the size of the data. You must specify the number of steps to run.")
    replicas = _replication_factor(model)
    per_replica = int(steps) // replicas
    compiled = _compiled_steps_per_execution(model)
    to_replica = " to this replica" if replicas > 1 else ""
    if per_replica == 0:
        raise ValueError(
            f"The provided dataset contains {steps} items, but all {replicas} replicas are requested to run 1 "
            f"steps each. Make sure the dataset contains at least {replicas} items."
        )
    execution = min(compiled, per_replica)
    if per_replica % execution:
        raise ValueError(
            f"`steps_per_execution` ({execution}) must be a divisor of the number of batches ({per_replica}) in "
            f"the dataset provided{to_replica}."
        )
    return per_replica, execution


def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
    state = _state(self)
    pipelined = _pipeline_stages(self) > 1
    calls.append(("fit", _compiled_steps_per_execution(self), kwargs.get("steps_per_epoch")))
    _, steps = _steps_per_replica(self, kwargs.get("steps_per_epoch"))
    mode = ""
    if pipelined:
        mode = "pipelined "
        if state["pipeline_ga"] is None:
            raise ValueError(
                "The model which you are attempting to train is pipelined, however "
                "`gradient_accumulation_steps_per_replica` has not been set through `set_pipelining_options()`. "
                "You need to set this value as pipelined models will perform gradient accumulation when training."
            )
        accumulation = state["pipeline_ga"]
    else:
        accumulation = state["ga"] or 1
    if steps % accumulation:
        raise RuntimeError(
            f"The {mode}model has been configured to use gradient accumulation for training, however the current "
            f"`steps_per_execution` value (set to {steps}) is not divisible by "
            f"`gradient_accumulation_steps_per_replica` ({accumulation}). You need to adjust either "
            "`steps_per_execution` or`gradient_accumulation_steps_per_replica` to make sure that "
            "`steps_per_execution` is divisible by `gradient_accumulation_steps_per_replica`."
        )
    return _ORIGINAL_FIT["fit"](self, *args, **kwargs)


def predict(self: Any, x: Any, batch_size: Any = None, verbose: Any = 0, steps: Any = None, **kwargs: Any) -> Any:
    """``_predict_delegate`` (extensions_base.py): the same step arithmetic as ``fit``; a pipelined
    model runs one pipeline ``steps_per_execution`` deep (``_make_pipeline_ipu_predict_function``) with
    no gradient accumulation (``set_pipelining_options``: "no effect when using evaluate() or
    predict()"), and Poplar refuses a depth that is not a multiple of, or less than, the forward stages
    (graphcore/tensorflow ``compiler/plugin/poplar/driver/visitors/pipeline_visitor.cc``, the Grouped
    schedule's overlap). The real call raises that when it compiles; so does the fake, before running.
    Returns every replica's outputs of every step, concatenated, as the real one does."""
    calls.append(("predict", _compiled_steps_per_execution(self), steps))
    per_replica, execution = _steps_per_replica(self, steps)
    stages = _pipeline_stages(self)
    if stages > 1:
        if execution % stages:
            raise tf.errors.FailedPreconditionError(
                None, None, f"The pipeline depth of the pipeline must be a multiple of {stages}, but it is {execution}."
            )
        if execution < stages:
            raise tf.errors.FailedPreconditionError(
                None, None, f"The pipeline depth of the pipeline must be at least {stages}, but it is {execution}."
            )
    total = per_replica * _replication_factor(self)
    return _ORIGINAL_FIT["predict"](self, x, batch_size=batch_size, verbose=verbose, steps=total, **kwargs)


_EXTENSIONS = {
    "set_gradient_accumulation_options": set_gradient_accumulation_options,
    "set_pipelining_options": set_pipelining_options,
    "set_pipeline_stage_assignment": set_pipeline_stage_assignment,
}


def install() -> None:
    if "fit" in _ORIGINAL_FIT:
        return
    _ORIGINAL_FIT["fit"] = keras.Model.fit
    _ORIGINAL_FIT["predict"] = keras.Model.predict
    keras.Model.fit = fit
    keras.Model.predict = predict
    for name, method in _EXTENSIONS.items():
        setattr(keras.Model, name, method)


def remove() -> None:
    if "fit" not in _ORIGINAL_FIT:
        return
    keras.Model.fit = _ORIGINAL_FIT.pop("fit")
    keras.Model.predict = _ORIGINAL_FIT.pop("predict")
    for name in _EXTENSIONS:
        if name in keras.Model.__dict__:
            delattr(keras.Model, name)
