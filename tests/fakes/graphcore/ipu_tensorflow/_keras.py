"""The fake IPU Keras extensions (graphcore/keras ``keras/ipu/extensions``), patched onto
``keras.Model`` while an IPUStrategy exists: the option setters with the real argument checks and
messages, and ``fit`` refusing what IPU Keras refuses before it compiles (a pipelined model without
gradient accumulation; ``steps_per_execution`` not a multiple of the gradient accumulation).
Every call is appended to ``calls``. The fake trains with Keras on the CPU, one weight update per
micro-batch: it checks configurations, it does not emulate accumulation."""

from __future__ import annotations

from typing import Any

import keras

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


def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
    state = _state(self)
    steps = (
        int(self.steps_per_execution)
        if not hasattr(self.steps_per_execution, "numpy")
        else int(self.steps_per_execution.numpy())
    )
    pipelined = state["assignment"] is not None and len(set(state["assignment"])) > 1
    calls.append(("fit", steps, kwargs.get("steps_per_epoch")))
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


_EXTENSIONS = {
    "set_gradient_accumulation_options": set_gradient_accumulation_options,
    "set_pipelining_options": set_pipelining_options,
    "set_pipeline_stage_assignment": set_pipeline_stage_assignment,
}


def install() -> None:
    if "fit" in _ORIGINAL_FIT:
        return
    _ORIGINAL_FIT["fit"] = keras.Model.fit
    keras.Model.fit = fit
    for name, method in _EXTENSIONS.items():
        setattr(keras.Model, name, method)


def remove() -> None:
    if "fit" not in _ORIGINAL_FIT:
        return
    keras.Model.fit = _ORIGINAL_FIT.pop("fit")
    for name in _EXTENSIONS:
        if name in keras.Model.__dict__:
            delattr(keras.Model, name)
