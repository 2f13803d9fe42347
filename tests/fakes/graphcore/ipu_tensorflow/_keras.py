"""The fake IPU Keras extensions (graphcore/keras, r2.6/sdk-release-3.3, ``keras/ipu/extensions``),
patched onto ``keras.Model`` while an IPUStrategy or PopDistStrategy exists: the option setters with
the real argument checks and messages; pipeline stage assignments as Sequential and Functional
models hand them out; ``fit`` and ``predict`` reading their step counts as IPU Keras does, over all
of this process's replicas together, and refusing what IPU Keras refuses before it compiles.

Every call is appended to ``calls``; every ``fit`` execution plan to ``executions``. The fake runs
Keras on the CPU, one weight update per micro-batch and every replica's micro-batches one after
the other: it checks configurations and counts, it does not emulate accumulation.

``LossScaleOptimizer`` stands for the SDK's Keras 2.6 class (graphcore/keras
``keras/mixed_precision/loss_scale_optimizer.py``: ``__init__(self, inner_optimizer, dynamic=True,
initial_scale=None, dynamic_growth_steps=None)``) on the Keras 3 the tests run; the fixture puts it
on ``keras.mixed_precision``.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import popdist
import tensorflow as tf

from . import config
from .gradient_accumulation import GradientAccumulationReductionMethod
from .ops.pipelining_ops import RecomputationMode

calls: list[tuple] = []
#: one entry per fit(): the numbers IPU Keras ran it with
executions: list[dict[str, int]] = []
_ORIGINAL_FIT: dict[str, Any] = {}


def _state(model: Any) -> dict[str, Any]:
    state = model.__dict__.get("_fake_ipu_state")
    if state is None:
        state = {"ga": None, "pipeline_ga": None, "assignment": None, "reduction": None, "pipelining_kwargs": {}}
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


# extensions_base.py, _set_pipelining_options_impl: keys of pipelining_kwargs it refuses
_EXPLICIT_ARGS = {
    "gradient_accumulation_count": "gradient_accumulation_steps_per_replica",
    "device_mapping": "device_mapping",
    "accumulate_outfeed": "accumulate_outfeed",
}
_AUTOMATIC_ARGS = (
    "computational_stages",
    "repeat_count",
    "inputs",
    "infeed_queue",
    "outfeed_queue",
    "optimizer_function",
)
_INVALID_ARGS = ("outfeed_loss", "outfeed_mask", "batch_serialization_iterations")


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
    for explicit, alternative in _EXPLICIT_ARGS.items():
        if explicit in pipelining_kwargs:
            raise ValueError(
                f"Found `{explicit}` key in `pipelining_kwargs`. Set the `{alternative}` argument to "
                "`set_pipelining_options` instead."
            )
    for automatic in _AUTOMATIC_ARGS:
        if automatic in pipelining_kwargs:
            raise ValueError(
                f"Found `{automatic}` key in `pipelining_kwargs`. This argument is automatically set by Keras."
            )
    for invalid in _INVALID_ARGS:
        if invalid in pipelining_kwargs:
            raise ValueError(
                f"Found `{invalid}` key in `pipelining_kwargs`. This argument is not compatible with Keras."
            )
    if pipelining_kwargs:
        calls.append(("pipelining_kwargs", dict(pipelining_kwargs)))
    state["pipelining_kwargs"] = dict(pipelining_kwargs)


# --- pipeline stage assignments (pipeline_stage_assignment.py; sequential_/functional_extensions.py) ---


class _LayerPipelineStageAssignment:
    """``SequentialLayerPipelineStageAssignment`` / ``FunctionalLayerPipelineStageAssignment``: a
    layer (invocation) and the stage it runs in (None: unassigned)."""

    def __init__(self, layer: Any, pipeline_stage: int | None = None, functional: bool = False) -> None:
        self._layer = layer
        self.pipeline_stage = pipeline_stage
        self.functional = functional

    @property
    def layer(self) -> Any:
        return self._layer

    @property
    def is_nested_model(self) -> bool:
        return False


def _is_sequential(model: Any) -> bool:
    return isinstance(model, keras.Sequential)


def _post_order(model: Any) -> list[Any]:
    """The layers in execution order, input layers excluded (Keras 3 keeps a functional model's layers
    topologically sorted; a Sequential's are its layers)."""
    return [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]


def get_pipeline_stage_assignment(self: Any) -> list[_LayerPipelineStageAssignment]:
    """A copy of the current assignment, else one unassigned entry per layer in post order."""
    calls.append(("get_pipeline_stage_assignment",))
    assignment = _state(self)["assignment"]
    layers = _post_order(self)
    functional = not _is_sequential(self)
    return [
        _LayerPipelineStageAssignment(layer, None if assignment is None else assignment[i], functional)
        for i, layer in enumerate(layers)
    ]


def _inbound_layers(layer: Any) -> list[Any]:
    """Layers whose outputs ``layer``'s first invocation reads (Keras 3 nodes)."""
    nodes = getattr(layer, "_inbound_nodes", [])
    if not nodes:
        return []
    return [parent.operation for parent in nodes[0].parent_nodes]


def set_pipeline_stage_assignment(self: Any, pipeline_stage_assignment: Any) -> None:
    calls.append(
        (
            "set_pipeline_stage_assignment",
            [getattr(a, "pipeline_stage", a) for a in pipeline_stage_assignment]
            if isinstance(pipeline_stage_assignment, list)
            else pipeline_stage_assignment,
        )
    )
    if not isinstance(pipeline_stage_assignment, list):
        raise ValueError("`pipeline_stage_assignment` needs to be a list.")
    layers = _post_order(self)
    if len(pipeline_stage_assignment) != len(layers):
        raise ValueError(
            f"The length of the provided `pipeline_stage_assignment` ({len(pipeline_stage_assignment)}) does not "
            f"match the number of layers in the graph ({len(layers)}). Each layer needs to be assigned a "
            "pipeline stage (excluding input layers)."
        )
    if _is_sequential(self):
        # sequential_extensions.py: integers or SequentialLayerPipelineStageAssignment
        stages = [a if isinstance(a, int) else a.pipeline_stage for a in pipeline_stage_assignment]
        if not all(isinstance(a, (int, _LayerPipelineStageAssignment)) for a in pipeline_stage_assignment):
            raise ValueError(
                "All elements of `pipeline_stage_assignment` must be instances of "
                "`SequentialLayerPipelineStageAssignment` for layers or  "
                "`SequentialNestedModelPipelineStageAssignment` for nested models."
            )
    else:
        # functional_extensions.py, _get_pipelined_post_order
        stages = []
        for assignment, layer in zip(pipeline_stage_assignment, layers):
            if not isinstance(assignment, _LayerPipelineStageAssignment):
                raise ValueError(
                    f"The pipeline stage assignment for layer {layer.name} in {self.name} must be an instance of "
                    f"`FunctionalLayerPipelineStageAssignment`. Instead the assignment was of type "
                    f"{type(assignment).__name__}."
                )
            if assignment.layer is not layer:
                raise ValueError(
                    f"The order of `pipeline_stage_assignment` does not match the post-order generated from the "
                    f"graph ({assignment.layer.name} != {layer.name})."
                )
            if assignment.pipeline_stage is None:
                raise ValueError(
                    f"Layer {layer.name} with node_index 0 has not been assigned a pipeline stage in "
                    "`pipeline_stage_assignment`."
                )
            stages.append(assignment.pipeline_stage)
        stage_of = {id(layer): stage for layer, stage in zip(layers, stages)}
        for layer, stage in zip(layers, stages):
            if any(stage_of.get(id(parent), 0) > stage for parent in _inbound_layers(layer)):
                raise ValueError(
                    f"Layer {layer.name} in pipeline stage {stage} has a dependency from a pipeline stage which has "
                    "not yet been executed. Layers can only use outputs from current or previous pipeline stages."
                )
    _state(self)["assignment"] = list(stages)


def _compiled_steps_per_execution(model: Any) -> int:
    value = model.steps_per_execution
    return int(value.numpy()) if hasattr(value, "numpy") else int(value)


def _pipeline_stages(model: Any) -> int:
    """``_get_shard_count`` (extensions_base.py): the highest stage assigned + 1, else 1."""
    assignment = _state(model)["assignment"]
    return max(assignment) + 1 if assignment is not None and len(set(assignment)) > 1 else 1


def _replication_factor(model: Any) -> int:
    """``_get_replication_factor`` (extensions_base.py): this process's IPUs (``_get_num_ipus``: the
    device's IPUs, "for all instances combined", divided by ``popdist.getNumInstances()``) over the
    shard count rounded up to a power of two."""
    if not config.configured or not (config.configured[-1].auto_select_ipus or config.configured[-1].select_ipus):
        raise ValueError(f"{type(model).__name__} can only be used on an IPU device.")
    num_ipus = config.ipus_of_configured_device() // popdist.getNumInstances()
    shards = _pipeline_stages(model)
    rounded = 2 ** math.ceil(math.log2(shards))
    if shards > num_ipus:
        raise ValueError(
            f"Current device has {num_ipus} IPUs attached, however the current model requires a multiple of "
            f"{rounded} IPUs."
        )
    return num_ipus // rounded


def _steps_per_replica(model: Any, steps: Any) -> tuple[int, int, int]:
    """(replicas, steps per replica, steps per execution) as ``IPUDataHandler`` infers and validates them
    (data_adapter.py: ``_infer_steps`` divides the steps asked for by the replication factor;
    ``_truncate_execution_to_epoch`` caps ``steps_per_execution`` at that; ``_validate_data_handler``
    refuses 0 steps and a per-replica count it does not divide)."""
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
    return replicas, per_replica, execution


def _gradient_accumulation(model: Any, steps_per_execution: int) -> int:
    """``_verify_and_get_gradient_accumulation_steps_per_replica`` (extensions_base.py)."""
    state = _state(model)
    mode = ""
    if _pipeline_stages(model) > 1:
        mode = "pipelined "
        if state["pipeline_ga"] is None:
            raise ValueError(
                "The model which you are attempting to train is pipelined, however "
                "`gradient_accumulation_steps_per_replica` has not been set through `set_pipelining_options()`. "
                "You need to set this value as pipelined models will perform gradient accumulation when training."
            )
        accumulation = state["pipeline_ga"]
    else:
        if state["ga"] is None:
            return 1
        accumulation = state["ga"]
    if steps_per_execution % accumulation:
        raise RuntimeError(
            f"The {mode}model has been configured to use gradient accumulation for training, however the current "
            f"`steps_per_execution` value (set to {steps_per_execution}) is not divisible by "
            f"`gradient_accumulation_steps_per_replica` ({accumulation}). You need to adjust either "
            "`steps_per_execution` or`gradient_accumulation_steps_per_replica` to make sure that "
            "`steps_per_execution` is divisible by `gradient_accumulation_steps_per_replica`."
        )
    return accumulation


def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``ExtensionsBase._fit_delegate``: the data handler's steps, then ``_log_optimizer_batch_size``
    verifies the compiled ``steps_per_execution`` against the accumulation, then each epoch verifies
    the truncated one and runs ``steps_per_execution // accumulation`` weight updates per execution
    (``pipeline_iterations``); a pipeline refuses a recomputation mode that is not a
    ``RecomputationMode`` (pipelining_ops.py, ``pipeline``)."""
    calls.append(("fit", _compiled_steps_per_execution(self), kwargs.get("steps_per_epoch")))
    replicas, per_replica, execution = _steps_per_replica(self, kwargs.get("steps_per_epoch"))
    _gradient_accumulation(self, _compiled_steps_per_execution(self))
    accumulation = _gradient_accumulation(self, execution)
    if _pipeline_stages(self) > 1:
        mode = _state(self)["pipelining_kwargs"].get("recomputation_mode")
        if mode is not None and not isinstance(mode, RecomputationMode):
            raise TypeError("The given recomputation_mode is not a member of the RecomputationMode enumeration.")
    executions.append(
        {
            "replicas": replicas,
            "micro_batches_per_replica": per_replica,
            "steps_per_execution": execution,
            "executions": per_replica // execution,
            "weight_updates_per_execution": execution // accumulation,
            "weight_updates_per_replica": per_replica // accumulation,
            "micro_batches": per_replica * replicas,
        }
    )
    # The CPU runs every replica's micro-batches of the epoch, one weight update each.
    kwargs["steps_per_epoch"] = per_replica * replicas
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
    replicas, per_replica, execution = _steps_per_replica(self, steps)
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
    total = per_replica * replicas
    return _ORIGINAL_FIT["predict"](self, x, batch_size=batch_size, verbose=verbose, steps=total, **kwargs)


class LossScaleOptimizer(keras.mixed_precision.LossScaleOptimizer):
    """Keras 2.6's signature over Keras 3's class (which compile() recognises): records the arguments.
    Keras 3 always scales dynamically; the fake starts at the static scale asked for and does not
    emulate keeping it."""

    def __init__(
        self,
        inner_optimizer: Any,
        dynamic: bool = True,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
    ) -> None:
        calls.append(("LossScaleOptimizer", dynamic, initial_scale))
        if not isinstance(dynamic, bool):
            raise TypeError(f'"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, but got: {dynamic!r}')
        if not dynamic and initial_scale is None:
            raise ValueError('"initial_scale" must be specified if "dynamic" is False')
        if not dynamic and dynamic_growth_steps is not None:
            raise ValueError(
                f'"dynamic_growth_steps" must be None if "dynamic" is False, but got: {dynamic_growth_steps}'
            )
        super().__init__(
            inner_optimizer,
            initial_scale=initial_scale if initial_scale is not None else 2.0**15,
            dynamic_growth_steps=dynamic_growth_steps or 2000,
        )
        self.dynamic = dynamic


_EXTENSIONS = {
    "set_gradient_accumulation_options": set_gradient_accumulation_options,
    "set_pipelining_options": set_pipelining_options,
    "set_pipeline_stage_assignment": set_pipeline_stage_assignment,
    "get_pipeline_stage_assignment": get_pipeline_stage_assignment,
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
    executions.clear()
    if "fit" not in _ORIGINAL_FIT:
        return
    keras.Model.fit = _ORIGINAL_FIT.pop("fit")
    keras.Model.predict = _ORIGINAL_FIT.pop("predict")
    for name in _EXTENSIONS:
        if name in keras.Model.__dict__:
            delattr(keras.Model, name)
