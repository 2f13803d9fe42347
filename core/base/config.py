"""The run configuration: every option a run takes, validated before any device is touched."""

from __future__ import annotations

import json
import re
import typing
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from core.base.epochs import ALLOWED_EPOCH_DEFINITIONS, DEFAULT_EPOCH_DEFINITION, EpochDefinition
from core.base.errors import ConfigError, ConfigErrors, did_you_mean
from core.base.files import parse_json
from core.base.precision import Precision


class Framework(str, Enum):
    torch = "torch"
    tensorflow = "tensorflow"


#: What a value of a plugin's or LoadGen's option is in words, as pydantic's four errors for the
#: union's members would otherwise say it, once per member.
OPTION_VALUE_TYPES = "a boolean, a number or text"
_JSON_KINDS = {type(None): "null", list: "a list", tuple: "a list", dict: "an object"}


def _option_value(value: Any) -> Any:
    # Before the union's check: a list, an object or null is refused once, at the option's own name
    # (workload_options.layers), not by each member of the union at a name of its own (layers.bool).
    if not isinstance(value, (bool, int, float, str)):
        kind = _JSON_KINDS.get(type(value), type(value).__name__)
        raise ValueError(f"{OPTION_VALUE_TYPES} is required ({kind} is none of them)")
    return value


def _option_names(options: dict[str, Any]) -> dict[str, Any]:
    if "" in options:
        raise ValueError("each option needs a name (NAME=VALUE); one has an empty name")
    return options


OptionValue = Annotated[bool | int | float | str, BeforeValidator(_option_value)]
#: Options by name (a plugin's, LoadGen's): each name given, each value a boolean, number or text.
Options = Annotated[dict[str, OptionValue], AfterValidator(_option_names)]

#: what a run does with the model: "train" (forward, backward, optimizer step per update) or
#: "inference" (one forward pass per micro-batch, no gradients, no optimizer)
RunMode = Literal["train", "inference"]

#: how an inference run's queries arrive: "loop" is core's own steady window (micro-batches back to
#: back, any accelerator); the others are MLPerf LoadGen's scenarios (core.running.loadgen)
InferenceScenario = Literal["loop", "offline", "single-stream", "server"]

#: the span a run's energy figures cover: "window" (the steady window alone), "steps" (every step: the
#: first, with its compilation, the warm-up and the window) or "run" (from the start of set-up to the
#: end of the window)
EnergyScope = Literal["window", "steps", "run"]
#: how a TensorFlow run's replicas are placed: "mirrored" (one process, MirroredStrategy), "multi-worker"
#: (one process per replica under torchrun, MultiWorkerMirroredStrategy), "auto" (mirrored on one node,
#: multi-worker over several)
TensorflowStrategy = Literal["auto", "mirrored", "multi-worker"]
Sharding = Literal["none", "fsdp", "fsdp-offload"]
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["gpipe", "1f1b"]
LOADGEN_SCENARIOS = ("offline", "single-stream", "server")


#: ``node_meters``'s default: every available meter of the host's CPU and DRAM (RAPL) read beside the
#: device meter and itemised, not added into energy_joules (docs/concepts.md#node-meters)
AUTO_NODE_METERS = "auto"


def canonical_node_meters(value: Any, sort: bool = False) -> str:
    """``node_meters`` in one spelling: names without spaces, joined by commas ("rapl, bmc" is
    "rapl,bmc"), and with ``sort`` in name order, as a sweep's cell takes them ("bmc,rapl": one set of
    meters, one cell); from Python a list of names is taken too. "auto" alone is the default (the
    host's CPU and DRAM meters read beside, not added); "" or "none" alone reads none (stored as "").
    Raises ValueError saying what is allowed."""
    if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise ValueError(
            f"text is required (got {type(value).__name__}): meter names separated by commas, e.g. 'rapl,bmc'"
        )
    if not value.strip() or value.strip() == "none":
        return ""
    if value.strip() == AUTO_NODE_METERS:
        return AUTO_NODE_METERS
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise ValueError("meter names separated by commas, none of them empty, e.g. 'rapl,bmc'")
    for name in names:
        if name in (AUTO_NODE_METERS, "none"):
            raise ValueError(
                f"names of registered meters, or {name!r} alone ('auto': the host's CPU and DRAM meters read "
                "beside the devices, not added; 'none' or '': no node meter)"
            )
        if names.count(name) > 1:
            raise ValueError(f"each meter once; {name!r} is named {names.count(name)} times")
    return ",".join(sorted(names) if sort else names)


#: metrics whose better values are higher, among those core's evaluations produce ('loss' is lower-better)
HIGHER_IS_BETTER_METRICS = {"top1": True, "loss": False, "perplexity": False}


class TargetConfig(BaseModel):
    """Train to a target quality (docs/to-target.md): real epochs over the training split, evaluated on
    the held-out split every ``evaluate_every_epochs`` epochs (or ``evaluate_every_samples`` samples),
    until an evaluation meets ``value`` or the budget (``max_epochs``, ``max_seconds``) is spent."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    metric: str = Field(
        min_length=1, description="what the target is of: 'top1', 'loss', or a metric the workload's evaluation gives"
    )
    value: float = Field(description="the value to reach: top1 >= value, loss <= value (a workload's own: its rule)")
    evaluate_every_epochs: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description="evaluate on the held-out split every this many epochs (default 1, unless "
        "evaluate_every_samples is set)",
    )
    evaluate_every_samples: int | None = Field(
        default=None, ge=1, le=1 << 40, description="evaluate every this many training samples (every replica's)"
    )
    max_epochs: int | None = Field(
        default=None, ge=1, le=1 << 20, description="budget: stop after this many epochs without reaching the target"
    )
    max_seconds: float | None = Field(
        default=None,
        gt=0.0,
        le=30 * 24 * 3600.0,
        description="budget: stop training within about a second of this many clock seconds without reaching the "
        "target, and evaluate once more",
    )

    @model_validator(mode="after")
    def _check(self) -> TargetConfig:
        if self.max_epochs is None and self.max_seconds is None:
            raise ConfigError(
                "target.max_epochs", None, "a budget: max_epochs, max_seconds or both (a target may never be reached)"
            )
        if self.evaluate_every_epochs is not None and self.evaluate_every_samples is not None:
            raise ConfigError(
                "target.evaluate_every_samples",
                self.evaluate_every_samples,
                f"one interval only: evaluate_every_epochs is {self.evaluate_every_epochs}; unset one of them",
            )
        if self.metric == "top1" and not 0.0 <= self.value <= 1.0:
            raise ConfigError("target.value", self.value, "a top1 target is a fraction from 0 to 1 (0.95 for 95%)")
        if self.metric == "loss" and self.value < 0:
            raise ConfigError("target.value", self.value, "a loss target of 0 or more")
        if self.metric == "perplexity" and self.value < 1:
            raise ConfigError("target.value", self.value, "a perplexity target of 1 or more (exp of the mean loss)")
        return self

    @property
    def epochs_between_evaluations(self) -> int | None:
        """Epochs between evaluations; None where they are counted in samples."""
        if self.evaluate_every_samples is not None:
            return None
        return self.evaluate_every_epochs or 1


class RunConfig(BaseModel):
    """One run. Field names are what the CLI flags, the sweep files and the result use."""

    # Strict: a number field takes a number and a boolean field a boolean, from Python and from JSON
    # alike (no "8" -> 8, 8.0 -> 8 or True -> 1); enums take their values ("bf16"), see docs/concepts.md.
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, strict=True, allow_inf_nan=False)

    workload: str = Field(min_length=1, description="registered workload name, e.g. 'fcnn'")
    mode: RunMode = Field(
        default="train",
        description="'train' (forward, backward and optimizer step per update) or 'inference' (one forward pass "
        "per micro-batch, no gradients)",
    )
    accelerator: str = Field(min_length=1, description="registered accelerator name, e.g. 'cpu'")
    framework: Framework = Field(default=Framework.torch, strict=False, description="the training framework")
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description="samples per device per micro-step; None takes the workload's default",
    )
    gradient_accumulation: int = Field(
        default=1, ge=1, le=1 << 16, description="micro-steps whose gradients are summed into one weight update"
    )
    replicas: int = Field(
        default=1, ge=1, le=1 << 16, description="data-parallel copies of the model, over every node of the run"
    )
    global_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1 << 30,
        description="samples per weight update over all replicas, the micro-batch and accumulation derived from it: "
        "micro_batch_size becomes the largest micro-batch (global / replicas where that is smaller, CARAML's "
        "rule), gradient_accumulation the rest; None: micro-batch x accumulation x replicas as given",
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=1 << 12,
        description="machines the replicas are spread over, replicas / nodes on each (torchrun agents with c10d "
        "rendezvous; under Slurm, srun starts one per node of the allocation)",
    )
    rendezvous: str | None = Field(
        default=None,
        min_length=3,
        description="HOST:PORT of the rendezvous of a multi-node run, the same on every node (outside Slurm, "
        "where each node's `core run` joins it); under Slurm the first node of the allocation, port 29500",
    )
    tensorflow_strategy: TensorflowStrategy = Field(
        default="auto",
        description="framework tensorflow: 'mirrored' (the replicas in one process, MirroredStrategy), "
        "'multi-worker' (one process per replica under torchrun, as PyTorch's, MultiWorkerMirroredStrategy), "
        "'auto' (mirrored on one node, multi-worker over several)",
    )
    devices_per_replica: int = Field(
        default=1,
        ge=1,
        le=1 << 10,
        description="devices one copy of the model spans: pipeline stages x tensor_parallel (on IPUs, pipeline stages)",
    )
    tensor_parallel: int = Field(
        default=1,
        ge=1,
        le=1 << 10,
        description="devices each layer is split over (tensor and sequence parallelism, PyTorch's DTensor); it "
        "divides devices_per_replica, and the rest are pipeline stages",
    )
    sharding: Sharding = Field(
        default="none",
        description="'fsdp': weights, gradients and optimizer state sharded over the replicas (PyTorch's "
        "fully_shard, FSDP2); 'fsdp-offload': the same, kept in host memory between uses; 'none': each replica "
        "holds them whole",
    )
    recompute: Recompute = Field(
        default="none",
        description="activation recomputation: 'selective' (the attention's, as Megatron's), 'full' (each "
        "layer's), 'none'",
    )
    pipeline_schedule: PipelineSchedule | None = Field(
        default=None,
        description="with pipeline stages: 'gpipe' (all forwards, then all backwards) or '1f1b' (one forward, "
        "one backward); the micro-batches are gradient_accumulation's. None: the accelerator's own",
    )
    profile_communication: bool = Field(
        default=False,
        description="training: after the timed window, one more update under PyTorch's profiler, and the share of "
        "it each process spends in collectives (communication_seconds_per_update, communication_fraction)",
    )
    device_iterations: int = Field(
        default=1,
        ge=1,
        le=1 << 16,
        description="weight updates per host call, where the accelerator supports it",
    )
    precision: Precision = Field(
        default=Precision.fp32,
        description="numeric precision policy, by name (core.base.precision: fp32 is true fp32, tf32 allows TF32, "
        "default is the framework's own, bf16 and fp16 autocast, fp16 with loss scaling); each accelerator lists "
        "the ones it runs",
    )
    steps: int = Field(
        default=20,
        ge=1,
        le=1 << 24,
        description="host calls (steps) in the timed window; each makes updates_per_step weight updates "
        "(device_iterations)",
    )
    warmup_steps: int = Field(default=3, ge=0, le=1 << 24, description="untimed steps after the first")
    duration_seconds: float | None = Field(
        default=None,
        gt=0.0,
        le=7 * 24 * 3600.0,
        description="a window of about this duration (CARAML's 30-minute jobs: 1800): as many steps as the "
        "warm-up's pace fits in it, at least `steps`; needs warmup_steps >= 1. None: `steps` alone",
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="seed of the weights and the synthetic data")
    compile: bool = Field(default=False, description="graph-compile the model (torch.compile / XLA)")
    power_meter: str = Field(
        default="auto",
        min_length=1,
        description="'auto' picks the accelerator's meter, 'none' disables energy, or a registered meter name",
    )
    node_meters: str = Field(
        default=AUTO_NODE_METERS,
        description="meters of the host beside the device meter: 'auto' (the default) reads every available meter "
        "of the host's CPU and DRAM (RAPL on a GPU host) over the same span and itemises it, not added into "
        "energy_joules; names, comma-separated (e.g. 'rapl'), add each into energy_joules without counting "
        "anything twice; '' or 'none' reads none (docs/concepts.md#node-meters)",
    )
    energy_scope: EnergyScope = Field(
        default="window",
        description="the span the energy figures cover: 'window' (the steady window), 'steps' (the first step "
        "with its compilation, the warm-up and the window) or 'run' (set-up too, as a meter wrapping the whole "
        "process, such as CARAML's jpwr around Megatron-LM, measures it)",
    )
    power_sample_interval_seconds: float = Field(
        default=0.05, gt=0.0, le=60.0, description="seconds between power readings where a meter samples power"
    )
    power_timeline_points: int = Field(
        default=600,
        ge=0,
        le=100_000,
        description="most spans of sampled power kept in the result (merged pairwise beyond); 0 keeps none",
    )
    threads_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="host compute threads per replica; None lets the accelerator choose",
    )
    data: str = Field(
        default="synthetic",
        min_length=1,
        description="'synthetic' (made on the device), 'synthetic-host' (copied from the host every micro-step) "
        "or the path of a dataset",
    )
    data_format: Literal["auto", "image-folder", "webdataset", "tokens", "tfrecord", "coco", "cityscapes"] = Field(
        default="auto", description="the dataset's format; auto tells it from the path"
    )
    data_workers: int = Field(default=2, ge=0, le=256, description="background loader processes per replica")
    epoch_definition: str = Field(
        default=DEFAULT_EPOCH_DEFINITION,
        min_length=1,
        description="what one epoch is, for the epoch time and energy estimates: 'dataset' (its training split), "
        "'samples:N' (e.g. samples:1281167), 'global-batches:N' (N x samples per update) or 'host-calls:N'",
    )
    weights: str | None = Field(
        default=None,
        min_length=1,
        description="a safetensors file or a PyTorch state dict (torch.save) whose tensors replace the model's "
        "seeded weights; read from disk, never downloaded",
    )
    scenario: InferenceScenario = Field(
        default="loop",
        description="inference only: 'loop' (core's steady window of back-to-back micro-batches) or an MLPerf "
        "LoadGen scenario: 'offline' (throughput), 'single-stream' (per-sample latency), 'server' (latency under "
        "Poisson arrivals)",
    )
    loadgen: Options = Field(
        default_factory=dict,
        description="LoadGen settings for a LoadGen scenario (min_duration_seconds, min_query_count, "
        "server_target_samples_per_second, ...; docs/inference.md)",
    )
    accuracy: bool = Field(
        default=False,
        description="with mode 'inference' and labelled image data (--data FOLDER): top-1 accuracy over the "
        "whole folder, measured after the timed window",
    )
    target: TargetConfig | None = Field(
        default=None,
        description="train to a target quality instead of timing a steady window: metric, value, evaluation "
        "interval and budget (docs/to-target.md); None: the steady window",
    )
    workload_options: Options = Field(
        default_factory=dict, description="workload hyper-parameters, validated by the workload"
    )
    accelerator_options: Options = Field(
        default_factory=dict, description="vendor placement options (e.g. MI250 'mode'), validated by the accelerator"
    )

    @model_validator(mode="before")
    @classmethod
    def _batch_from_global(cls, data: Any) -> Any:
        # Before the fields: the derived micro-batch and accumulation are then checked like given
        # ones. Values of the wrong type are left to the fields' own errors.
        if not isinstance(data, dict) or data.get("global_batch_size") is None:
            return data
        global_batch, replicas, largest = (
            data["global_batch_size"],
            data.get("replicas", 1),
            data.get("micro_batch_size"),
        )
        if not all(_is_count(value) for value in (global_batch, replicas, 1 if largest is None else largest)):
            return data
        micro_batch, accumulation = derive_batch(global_batch, replicas, largest)
        given = data.get("gradient_accumulation")
        if given is not None and given != accumulation:
            raise ConfigError(
                "gradient_accumulation",
                given,
                f"global_batch_size {global_batch} sets it: {accumulation} here (leave it unset)",
            )
        return {**data, "micro_batch_size": micro_batch, "gradient_accumulation": accumulation}

    @model_validator(mode="after")
    def _placement(self) -> RunConfig:
        if self.devices_per_replica % self.tensor_parallel:
            raise ConfigError(
                "tensor_parallel",
                self.tensor_parallel,
                f"a divisor of devices_per_replica {self.devices_per_replica} (the devices of a replica are "
                "pipeline stages x tensor_parallel: raise devices_per_replica to a multiple of it)",
            )
        return self

    @property
    def pipeline_parallel(self) -> int:
        """Pipeline stages of a replica: devices_per_replica / tensor_parallel."""
        return self.devices_per_replica // self.tensor_parallel

    @field_validator("epoch_definition", mode="before")
    @classmethod
    def _epoch_definition(cls, value: Any) -> str:
        # Before the type check, so that `epoch_definition = 1281167` (or true) is told how to
        # write a count, and so the stored text is one spelling (samples:1_281_167 -> samples:1281167).
        if isinstance(value, bool):
            raise ValueError(
                f"text is required (a boolean is not an epoch definition); one of {ALLOWED_EPOCH_DEFINITIONS}"
            )
        if isinstance(value, (int, float)):
            count = int(value) if float(value).is_integer() else None
            hint = f"; for {count} samples write 'samples:{count}'" if count and count > 0 else ""
            raise ValueError(
                f"text is required (a number is not an epoch definition{hint}); one of {ALLOWED_EPOCH_DEFINITIONS}"
            )
        if not isinstance(value, str):
            raise ValueError(f"text is required (got {type(value).__name__}); one of {ALLOWED_EPOCH_DEFINITIONS}")
        return str(EpochDefinition.parse(value))

    @field_validator("node_meters", mode="before")
    @classmethod
    def _node_meters(cls, value: Any) -> str:
        return canonical_node_meters(value)

    @property
    def node_meters_auto(self) -> bool:
        """``node_meters = "auto"``: the host's CPU and DRAM meters read beside the devices, not added."""
        return self.node_meters == AUTO_NODE_METERS

    @property
    def node_meter_names(self) -> tuple[str, ...]:
        """``node_meters``, one name each, as named (empty: none named; "auto" names none, planning
        chooses them)."""
        return tuple(self.node_meters.split(",")) if self.node_meters and not self.node_meters_auto else ()

    @property
    def epoch(self) -> EpochDefinition:
        """``epoch_definition``, parsed."""
        return EpochDefinition.parse(self.epoch_definition)

    @property
    def samples_per_host_call(self) -> int:
        """Samples per call from the host: samples_per_update x device_iterations."""
        return self.samples_per_update * self.device_iterations

    @property
    def tensorflow_multi_worker(self) -> bool:
        """A TensorFlow run as one process per replica (MultiWorkerMirroredStrategy under torchrun)."""
        if self.framework is not Framework.tensorflow:
            return False
        return self.tensorflow_strategy == "multi-worker" or (self.tensorflow_strategy == "auto" and self.nodes > 1)

    @property
    def replicas_per_node(self) -> int:
        """Whole replicas on each node: 0 where one replica spans several nodes."""
        return self.replicas // self.nodes

    @property
    def devices_per_node(self) -> int:
        """The devices each node runs, one process each: its replicas' devices, or its share of a
        replica that spans nodes (check_nodes: a whole number of nodes per replica, alike)."""
        return self.replicas * self.devices_per_replica // self.nodes

    @property
    def samples_per_update(self) -> int:
        """Global samples per weight update: micro-batch x accumulation x replicas."""
        if self.micro_batch_size is None:
            raise ValueError("micro_batch_size is not resolved yet")
        return self.micro_batch_size * self.gradient_accumulation * self.replicas


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def derive_batch(global_batch_size: int, replicas: int, largest_micro_batch: int | None) -> tuple[int, int]:
    """The micro-batch and gradient accumulation that make ``global_batch_size`` over ``replicas``.

    Each replica's share is ``global_batch_size / replicas``; it is one micro-batch where it is no
    larger than ``largest_micro_batch`` (or none is given), else micro-batches of that size,
    accumulated. CARAML's IPU ResNet-50 (resnet50_benchmark.xml) sets ``ipu_mbs`` so: the share
    where the global batch is small, else 16.

    :returns: (micro_batch_size, gradient_accumulation).
    :raises ConfigError: naming global_batch_size where it does not split evenly.
    """
    if global_batch_size % replicas:
        raise ConfigError(
            "global_batch_size",
            global_batch_size,
            f"an equal share for each of the {replicas} replicas: a multiple of {replicas}",
        )
    share = global_batch_size // replicas
    if largest_micro_batch is None or share <= largest_micro_batch:
        return share, 1
    if share % largest_micro_batch:
        raise ConfigError(
            "global_batch_size",
            global_batch_size,
            f"whole micro-batches of micro_batch_size {largest_micro_batch} for each of the {replicas} replicas: "
            f"a multiple of {largest_micro_batch * replicas}, or at most {largest_micro_batch * replicas}",
        )
    return largest_micro_batch, share // largest_micro_batch


_REQUIRED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "string_type": "a string",
}


def _bounds(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """'from 1 to 16777216' for a field with bounds, '' for a field without (or not of ``model``)."""
    if model is None or len(loc) != 1 or loc[0] not in model.model_fields:
        return ""
    bounds: dict[str, Any] = {}
    for rule in model.model_fields[loc[0]].metadata:
        bounds.update(
            {name: getattr(rule, name) for name in ("ge", "gt", "le", "lt") if getattr(rule, name, None) is not None}
        )
    if "ge" in bounds and "le" in bounds:
        return f"from {bounds['ge']} to {bounds['le']}"
    low = f"at least {bounds['ge']}" if "ge" in bounds else f"above {bounds['gt']}" if "gt" in bounds else ""
    high = f"at most {bounds['le']}" if "le" in bounds else f"below {bounds['lt']}" if "lt" in bounds else ""
    return " and ".join(part for part in (low, high) if part)


def _unquoted(text: str, required: str) -> str | None:
    """How to write the value a string spells, where it spells one of the required type ("8" -> "8")."""
    try:
        value = parse_json(text.strip().lower())
    except ValueError:
        return None
    fits = {_REQUIRED["int_type"]: (int,), _REQUIRED["float_type"]: (int, float), _REQUIRED["bool_type"]: (bool,)}
    types = fits.get(required, ())
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return None
    return json.dumps(value)


_SPELLED_INTEGER_BOUND = 1e15


def describe_type_error(error: Any, model: type[BaseModel] | None = None) -> str | None:
    """What a strictly typed field allows, when ``error`` (a pydantic error dict) refused a value of
    the wrong type; None for any other error. Types are strict: see docs/concepts.md."""
    required = _REQUIRED.get(error.get("type"))
    if required is None:
        return None
    value = error.get("input")
    bounds = _bounds(model, tuple(error.get("loc", ())))
    if isinstance(value, bool):
        why = "a boolean is not a number" if required != _REQUIRED["string_type"] else "a boolean is not a string"
    elif isinstance(value, float) and required == _REQUIRED["int_type"]:
        # The integer to write, where it is one a person would type (1e308 is 309 digits long).
        typeable = value.is_integer() and abs(value) < _SPELLED_INTEGER_BOUND
        why = f"a float is not an integer; write {int(value)}" if typeable else "a float is not an integer"
    elif isinstance(value, (int, float)) and required == _REQUIRED["bool_type"]:
        why = "a number is not a boolean"
    elif isinstance(value, str):
        noun = {_REQUIRED["int_type"]: "integer", _REQUIRED["float_type"]: "number"}.get(required, "boolean")
        why = f"a string is not a valid {noun}"
        spelled = _unquoted(value, required)
        if spelled is not None:
            why += f"; write {spelled} without quotes"
    elif required == _REQUIRED["string_type"]:
        why = f"{type(value).__name__} {value!r} is not a string"
    else:
        why = f"got {type(value).__name__}"
    return f"{required} is required ({why})" + (f"; allowed: {bounds}" if bounds else "")


def _given(document: Any) -> dict[str, Any]:
    """The keys and values a model was given (a JSON document is read back), or {}."""
    if isinstance(document, (str, bytes)):
        try:
            document = parse_json(document)
        except ValueError:
            return {}
    return dict(document) if isinstance(document, dict) else {}


def _validator_error(error: Any, model: type[BaseModel], prefix: str) -> ConfigError | None:
    """An error at the model itself (a model validator checking several fields against each other)
    as a ConfigError naming the fields it is about, or None when no field can be told.

    The fields are those the validator named, by raising a ConfigError (``fields=`` for several),
    else the model's fields its message names, else the ones the user gave. The value is each
    field's, as given or by default."""

    def named(field: str) -> str:
        return f"{prefix}.{field}" if prefix and not field.startswith(prefix + ".") else field

    raised = (error.get("ctx") or {}).get("error")
    if isinstance(raised, ConfigError):
        named_fields = tuple(map(named, raised.fields))
        several = named_fields if len(named_fields) > 1 else ()
        return ConfigError(named_fields[0], raised.value, raised.allowed, fields=several)
    allowed = str(error.get("msg", "invalid")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    given = _given(error.get("input"))
    fields = [name for name in model.model_fields if re.search(rf"(?<![\w]){re.escape(name)}(?!\w)", allowed)]
    fields = fields or [name for name in model.model_fields if name in given]
    if not fields:
        return None
    values = {
        name: given[name] if name in given else model.model_fields[name].get_default(call_default_factory=True)
        for name in fields
    }
    if len(fields) == 1:
        return ConfigError(named(fields[0]), values[fields[0]], allowed)
    return ConfigError(named(fields[0]), values, allowed, fields=tuple(map(named, fields)))


#: pydantic's own message for a required field left out
_PYDANTIC_MISSING = "Field required"


def config_errors(
    exc: ValidationError, model: type[BaseModel], *, unknown: str, prefix: str = "", nameless: str = "config"
) -> list[ConfigError]:
    """pydantic's errors as ConfigErrors naming the field, the value and what is allowed: the one
    translator, for runs, sweep files and plugin options alike.

    :param unknown: what an unknown key is called, followed by the model's fields ("unknown option;
        allowed").
    :param prefix: put before each field ("workload_options").
    :param nameless: the field of an error that names none and concerns no field it can tell
        (a model validator's: see :func:`_validator_error`); the prefix where there is one.
    """
    errors = []
    for error in exc.errors():
        if not error.get("loc") and (across := _validator_error(error, model, prefix)) is not None:
            errors.append(across)
            continue
        raised = (error.get("ctx") or {}).get("error")
        if error.get("loc") and isinstance(raised, ConfigError):
            # A nested model's validator (RunConfig.target's) names its own field and value.
            field = f"{prefix}.{raised.field}" if prefix else raised.field
            errors.append(ConfigError(field, raised.value, raised.allowed))
            continue
        where = ".".join(str(part) for part in error.get("loc", ())) or nameless
        value = error.get("input")
        if error.get("type") == "extra_forbidden":
            # The closest known key right after "unknown option", before the list of them all: the
            # keys of the table it is in (a sweep file's [slurm], not the file's own settings).
            table = _model_at(model, tuple(error.get("loc", ("",)))[:-1])
            what, semicolon, rest = unknown.partition(";") if table is model else ("unknown setting", ";", " allowed")
            hint = did_you_mean(str(error.get("loc", ("",))[-1]), table.model_fields)
            allowed = f"{what}{hint}{semicolon}{rest}: {', '.join(table.model_fields) or 'none'}"
        elif error.get("type") == "missing":
            # pydantic's input here is the whole document the field is missing from: not worth quoting.
            value = None
            field_info = model.model_fields.get(str(error.get("loc", ("",))[-1]))
            described = f" ({field_info.description})" if field_info is not None and field_info.description else ""
            # a validator's own "missing" says why the field is required (a scenario's rate)
            allowed = f"required{described}" if error.get("msg") == _PYDANTIC_MISSING else str(error.get("msg"))
        else:
            allowed = describe_type_error(error, model) or str(error.get("msg", "invalid"))
            allowed = allowed.removeprefix("Value error, ")
        located = bool(error.get("loc"))
        field = f"{prefix}.{where}" if prefix and located else prefix or where
        errors.append(ConfigError(field, value, allowed, missing=error.get("type") == "missing"))
    return errors


def _model_at(model: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel]:
    """The model of the table at ``path`` inside ``model`` (a nested model's field, optional or not);
    ``model`` itself where the path leads to none."""
    top = model
    for part in path:
        if isinstance(part, int):
            continue  # an entry of a list of tables
        field = model.model_fields.get(str(part))
        if field is None:
            return top
        inner = [kind for kind in (field.annotation, *typing.get_args(field.annotation)) if isinstance(kind, type)]
        nested = next((kind for kind in inner if issubclass(kind, BaseModel)), None)
        if nested is None:
            return top
        model = nested
    return model


def make_config(**options: Any) -> RunConfig:
    """Build a RunConfig, turning pydantic's errors into ConfigError (field, value, allowed)."""
    try:
        config = RunConfig(**options)
    except ValidationError as exc:
        errors = config_errors(exc, RunConfig, unknown="unknown option; allowed options are")
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
    check_mode_options(config)
    check_nodes(config)
    check_tensorflow_strategy(config)
    return config


def check_tensorflow_strategy(config: RunConfig) -> None:
    """``tensorflow_strategy`` places a TensorFlow run, and only MultiWorkerMirroredStrategy spans nodes."""
    strategy = config.tensorflow_strategy
    if strategy != "auto" and config.framework is not Framework.tensorflow:
        raise ConfigError(
            "tensorflow_strategy",
            strategy,
            f"places framework tensorflow's replicas; with framework {config.framework.value}: auto",
        )
    if strategy == "mirrored" and config.nodes > 1:
        raise ConfigError(
            "tensorflow_strategy",
            strategy,
            f"MirroredStrategy holds its replicas in one process, on one node; with nodes {config.nodes}: "
            "multi-worker or auto",
        )


def check_nodes(config: RunConfig) -> None:
    """The replicas fill whole nodes alike (a replica larger than a node spans whole nodes, the same
    devices on each), and a rendezvous is an endpoint a node can reach."""
    devices = config.replicas * config.devices_per_replica
    if config.replicas < config.nodes and not devices % config.nodes:
        if config.devices_per_replica % (devices // config.nodes):
            raise ConfigError(
                "devices_per_replica",
                config.devices_per_replica,
                f"whole nodes for a replica over several: a multiple of the {devices // config.nodes} devices each "
                f"of the {config.nodes} nodes runs",
            )
    elif config.replicas % config.nodes:
        raise ConfigError(
            "replicas",
            config.replicas,
            f"the same number on every node: a multiple of nodes ({config.nodes})",
        )
    if config.rendezvous is not None:
        host, _, port = config.rendezvous.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("rendezvous", config.rendezvous, "HOST:PORT, with a port from 1 to 65535")
        if config.nodes == 1:
            raise ConfigError("rendezvous", config.rendezvous, "a rendezvous joins several nodes; with nodes 1: none")


def check_mode_options(config: RunConfig) -> None:
    """Refuse options that mean nothing in the run's mode, naming the option (not the mode): the
    mode is what the user meant, the other option is what does not fit it."""
    if (
        config.mode == "inference"
        and config.gradient_accumulation != 1
        and config.global_batch_size is not None
        and config.micro_batch_size is not None
    ):
        # The accumulation was derived from global_batch_size: name what the user gave.
        raise ConfigError(
            "global_batch_size",
            config.global_batch_size,
            f"inference runs one forward pass per micro-batch; allowed with mode 'inference' and micro_batch_size "
            f"{config.micro_batch_size}: at most {config.micro_batch_size * config.replicas} (micro-batch x "
            "replicas)",
        )
    if config.mode == "inference" and config.gradient_accumulation != 1:
        raise ConfigError(
            "gradient_accumulation",
            config.gradient_accumulation,
            "inference runs one forward pass per micro-batch and accumulates no gradients; allowed with mode "
            "'inference': 1 (for more samples per step raise micro_batch_size)",
        )
    if config.scenario != "loop" and config.mode != "inference":
        raise ConfigError(
            "scenario", config.scenario, "a LoadGen scenario drives inference runs; set mode 'inference', or 'loop'"
        )
    if config.loadgen and config.scenario == "loop":
        raise ConfigError(
            "loadgen",
            dict(config.loadgen),
            f"LoadGen settings need a LoadGen scenario ({', '.join(LOADGEN_SCENARIOS)}); scenario is 'loop'",
        )
    if config.scenario in LOADGEN_SCENARIOS and config.energy_scope != "window":
        raise ConfigError(
            "energy_scope",
            config.energy_scope,
            "a LoadGen scenario's energy is LoadGen's run alone, as MLPerf Power measures it; allowed with a "
            "LoadGen scenario: 'window'",
        )
    if config.scenario in LOADGEN_SCENARIOS and config.duration_seconds is not None:
        raise ConfigError(
            "duration_seconds",
            config.duration_seconds,
            "LoadGen's settings decide how long a LoadGen scenario runs (-l min_duration_seconds=...); "
            "allowed with a LoadGen scenario: none",
        )
    if config.duration_seconds is not None and config.warmup_steps == 0:
        raise ConfigError(
            "duration_seconds",
            config.duration_seconds,
            "a window of fixed duration is sized from the warm-up's pace: set warmup_steps to 1 or more, or "
            "leave duration_seconds unset",
        )
    if config.target is not None and config.mode != "train":
        raise ConfigError(
            "target",
            config.target.model_dump(exclude_none=True),
            "a target quality is reached by training; with mode 'inference': none",
        )
    if config.target is not None and config.energy_scope != "window":
        raise ConfigError(
            "energy_scope",
            config.energy_scope,
            "a run to a target measures energy over its clock (first training step to the last evaluation), "
            "as MLPerf Training times it; allowed with a target: 'window' (the default)",
        )
    if config.target is not None and config.duration_seconds is not None:
        raise ConfigError(
            "duration_seconds",
            config.duration_seconds,
            "a run to a target has no steady window; its time budget is target.max_seconds: leave it unset",
        )
    if config.profile_communication and (config.mode != "train" or config.target is not None):
        raise ConfigError(
            "profile_communication",
            True,
            "False outside a training run's steady window (mode 'train', no target): the profiled update follows it",
        )
    if config.accuracy and config.mode != "inference":
        raise ConfigError(
            "accuracy", True, "top-1 accuracy is measured by inference runs; set mode 'inference', or accuracy false"
        )
    if config.accuracy and config.data in ("synthetic", "synthetic-host"):
        raise ConfigError(
            "accuracy",
            True,
            f"needs labelled images (--data FOLDER of class folders); {config.data!r} data has random labels",
        )


def check_duration_fits(duration_seconds: object, timeout_seconds: float | None, whose: str) -> None:
    """A window of fixed duration must end before the run's time limit stops it: the limit also
    holds set-up, the first step (compilation) and the warm-up. ``whose`` names the limit's owner."""
    if timeout_seconds is None or isinstance(duration_seconds, bool):
        return
    if isinstance(duration_seconds, (int, float)) and duration_seconds >= timeout_seconds:
        raise ConfigError(
            "duration_seconds",
            duration_seconds,
            f"less than {whose} timeout_seconds ({timeout_seconds:g} s), which also holds set-up, compilation and "
            "warm-up: raise timeout_seconds or shorten the window",
        )
