"""A fake of PopTorch (Poplar SDK 3.3, graphcore/poptorch ``python/``) that runs on the CPU.

Mirrors what the Graphcore plugin touches, by the real names:

- ``Options`` with the real setters and the real option keys behind them (``replication_factor``,
  ``device_iterations``, ``auto_round_num_ipus``, ``random_seed``, ``use_model``; ``Training.
  gradient_accumulation``; ``Distributed``; PopART's ``cachePath``/``enableEngineCaching``), read
  back as attributes as on the real ``OptionsDict``; frozen once a model or DataLoader uses them
  ("Can't modify frozen Options"); ``randomSeed`` seeds torch as the real one does. Every setter
  call is also appended to ``Options.calls`` so tests can compare configurations.
- ``BeginBlock`` / ``Block`` (a forward pre-hook, refused twice on one module),
  ``PipelinedExecution`` / ``ShardedExecution`` / ``AutoStage``, ``identity_loss``.
- ``trainingModel`` / ``inferenceModel`` returning a ``PoplarExecutor`` with ``compile``,
  ``isCompiled``, ``copyWeightsToHost``, ``destroy``, ``detachFromDevice``. Compilation runs the
  checks PopTorch's compiler makes, with their messages: IPUs rounded to a power of two (or refused
  without ``autoRoundNumIPUs``), at most 64 IPUs per process, gradient accumulation >= pipeline
  stages for pipelined training, device iterations >= stages for pipelined inference, the batch
  dimension a multiple of deviceIterations x replicationFactor x gradientAccumulation, and
  "Failed to acquire N IPU(s)" when the simulated host has too few IPUs (the IPU Model needs none).
- Execution emulates the IPU's arithmetic on the CPU: the combined batch is laid out
  ``[device_iterations, gradient_accumulation, replicas, micro_batch]`` (PopART's input layout),
  each device iteration is one weight update of the mean loss gradient over its micro-batches and
  replicas, and the final micro-batch's loss of each replica comes back (``OutputMode.Final``).
- Weights live on the device apart from the host model (``python/_poplar_executor.py``): written to
  the device when an executable attaches (``_on_device_attach``), trained there, and read back by
  ``copyWeightsToHost`` (or implicitly: ``copyWeightsToHostIfNeeded``, on ``detachFromDevice``,
  ``destroy`` and on reading the wrapped model's parameters). ``trainingModel`` runs a shallow copy
  and turns the model it was given into a ``PoptorchModel``, through which an ``inferenceModel`` of
  that same model copies the trained weights to its own device before each call; an inference model
  of any other module (a submodule included) keeps the weights it attached with. Calling a detached
  model attaches it again. Attaching needs the IPUs free (``fake_hardware.attached``).
- ``DataLoader`` with PopTorch's combined batch size and per-process partitioning.
- ``Error`` / ``RecoverableError`` / ``UnrecoverableError`` from ``poptorch.poptorch_core``.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Dict, List, Optional

import torch

from . import optim, poptorch_core
from .poptorch_core import Error, RecoverableError, UnrecoverableError

__version__ = "3.3.0"


class FakeHardware:
    """The IPUs this simulated host can attach to (0: no hardware, only the IPU Model works)."""

    def __init__(self, ipus: int = 16) -> None:
        self.ipus = ipus
        self.attached: list[int] = []  # IPU counts attached by compiled executables


fake_hardware = FakeHardware()


def createPoptorchError(msg: str) -> Error:
    error = Error(f"'poptorch_py_error': {msg}")
    error.type = "poptorch_py_error"
    error.message = msg
    error.location = ""
    return error


# --- enums (python/enums.py) -------------------------------------------------------------------


class DataLoaderMode(enum.IntEnum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


class OutputMode(enum.IntEnum):
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class ConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


# --- options (python/_options_impl.py, python/options.py) --------------------------------------


class _OptionsDict:
    """Only keys given at construction may be set, with a value of the same type; frozen after use."""

    def __init__(self, **defaults: Any) -> None:
        object.__setattr__(self, "_is_frozen", False)
        object.__setattr__(self, "_values", dict(defaults))

    def set(self, **kwargs: Any) -> None:
        self.checkIsFrozen()
        for option, value in kwargs.items():
            assert option in self._values, f"Invalid option {option}, valid options are {self._values.keys()}"
            assert isinstance(value, type(self._values[option])), (
                f"Unexpected type {type(value)} for option {option}. Expected {type(self._values[option])}"
            )
            self._values[option] = value

    def createOrSet(self, **kwargs: Any) -> None:
        self.checkIsFrozen()
        for option, value in kwargs.items():
            if option in self._values:
                self.set(**{option: value})
            else:
                self._values[option] = value

    def exists(self, option: str) -> bool:
        return option in self._values

    def checkIsFrozen(self) -> None:
        if self._is_frozen:
            raise AttributeError("Can't modify frozen Options")

    def _freeze(self) -> None:
        object.__setattr__(self, "_is_frozen", True)
        for value in self.__dict__.values():
            if isinstance(value, _OptionsDict):
                value._freeze()

    def __getattr__(self, option: str) -> Any:
        values = self.__dict__.get("_values", {})
        if option in values:
            return values[option]
        raise AttributeError(f"Invalid attribute {option}.")

    def __setattr__(self, option: str, value: Any) -> None:
        if option.startswith("_"):
            object.__setattr__(self, option, value)
        else:
            self.set(**{option: value})

    def __deepcopy__(self, memo: dict) -> _OptionsDict:
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            object.__setattr__(clone, key, False if key == "_is_frozen" else copy.deepcopy(value, memo))
        return clone

    def toDict(self) -> dict[str, Any]:
        return dict(self._values)


class _PopartOptions:
    """PopART session options set by name (``opts._Popart.set(key, value)``)."""

    def __init__(self, record: Callable[..., None]) -> None:
        self.options: dict[str, Any] = {}
        self._record = record
        self._is_frozen = False

    def set(self, key: str, value: Any) -> _PopartOptions:
        if self._is_frozen:
            raise AttributeError("Can't modify frozen Options")
        self._record("_Popart.set", key, value)
        self.options[key] = value
        return self


class _TrainingOptions(_OptionsDict):
    def __init__(self, popart: _PopartOptions, record: Callable[..., None]) -> None:
        super().__init__(gradient_accumulation=1, accumulation_and_replication_reduction_type=ReductionType.Mean)
        object.__setattr__(self, "_popart_options", popart)
        object.__setattr__(self, "_record", record)

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        self._record("Training.gradientAccumulation", gradient_accumulation)
        self.set(gradient_accumulation=gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType) -> _TrainingOptions:
        self._record("Training.accumulationAndReplicationReductionType", reduction_type)
        if reduction_type not in (ReductionType.Sum, ReductionType.Mean):
            raise ValueError("accumulationAndReplicationReductionType must be ReductionType.Sum or ReductionType.Mean")
        self.set(accumulation_and_replication_reduction_type=reduction_type)
        return self

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        self._record("Training.setAutomaticLossScaling", enabled)
        self._popart_options.set("automaticLossScalingSettings.enabled", enabled)
        return self


class _PrecisionOptions(_OptionsDict):
    def __init__(self, popart: _PopartOptions, record: Callable[..., None]) -> None:
        super().__init__()
        object.__setattr__(self, "_popart_options", popart)
        object.__setattr__(self, "_record", record)

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        # python/options.py: PopART's enableStochasticRounding.
        self._record("Precision.enableStochasticRounding", enabled)
        self._popart_options.set("enableStochasticRounding", enabled)
        return self

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        self._record("Precision.setPartialsType", dtype)
        if dtype in (torch.float, torch.float32):
            name = "float"
        elif dtype in (torch.half, torch.float16):
            name = "half"
        else:
            raise ValueError("parameter to setPartialsType should be either torch.float or torch.half")
        self._popart_options.set("partialsTypeMatMuls", name)
        self._popart_options.set("convolutionOptions", {"partialsType": name})
        return self


class _DistributedOptions(_OptionsDict):
    def __init__(self, record: Callable[..., None]) -> None:
        super().__init__(num_distributed_processes=1, distributed_process_id=0)
        object.__setattr__(self, "_record", lambda *a: None)
        # Like the real class: Open MPI's variables configure the process at construction.
        self.setEnvVarNames("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
        object.__setattr__(self, "_record", record)

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:
        return self.configureProcessId(
            int(os.environ.get(var_process_id, "0")), int(os.environ.get(var_num_processes, "1"))
        )

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        self._record("Distributed.configureProcessId", process_id, num_processes)
        self.set(distributed_process_id=process_id)
        self.set(num_distributed_processes=num_processes)
        return self

    @property
    def processId(self) -> int:
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:
        return self.num_distributed_processes


class Stage:
    def __init__(self, *block_ids: str) -> None:
        self._blocks = list(block_ids)
        self._stage_id = -1
        self._ipu: int | None = None

    @property
    def blocks(self) -> list[str]:
        return self._blocks

    def ipu(self, ipu: int) -> Stage:
        self._ipu = ipu
        return self


class _IExecutionStrategy:
    def backendOptions(self) -> dict[str, Any]:
        raise NotImplementedError


class PipelinedExecution(_IExecutionStrategy):
    def __init__(self, *args: Any) -> None:
        self.auto_stage = AutoStage.SameAsIpu
        self.stages: list[Stage] = []
        if len(args) == 1 and isinstance(args[0], AutoStage):
            self.auto_stage = args[0]
        else:
            for stage_id, arg in enumerate(args):
                stage = arg if isinstance(arg, Stage) else Stage(arg) if isinstance(arg, str) else Stage(*arg)
                stage._stage_id = stage_id
                self.stages.append(stage)

    def backendOptions(self) -> dict[str, Any]:
        return {"execution_mode": 0}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.auto_stage!r})"


class ShardedExecution(PipelinedExecution):
    def backendOptions(self) -> dict[str, Any]:
        return {"execution_mode": 1}


class Options(_OptionsDict):
    """Every option of a PopTorch run; ``calls`` lists the setters called, in order."""

    def __init__(self) -> None:
        object.__setattr__(self, "calls", [])
        record = self._record
        popart = _PopartOptions(record)
        object.__setattr__(self, "_popart", popart)
        object.__setattr__(self, "_training", _TrainingOptions(popart, record))
        object.__setattr__(self, "_precision", _PrecisionOptions(popart, record))
        object.__setattr__(self, "_distributed", _DistributedOptions(record))
        object.__setattr__(self, "_execution_strategy", PipelinedExecution())
        object.__setattr__(self, "_show_compilation_progress_bar", True)
        super().__init__(
            replication_factor=1,
            input_group_size=1,
            broadcast_buffers=True,
            device_iterations=1,
            log_dir=".",
            auto_round_num_ipus=False,
            output_mode=OutputMode.Default.value,
            output_return_period=1,
            connection_type=ConnectionType.Always.value,
        )
        path = os.environ.get("POPTORCH_CACHE_DIR", "")
        if path:
            self.enableExecutableCaching(path)

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def _freeze(self) -> None:
        super()._freeze()
        self._popart._is_frozen = True

    # Properties of sub-option groups, as on the real class.
    @property
    def Training(self) -> _TrainingOptions:
        return self._training

    @property
    def Precision(self) -> _PrecisionOptions:
        return self._precision

    @property
    def Distributed(self) -> _DistributedOptions:
        return self._distributed

    @property
    def _Popart(self) -> _PopartOptions:
        return self._popart

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:
        self._record("autoRoundNumIPUs", auto_round_num_ipus)
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def deviceIterations(self, device_iterations: int) -> Options:
        self._record("deviceIterations", device_iterations)
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        self._record("replicationFactor", replication_factor)
        self.set(replication_factor=replication_factor)
        return self

    def setExecutionStrategy(self, strategy: _IExecutionStrategy) -> Options:
        self._record("setExecutionStrategy", strategy)
        assert isinstance(strategy, _IExecutionStrategy)
        self.checkIsFrozen()
        object.__setattr__(self, "_execution_strategy", strategy)
        return self

    def enableExecutableCaching(self, path: str | None) -> Options:
        self._record("enableExecutableCaching", path)
        if path is None:
            self._Popart.set("enableEngineCaching", False)
        else:
            self._Popart.set("cachePath", path)
            self._Popart.set("enableEngineCaching", True)
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict[str, float]) -> Options:
        # python/options.py: keys must read "IPU<n>"; stored as {n: proportion} under
        # available_memory_proportion.
        self._record("setAvailableMemoryProportion", dict(available_memory_proportion))
        actual = {}
        for key, proportion in available_memory_proportion.items():
            assert key.startswith("IPU"), (
                'Available memory proportions are expected to be in a dictionary of {"IPU0": 0.5} where the 0 in '
                f"IPU is the index of the IPU. Invalid key: {key}"
            )
            actual[int(key[3:])] = proportion
        self.createOrSet(available_memory_proportion=actual)
        return self

    def useIpuModel(self, use_model: bool) -> Options:
        self._record("useIpuModel", use_model)
        self.createOrSet(use_model=use_model)
        return self

    def useIpuId(self, ipu_id: int) -> Options:
        self._record("useIpuId", ipu_id)
        self.createOrSet(ipu_id=ipu_id)
        return self

    def randomSeed(self, random_seed: int) -> Options:
        self._record("randomSeed", random_seed)
        assert isinstance(random_seed, int)
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

    def outputMode(self, output_mode: OutputMode, output_return_period: int | None = None) -> Options:
        self._record("outputMode", output_mode)
        self.set(output_mode=output_mode.value)
        return self

    def defaultOutputMode(self) -> bool:
        return self.output_mode == OutputMode.Default.value

    def connectionType(self, connection_type: ConnectionType) -> Options:
        self._record("connectionType", connection_type)
        self.set(connection_type=connection_type.value)
        return self

    def enableSyntheticData(self, enabled: bool) -> Options:
        self._record("enableSyntheticData", enabled)
        self._Popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    def clone(self) -> Options:
        return copy.deepcopy(self)


# --- blocks (python/ops.py) --------------------------------------------------------------------


class _StageTracker:
    """Set while the fake compiler traces the model: records the blocks entered, in order, and the
    IPU every module ran on. As ``_BlockHook``'s docstring in python/ops.py has it, "all layers
    called after the hook has run will be run on the specified IPU", until the next block begins;
    before any block, on IPU 0."""

    def __init__(self) -> None:
        self.blocks: list[tuple] = []
        self._auto_id = 0
        self.current_ipu = 0
        self.module_ipus: dict[str, int] = {}  # module path -> the IPU it ran on (the last call's)

    def beginStage(self, user_id: str | None, ipu_id: int | None) -> None:
        self.blocks.append((user_id, ipu_id))
        if ipu_id is not None:
            self.current_ipu = ipu_id

    def nextAutoId(self) -> str:
        self._auto_id += 1
        return str(self._auto_id - 1)

    def resetAutoId(self) -> None:
        self._auto_id = 0


def _refuse_weights_shared_across_ipus(model: torch.nn.Module, module_ipus: dict[str, int]) -> None:
    """PopTorch 3.3's user guide ("Multi-IPU execution strategies"): layers that share weights must be
    placed on the same IPU; Graphcore's GPT-2 and BERT examples move the tied output layer back to
    the embedding's IPU for this. The real compiler's own words are not reproduced here: this fake
    refuses such a model at compilation with a message of its own, naming the weight and the IPUs."""
    ipus_of: dict[int, set[int]] = {}
    names: dict[int, str] = {}
    for name, module in model.named_modules():
        if name not in module_ipus:
            continue  # not run in the forward pass
        for parameter_name, parameter in module.named_parameters(recurse=False):
            ipus_of.setdefault(id(parameter), set()).add(module_ipus[name])
            names.setdefault(id(parameter), f"{name}.{parameter_name}" if name else parameter_name)
    for key, ipus in ipus_of.items():
        if len(ipus) > 1:
            raise poptorch_core.raise_compiler_error(
                f"(fake) weight {names[key]} is used on IPUs {sorted(ipus)}: layers that share weights must be "
                "placed on the same IPU",
                _CPP_COMPILER,
            )


class Block(torch.nn.Module):
    # None outside tracing: on the CPU the class is a no-op, as in PopTorch.
    _stages_manager: _StageTracker | None = None

    @staticmethod
    def useAutoId() -> None:
        if Block._stages_manager is not None:
            Block._stages_manager.resetAutoId()

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        if Block._stages_manager is not None:
            Block._stages_manager.beginStage(user_id, ipu_id)

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        super().__init__()
        self._user_id = user_id
        self._ipu_id = ipu_id

    def __enter__(self) -> None:
        Block.start(self._user_id, self._ipu_id)

    def __exit__(self, *exc: Any) -> None:
        pass


class _BlockHook:
    def __init__(self, user_id: str | None, ipu_id: int | None) -> None:
        self._user_id = user_id
        self._ipu_id = ipu_id

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        if Block._stages_manager is not None:
            if self._user_id is None:
                self._user_id = Block._stages_manager.nextAutoId()
            Block._stages_manager.beginStage(self._user_id, self._ipu_id)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self._user_id}, ipu_id={self._ipu_id})"


def BeginBlock(
    layer_to_call: torch.nn.Module, user_id: str | None = None, ipu_id: int | None = None
) -> torch.nn.Module:
    if not isinstance(layer_to_call, torch.nn.Module):
        raise createPoptorchError("module is not an instance of torch.nn.Module or function.")
    if any(isinstance(hook, _BlockHook) for hook in layer_to_call._forward_pre_hooks.values()):
        raise createPoptorchError("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def removeBlocks(module: torch.nn.Module) -> None:
    for m in module.modules():
        m._forward_pre_hooks = OrderedDict(
            (k, v) for k, v in m._forward_pre_hooks.items() if not isinstance(v, _BlockHook)
        )


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return x.sum()
    if reduction == "mean":
        return x.mean()
    assert reduction == "none", "reduction argument must be one of 'sum', 'mean' or 'none'"
    return x


# --- executor (python/_poplar_executor.py) ------------------------------------------------------

_CPP_COMPILER = "popart_compiler/source/CompilerImpl.cpp"


def _round_up_num_ipus(num_ipus: int) -> int:
    rounded = 1
    while rounded < num_ipus:
        rounded *= 2
    return rounded


class PoplarExecutor:
    def __init__(
        self,
        model: torch.nn.Module,
        options: Options | None,
        training: bool,
        optimizer: torch.optim.Optimizer | None = None,
        user_model: torch.nn.Module | None = None,
    ) -> None:
        if options:
            if not isinstance(options, Options):
                raise createPoptorchError(
                    f"Invalid type: 'options' is of type {type(options)} (Expected poptorch.Options)"
                )
            options._freeze()
            options = options.clone()
        else:
            options = Options()
        # python/_poplar_executor.py: ``self._user_model = user_model or model``; ``self._model = model``
        # (trainingModel passes a shallow copy as ``model`` and the original as ``user_model``).
        self._user_model = user_model or model
        self._model = model
        self._training = training
        self._device_weights: dict[str, torch.Tensor] | None = None
        self._dirty_host_weights = False
        self._host_weights_version = 0
        if training:
            if options.defaultOutputMode():
                options.outputMode(OutputMode.Final)
            if optimizer is None:
                optimizer = torch.optim.SGD(self._user_model.parameters(), lr=0.01)
        else:
            if options.defaultOutputMode():
                options.outputMode(OutputMode.All)
            if options.Training.gradient_accumulation != 1:
                message = (
                    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its "
                    "default value (1) when running a poptorch.inferenceModel()."
                )
                strategy = options._execution_strategy
                if isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution):
                    message += (
                        " Use poptorch.Options().deviceIterations to process a sufficient number of batches "
                        "each run for pipelined execution instead."
                    )
                raise createPoptorchError(message)
            assert optimizer is None, "Optimizer should be None for inference"
        self._options = options
        self._optimizer = optimizer
        self._executable: dict | None = None
        self._is_attached = False
        self.compile_count = 0
        self.execute_count = 0
        if training:
            _wrap_user_model(self)

    @property
    def model(self) -> torch.nn.Module:
        return self._user_model

    @property
    def options(self) -> Options:
        return self._options

    def isCompiled(self) -> bool:
        return bool(self._executable)

    def isAttachedToDevice(self) -> bool:
        return self.isCompiled() and self._is_attached

    def _batch_dims(self) -> int:
        o = self._options
        return o.device_iterations * (o.replication_factor // o.input_group_size) * o.Training.gradient_accumulation

    def _narrow(self, tensor: torch.Tensor) -> torch.Tensor:
        o = self._options
        extra = self._batch_dims()
        size = tensor.size()[0] if tensor.dim() else 1
        assert size % extra == 0, (
            "Invalid batch dimension: In the input %s, the batch dimension (%d) must be a multiple of "
            "Options.deviceIterations(%d) * (Options.replicationFactor(%d) / "
            "Options.inputReplicaGrouping.input_group_size(%d)) * Options.Training.gradientAccumulation(%d) = %d "
            "because it is used to calculate the batch size which will be executed on the device in any given "
            "iteration. For a full explanation see the batching semantics page of the documentation."
        ) % (
            tensor.shape,
            size,
            o.device_iterations,
            o.replication_factor,
            o.input_group_size,
            o.Training.gradient_accumulation,
            extra,
        )
        return tensor.narrow(0, 0, size // extra)

    def compile(self, *args: torch.Tensor) -> None:
        if self._executable is not None:
            return  # "Call to compile() ignored: the executable is already compiled"
        self._compile(args)

    def _compile(self, args: tuple) -> None:
        o = self._options
        narrowed = [self._narrow(a) for a in args]
        tracker = _StageTracker()
        Block._stages_manager = tracker
        # After the block hooks (registered earlier), note where each module runs.
        placements = [
            module.register_forward_pre_hook(
                lambda module, inputs, name=name: tracker.module_ipus.__setitem__(name, tracker.current_ipu)
            )
            for name, module in self._model.named_modules()
        ]
        try:
            with torch.no_grad():
                self._model(*narrowed)
        finally:
            Block._stages_manager = None
            for handle in placements:
                handle.remove()
        _refuse_weights_shared_across_ipus(self._model, tracker.module_ipus)
        ipu_ids = [ipu for _, ipu in tracker.blocks if ipu is not None]
        ipus_per_replica = (max(ipu_ids) + 1) if ipu_ids else 1
        strategy = o._execution_strategy
        if strategy.stages:
            stages = len(strategy.stages)
        elif strategy.auto_stage is AutoStage.AutoIncrement:
            stages = max(1, len(tracker.blocks))
        else:
            stages = len(set(ipu_ids)) if ipu_ids else 1
        num_ipus = ipus_per_replica * o.replication_factor
        rounded = _round_up_num_ipus(num_ipus)
        if rounded != num_ipus:
            common = ", because PopTorch must reserve a power of 2 or maximum of 64 IPUs per process"
            if not o.auto_round_num_ipus:
                raise poptorch_core.raise_compiler_error(
                    f"The model specifies the use of {num_ipus} IPUs, however PopTorch must reserve a minimum of "
                    f"{rounded} in order to allow the model to run{common}. Please reconfigure your model to use a "
                    "different number of IPUs or set poptorch.Options().autoRoundNumIPUs(True).",
                    _CPP_COMPILER,
                )
            num_ipus = rounded
        if num_ipus > 64:
            raise poptorch_core.raise_compiler_error(
                f"Too many IPUs requested ({num_ipus}). Experiments that need more than 64 IPUs require "
                "distributed execution.",
                _CPP_COMPILER,
            )
        if isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution) and stages > 1:
            if self._training:
                total = 2 * stages - 1
                if o.Training.gradient_accumulation < total:
                    raise poptorch_core.raise_compiler_error(
                        f"poptorch.Options().Training.gradientAccumulation must be greater than or equal to the "
                        f"number of pipeline stages ({total}) when using poptorch.PipelinedExecution. Please note "
                        f"that a model with {(total + 1) // 2} pipeline stages in PopTorch will have an additional "
                        f"{(total - 1) // 2} stages when training.",
                        "popart_compiler/source/Compiler.cpp",
                    )
            elif o.device_iterations < stages:
                raise poptorch_core.raise_compiler_error(
                    f"poptorch.Options().deviceIterations must be greater than or equal to the number of pipeline "
                    f"stages ({stages}) when using PopTorch.PipelinedExecution.",
                    "popart_compiler/source/Compiler.cpp",
                )
        use_model = o.exists("use_model") and o.use_model
        if not use_model and fake_hardware.ipus < num_ipus:
            raise poptorch_core.raise_compiler_error(f"Failed to acquire {num_ipus} IPU(s)", _CPP_COMPILER)
        self._executable = {
            "num_ipus": num_ipus,
            "ipus_per_replica": ipus_per_replica,
            "stages": stages,
            "blocks": list(tracker.blocks),
            "module_ipus": dict(tracker.module_ipus),
            "use_model": use_model,
        }
        # ConnectionType.Always: the executable attaches as it compiles, and _on_device_attach writes
        # the host's weights to the device (python/_poplar_executor.py, _compile).
        self._attach()
        self.compile_count += 1

    def _weights(self) -> dict[str, torch.Tensor]:
        # copyWeightsToHost / copyWeightsToDevice: ``{**named_parameters(), **named_buffers()}`` of _model.
        return {**dict(self._model.named_parameters()), **dict(self._model.named_buffers())}

    def _attach(self) -> None:
        assert self._executable is not None
        if not self._executable["use_model"]:
            num_ipus = self._executable["num_ipus"]
            if fake_hardware.ipus - sum(fake_hardware.attached) < num_ipus:
                raise poptorch_core.raise_compiler_error(f"Failed to acquire {num_ipus} IPU(s)", _CPP_COMPILER)
            fake_hardware.attached.append(num_ipus)
        self._is_attached = True
        self.copyWeightsToDevice()  # _on_device_attach

    def _release(self) -> None:
        if self._is_attached and self._executable and not self._executable["use_model"]:
            fake_hardware.attached.remove(self._executable["num_ipus"])
        self._is_attached = False

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """Run the model on the device's weights: the host's are set aside and put back after, so the
        host model keeps what it had until the weights are copied to it."""
        assert self._device_weights is not None
        weights = self._weights()
        host = {name: tensor.detach().clone() for name, tensor in weights.items()}
        with torch.no_grad():
            for name, tensor in weights.items():
                tensor.copy_(self._device_weights[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, tensor in weights.items():
                    self._device_weights[name] = tensor.detach().clone()
                    tensor.copy_(host[name])

    def compilationTime(self) -> timedelta:
        if not self.isCompiled():
            raise createPoptorchError("Please compile the model before obtaining compilation time.")
        return timedelta(0)

    def __call__(self, *args: torch.Tensor) -> Any:
        if not self.isCompiled():
            self._compile(args)
        if not self._is_attached:
            self.attachToDevice()
        if not self._training:
            # python/_poplar_executor.py, __call__: an inference model of a model that a training model
            # wraps reads the trained weights to the host if they changed, and writes them to its device.
            copy_if_needed = getattr(self._user_model, "copyWeightsToHostIfNeeded", None)
            if callable(copy_if_needed):
                copy_if_needed()
                if self._host_weights_version != self._user_model._host_weights_version:
                    self.copyWeightsToDevice()
                    self._host_weights_version = self._user_model._host_weights_version
        with self._on_device():
            outputs = self._execute(args)
        if self._training:
            self._dirty_host_weights = True
        return outputs

    def _execute(self, args: tuple[torch.Tensor, ...]) -> Any:
        o = self._options
        replicas = o.replication_factor
        accumulation = o.Training.gradient_accumulation
        iterations = o.device_iterations
        micro = self._narrow(args[0]).shape[0]

        def split(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.reshape(iterations, accumulation, replicas, micro, *tensor.shape[1:])

        batches = [split(a) for a in args]
        if not self._training:
            return self._infer(batches, iterations, replicas)
        outputs: Any = None
        for d in range(iterations):
            if self._training:
                assert self._optimizer is not None
                self._optimizer.zero_grad()
            last = []
            for a in range(accumulation):
                for r in range(replicas):
                    micro_args = [b[d, a, r] for b in batches]
                    if self._training:
                        loss = self._model(*micro_args)
                        scale = (
                            1.0 / (accumulation * replicas)
                            if (o.Training.accumulation_and_replication_reduction_type == ReductionType.Mean)
                            else 1.0
                        )
                        (loss.float() * scale).backward()
                        if a == accumulation - 1:
                            last.append(loss.detach())
                    else:
                        with torch.no_grad():
                            last.append(self._model(*micro_args))
            if self._training:
                self._optimizer.step()
            outputs = last[0] if len(last) == 1 else torch.stack(last)
        self.execute_count += 1
        return outputs

    def _infer(self, batches: list[torch.Tensor], iterations: int, replicas: int) -> Any:
        """An inference call: every device iteration's forward pass on every replica. The outputs
        come back as the real PoplarExecutor returns them: with ``OutputMode.All`` (inference's
        default) every iteration's, in the input's combined-batch order ``[iterations, replicas,
        micro]`` flattened to one batch dimension; with ``OutputMode.Final`` the last iteration's
        (``python/_poplar_executor.py``, and the batching semantics of ``docs/user_guide/batching.rst``)."""
        per_iteration = []
        for d in range(iterations):
            with torch.no_grad():
                per_iteration.append(torch.cat([self._model(*[b[d, 0, r] for b in batches]) for r in range(replicas)]))
        self.execute_count += 1
        if self._options.output_mode == OutputMode.Final:
            return per_iteration[-1]
        return torch.cat(per_iteration)

    def copyWeightsToHostIfNeeded(self) -> bool:
        if self._dirty_host_weights:
            self.copyWeightsToHost()
            return True
        return False

    def copyWeightsToHost(self) -> None:
        if not self.isCompiled():
            raise createPoptorchError("Model has not been compiled or has been destroyed.")
        self._dirty_host_weights = False
        if self._device_weights is not None:
            with torch.no_grad():
                for name, tensor in self._weights().items():
                    tensor.copy_(self._device_weights[name])
        self._host_weights_version += 1

    def copyWeightsToDevice(self) -> None:
        if not self.isCompiled():
            raise createPoptorchError("Model has not been compiled or has been destroyed.")
        self._dirty_host_weights = False
        self._device_weights = {name: tensor.detach().clone() for name, tensor in self._weights().items()}

    def detachFromDevice(self) -> None:
        if not self.isCompiled():
            raise createPoptorchError("Model has not been compiled or has been destroyed.")
        if not self._is_attached:
            raise createPoptorchError("Device is not attached")
        if self._training:
            self.copyWeightsToHostIfNeeded()  # "Read all the states back before detaching"
        self._release()

    def attachToDevice(self) -> None:
        if not self.isCompiled():
            raise createPoptorchError("Model has not been compiled or has been destroyed.")
        if self._is_attached:
            raise createPoptorchError("Device is already attached")
        self._attach()

    def destroy(self) -> None:
        if not self.isCompiled():
            return
        if self._training:
            self.copyWeightsToHostIfNeeded()
        self._release()
        self._executable = None
        self._device_weights = None
        if self._training:
            _unwrap_user_model(self._user_model)


def _wrap_user_model(executor: PoplarExecutor) -> None:
    """What trainingModel does to the model it was given (python/_poplar_executor.py, PoplarExecutor's
    constructor): its class becomes a ``PoptorchModel`` that reads the trained weights to the host
    before its parameters, buffers or forward are used, and tells an inference model of it which
    version of the weights the host holds (``_host_weights_version``). A weak reference, as there."""
    parent = weakref.ref(executor)
    model = executor._user_model
    original = type(model)

    class PoptorchModel(original):  # type: ignore[valid-type, misc]
        def copyWeightsToHostIfNeeded(self) -> bool:
            p = parent()
            return p.copyWeightsToHostIfNeeded() if p is not None else False

        def __getattribute__(self, name: str) -> Any:
            if name == "_host_weights_version":
                p = parent()
                return None if p is None else p._host_weights_version
            if name in ("_buffers", "_parameters", "forward"):
                object.__getattribute__(self, "copyWeightsToHostIfNeeded")()
            return object.__getattribute__(self, name)

    PoptorchModel.__name__ = f"Poptorch{original.__name__}"
    PoptorchModel._poptorch_original_class = original  # type: ignore[attr-defined]
    model.__class__ = PoptorchModel


def _unwrap_user_model(model: torch.nn.Module) -> None:
    """destroy() of a training model gives the model its own class back (_impl.unwrapModelIfNecessary)."""
    original = getattr(type(model), "_poptorch_original_class", None)
    if original is not None:
        model.__class__ = original


def trainingModel(
    model: torch.nn.Module, options: Options | None = None, optimizer: torch.optim.Optimizer | None = None
) -> PoplarExecutor:
    if isinstance(model, PoplarExecutor):
        model = model._user_model
    # python/__init__.py: the executor runs a shallow copy and wraps the original (user_model).
    return PoplarExecutor(copy.copy(model), options, training=True, optimizer=optimizer, user_model=model)


def inferenceModel(model: torch.nn.Module, options: Options | None = None) -> PoplarExecutor:
    if isinstance(model, PoplarExecutor):
        model = model._user_model
    # python/__init__.py wraps a shallow copy (``PoplarExecutor(model=copy.copy(model), training=False)``):
    # parameters and submodules are shared, but the copy's own ``training`` flag is not, so a
    # ``model.eval()`` after wrapping does not reach it; PopTorch's docs say to call it before.
    return PoplarExecutor(copy.copy(model), options, training=False)


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    return fake_hardware.ipus >= num_ipus


# --- data (python/__init__.py) -----------------------------------------------------------------


class _SubDataset(torch.utils.data.Dataset):
    """Process ``processId``'s contiguous share of the dataset (drop_last=True)."""

    def __init__(self, dataset: Any, opts: Options, step: int) -> None:
        processes = opts.Distributed.numProcesses
        per_process = step * (len(dataset) // (step * processes))
        self._offset = opts.Distributed.processId * per_process
        self._length = min(per_process, len(dataset) - self._offset)
        self._dataset = dataset

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        return self._dataset[index + self._offset]


class DataLoader(torch.utils.data.DataLoader):
    def __init__(
        self,
        options: Options,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool | None = None,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        **kwargs: Any,
    ) -> None:
        assert isinstance(options, Options)
        options._freeze()
        if shuffle is None:
            shuffle = False
        # python/__init__.py: PopTorch does not partition an IterableDataset among processes.
        if isinstance(dataset, torch.utils.data.IterableDataset) and auto_distributed_partitioning:
            assert options.Distributed.numProcesses == 1, (
                "auto_distributed_partitioning not supported for IterableDataset"
            )
        # Async mode reads through an AsynchronousDataAccessor process; the fake reads in this one.
        self.mode = mode
        self.terminated = False
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        groups = options.replication_factor // options.input_group_size
        self._num_batches_to_combine = options.device_iterations * groups * options.Training.gradient_accumulation
        self._combined_batch_size = batch_size * self._num_batches_to_combine
        self._options = options
        if (
            options.Distributed.numProcesses > 1
            and auto_distributed_partitioning
            and not isinstance(dataset, torch.utils.data.IterableDataset)
        ):
            assert not shuffle or options.exists("random_seed"), (
                "When using auto_distributed_partitioning you must set poptorch.Options.randomSeed() to ensure "
                "that tensors are in the same order in all processes."
            )
            dataset = _SubDataset(dataset, options, self._combined_batch_size)
        super().__init__(
            dataset,
            batch_size=self._combined_batch_size,
            shuffle=shuffle,
            num_workers=num_workers,
            drop_last=drop_last,
            persistent_workers=persistent_workers,
            **kwargs,
        )

    @property
    def combinedBatchSize(self) -> int | None:
        return self._combined_batch_size

    def terminate(self) -> None:
        # Stops the AsynchronousDataAccessor's worker process in Async mode; no effect otherwise.
        self.terminated = True

    @property
    def options(self) -> Options:
        return self._options


__all__ = [
    "AutoStage",
    "BeginBlock",
    "Block",
    "ConnectionType",
    "DataLoader",
    "DataLoaderMode",
    "Error",
    "Options",
    "OutputMode",
    "PipelinedExecution",
    "PoplarExecutor",
    "RecoverableError",
    "ReductionType",
    "ShardedExecution",
    "Stage",
    "UnrecoverableError",
    "identity_loss",
    "inferenceModel",
    "ipuHardwareIsAvailable",
    "poptorch_core",
    "trainingModel",
]
