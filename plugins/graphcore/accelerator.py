"""The Graphcore accelerator: IPUs through PopTorch or the IPU build of TensorFlow.

``availability`` only looks for the SDK's Python packages (``importlib.util.find_spec`` and the
installed TensorFlow's version, no import): PopTorch, or TensorFlow built by Graphcore (its version
carries ``+gc``). Whether IPUs are there is asked when a run is planned: through gcipuinfo where
installed, else the PCIe device nodes (``/dev/ipu*``) or an IPU-over-Fabric configuration. Without
IPUs, ``accelerator_options.ipu_model=true`` runs the IPU Model, Poplar's simulator on the host.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.plugin import (
    SYNTHETIC_SOURCES,
    Accelerator,
    Availability,
    ConfigError,
    DeviceRecord,
    Fp16Policy,
    Framework,
    Launcher,
    MemoryBandwidth,
    PipelineLayout,
    Precision,
    PrecisionPolicy,
    RunConfig,
    RunContext,
    Workload,
)

from .peaks import GRAPHCORE_PEAKS, peak
from .pipeline import DEFAULT_SPLIT, SplitChoice, choose_split_points, describe_split
from .placement import IpuPlacement, PoprunProcess, format_command, plan_placement, poprun_command
from .precision import PopTorchFp16Policy

if TYPE_CHECKING:
    from core.plugin import Executor

POPLAR_SDK_INSTRUCTIONS = (
    "PopTorch is not installed: it ships only inside Graphcore's Poplar SDK (3.3 is the last), not on a "
    "package index. Install the SDK, `source <sdk>/enable`, then on Python 3.10 "
    "`pip install 'torch==2.0.1' <sdk>/poptorch-*.whl <sdk>/gcipuinfo-*.whl` (for TensorFlow: "
    "<sdk>/tensorflow-2.6*+gc*.whl and <sdk>/keras-2.6*+gc*.whl); see README 'Graphcore'"
)
NO_IPU_HINT = "no IPU found here (gcipuinfo lists none, no /dev/ipu* device nodes, no IPU-over-Fabric configuration)"

#: what ``core run --dry-run`` shows of an IPU placement: PopTorch reserves a power of two per
#: instance, so the IPUs a run books can exceed the ones it uses
_DRY_RUN_PLACEMENT = (
    "instances",
    "replicas_per_instance",
    "ipus_per_replica",
    "device_iterations",
    "total_ipus",
    "reserved_ipus",
    "samples_per_host_call",
    "placement_notes",
)
#: tensorflow fp16 is Graphcore's 16.32 mixed precision (Keras mixed_float16): tensorflow_settings.py
PRECISIONS = {
    Framework.torch: (Precision.fp32, Precision.fp16),
    Framework.tensorflow: (Precision.fp32, Precision.fp16),
}


class GraphcoreOptions(BaseModel):
    """``accelerator_options`` of the graphcore accelerator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ipu_model: bool = Field(default=False, description="run on the IPU Model (Poplar's simulator on the host CPU)")
    executable_cache_dir: str = Field(
        default="",
        description="load/save compiled executables here (poptorch enableExecutableCaching); "
        "a cached executable makes the first step a load, not a compilation",
    )
    instances: int = Field(
        default=0,
        ge=0,
        le=1 << 12,
        description="host processes (poprun --num-instances); 0: as poprun started this one, else 1",
    )
    auto_round_num_ipus: bool = Field(
        default=True, description="reserve the next power of two of IPUs when the run uses another count"
    )
    pipeline_splits: str = Field(
        default="",
        description="comma-separated module paths where pipeline stages 2.. begin (for PopTorch, names of "
        "model.named_modules(); for TensorFlow, layer names); default: the workload's split points, else "
        "balanced by parameter count",
    )
    layers_per_ipu: str = Field(
        default="",
        description="for workloads of repeated layers (BERT, GPT): how many of them each IPU of a replica holds, "
        "comma-separated as Graphcore's examples spell it, e.g. 0,4,4,4 (the embeddings go with IPU 0)",
    )
    # --- memory and numerics, as Graphcore's examples expose them ---------------------------------
    available_memory_proportion: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="fraction of each IPU's tile memory matmuls and convolutions may use for temporaries "
        "(poptorch Options.setAvailableMemoryProportion; TF availableMemoryProportion); None: Poplar's default",
    )
    partials_type: Literal["float", "half"] | None = Field(
        default=None,
        description="type of matmul/convolution partial sums; None: float for fp32, float for fp16 "
        "(Graphcore's 16.32 mixed precision); half trades accuracy for memory and speed",
    )
    recomputation: bool = Field(
        default=False,
        description="recompute activations in the backward pass instead of keeping them (pipelined: from "
        "each stage's start; saves memory, costs compute)",
    )
    loss_scaling: float | None = Field(
        default=None,
        gt=0.0,
        description="static loss scale for fp16 training; None: automatic loss scaling",
    )
    batch_norm_span: int = Field(
        default=1,
        ge=1,
        le=1 << 12,
        description="replicas of one IPU each over which training gathers batch-norm statistics (the ACES "
        "paper's BN_span, which counts IPUs); must divide replicas; framework tensorflow; 1: each replica its own",
    )


def _tensorflow_is_graphcore_build() -> bool:
    try:
        return "+gc" in importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        return False


def _has_poptorch() -> bool:
    return importlib.util.find_spec("poptorch") is not None


def _gcipuinfo_devices() -> list[dict[str, str]] | None:
    """gcipuinfo's device list, or None where gcipuinfo is not installed or cannot list devices."""
    if importlib.util.find_spec("gcipuinfo") is None:
        return None
    from .meter import import_gcipuinfo, list_devices

    try:
        return list_devices(import_gcipuinfo().gcipuinfo())  # plain dicts, also from SWIG map proxies
    except Exception:  # a library without its driver: fall back to the other probes
        return None


def _ipuof_configured() -> bool:
    """An IPU-over-Fabric (IPU-POD) host: the V-IPU partition is named in the environment or config."""
    if any(os.environ.get(v) for v in ("IPUOF_VIPU_API_PARTITION_ID", "IPUOF_CONFIG_PATH")):
        return True
    return bool(glob.glob(str(Path.home() / ".ipuof.conf.d" / "*.conf")))


def count_ipus() -> int | None:
    """IPUs this host can use: a count, None when there are some but how many is unknown, or 0."""
    devices = _gcipuinfo_devices()
    if devices is not None:
        return len(devices)
    nodes = glob.glob("/dev/ipu[0-9]*")
    if nodes:
        return len(nodes)
    return None if _ipuof_configured() else 0


def resolve_instances(options: GraphcoreOptions, environ: Any = None) -> tuple[int, PoprunProcess | None]:
    """(instances, this process among them): from the option, else from poprun's environment."""
    process = PoprunProcess.from_environment(os.environ if environ is None else environ)
    if options.instances:
        return options.instances, process
    return (process.instances if process is not None else 1), process


class GraphcoreAccelerator(Accelerator):
    name: ClassVar[str] = "graphcore"
    # ``recompute = "full"`` is the IPU's own recomputation (``recomputation``): each pipeline stage's
    # forward recomputed from the activations stashed at its start, PopART's standard recomputation on
    # one IPU. Megatron's "selective" has no PopART counterpart.
    own_recompute_choices: ClassVar[frozenset[str]] = frozenset({"full"})
    description: ClassVar[str] = (
        "Graphcore IPUs through PopTorch / TensorFlow-IPU: replicas, pipelining, "
        "gradient accumulation, device iterations; gcipuinfo power"
    )
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    max_devices_per_replica: ClassVar[int] = 64
    supports_device_iterations: ClassVar[bool] = True
    # poptorch.DataLoader's batch is a host call's samples (combinedBatchSize), drop_last (data.py)
    reads_data_by_host_call: ClassVar[bool] = True
    supports_inference: ClassVar[bool] = True
    options_model: ClassVar[type[BaseModel]] = GraphcoreOptions

    def availability(self) -> Availability:
        if _has_poptorch() or _tensorflow_is_graphcore_build():
            return Availability.yes()
        return Availability.no(POPLAR_SDK_INSTRUCTIONS)

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        # IPUs compute in fp32 and fp16; no bf16, no TF32.
        return PRECISIONS.get(framework, ())

    def precision_policy(self, policy: type[PrecisionPolicy], framework: Framework) -> type[PrecisionPolicy]:
        # PopTorch's fp16 halves the whole model (no fp32 master copy); TensorFlow's is Keras's
        # mixed_float16, core's own policy.
        if framework is Framework.torch and issubclass(policy, Fp16Policy):
            return PopTorchFp16Policy
        return policy

    def max_replicas_for(self, context: RunContext) -> int:
        config, options = context.config, context.accelerator_options_as(GraphcoreOptions)
        ipus = None if options.ipu_model else count_ipus()
        if not ipus:
            # The IPU Model; an IPU-POD whose size only the SDK knows; or no IPU at all, which
            # validate() explains better than "at most 0": the placement rules decide.
            return 1 << 16
        # At least 1: a replica too large for the host is refused by validate(), which says why.
        return max(ipus // config.devices_per_replica, 1)

    def placement(
        self, config: RunConfig, options: GraphcoreOptions, layout: PipelineLayout | None = None
    ) -> IpuPlacement:
        """The validated placement of ``config`` with the accelerator ``options`` a RunContext holds
        (ConfigError naming the rule otherwise); ``layout``, the workload's, says whether a tied
        output layer adds a pipeline stage (PopTorch only: IPU Keras pipelines by its own rules)."""
        instances, _ = resolve_instances(options)
        tied = layout is not None and bool(layout.tied_to_first_stage) and config.framework is Framework.torch
        assert config.micro_batch_size is not None
        return plan_placement(
            micro_batch_size=config.micro_batch_size,
            gradient_accumulation=config.gradient_accumulation,
            replicas=config.replicas,
            ipus_per_replica=config.devices_per_replica,
            device_iterations=config.device_iterations,
            instances=instances,
            training=config.mode == "train",
            auto_round_num_ipus=options.auto_round_num_ipus,
            framework=config.framework.value,
            tied_stages=1 if tied else 0,
        )

    def launcher_for(self, context: RunContext) -> Launcher | None:
        """poprun, for several instances asked for outside one (inside, this process is one of them)."""
        instances, process = resolve_instances(context.accelerator_options_as(GraphcoreOptions))
        if instances > 1 and process is None:
            from .launcher import PoprunLauncher

            return PoprunLauncher()
        return None

    def placement_summary(self, context: RunContext) -> dict[str, Any]:
        placement = self.placement(
            context.config, context.accelerator_options_as(GraphcoreOptions), context.pipeline_layout
        )
        summary = placement.summary()
        shown = {key: summary[key] for key in _DRY_RUN_PLACEMENT}
        if placement.pipelined and context.config.framework is Framework.torch:
            shown["pipeline"] = describe_split(pipeline_split(context, placement), context.pipeline_layout)
        return shown

    def validate_run(self, context: RunContext) -> None:
        config, options = context.config, context.accelerator_options_as(GraphcoreOptions)
        if context.machine is None:
            _check_sdk(config)
        if config.compile:
            raise ConfigError("compile", True, "IPU programs are always compiled by Poplar; leave compile=False")
        if config.scenario != "loop":
            # PopTorch compiles one executable for one host-call shape (device_iterations x replicas x
            # micro-batch); LoadGen's queries come in any size, and each new size would recompile.
            raise ConfigError(
                "scenario",
                config.scenario,
                "an IPU answers fixed-size host calls of one compiled shape, not LoadGen's variable queries; "
                "on graphcore: loop",
            )
        if config.target is not None:
            _check_target(config, options)
        if config.framework is Framework.torch:
            _check_data(config)
            _check_numerics(config, options, context.precision_policy)
            if options.batch_norm_span > 1:
                # PopTorch 3.3 has no batch norm across replicas (its supported operations list no
                # SyncBatchNorm; its Options no replica groups for norms): each replica normalises alone.
                raise ConfigError(
                    "accelerator_options.batch_norm_span",
                    options.batch_norm_span,
                    "PopTorch normalises each replica's micro-batch on its own: 1 (framework tensorflow gathers "
                    "batch-norm statistics over a span of replicas)",
                )
        placement = self.placement(config, options, context.pipeline_layout)
        if placement.pipelined and config.framework is Framework.torch:
            pipeline_split(context, placement)  # an impossible split is refused here, before any build
        if config.framework is Framework.tensorflow:
            from .tensorflow_settings import check_tensorflow_run

            check_tensorflow_run(
                config,
                options,
                placement,
                this_process=context.machine is None,
                layout=context.pipeline_layout,
                policy=context.precision_policy,
            )
        if context.machine is not None:
            _check_on_machine(context, placement)
            return
        _check_instances(config, options, placement)
        if not options.ipu_model:
            _check_ipus_here(config, placement)

    def devices(self) -> list[DeviceRecord]:
        devices = _gcipuinfo_devices()
        if devices is None:
            return [
                DeviceRecord(index=i, name="IPU", kind=self.name, details={"device_node": node})
                for i, node in enumerate(sorted(glob.glob("/dev/ipu[0-9]*")))
            ]
        records = []
        for position, device in enumerate(devices):
            device_id = str(device.get("id", position))
            records.append(
                DeviceRecord(
                    index=int(device_id) if device_id.isdigit() else position,
                    name=f"{device.get('board type', 'IPU')} {device.get('ipu architecture', '')}".strip(),
                    kind=self.name,
                    details={
                        k: device[k]
                        for k in (
                            "id",
                            "board type",
                            "board serial number",
                            "ipu architecture",
                            "board ipu index",
                            "firmware version",
                            "driver version",
                            "numa node",
                            "pci id",
                        )
                        if k in device
                    },
                )
            )
        return records

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        config, options = context.config, context.accelerator_options_as(GraphcoreOptions)
        if options.ipu_model:
            placement = self.placement(config, options)
            return [
                DeviceRecord(index=i, name="IPU Model", kind=self.name, details={"simulator": True})
                for i in range(placement.reserved_ipus_per_instance)
            ]
        # Which IPUs Poplar attaches to is known only once it has (in the first step); the meter finds
        # them then, by process id. Here: as many as the run reserves, in gcipuinfo's order.
        records = self.devices()[: self.placement(config, options).reserved_ipus_per_instance]
        for record in records:
            record.details["selection"] = "listed, not necessarily attached: Poplar picks the IPUs when it attaches"
        return records

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        if device.details.get("simulator"):
            return None  # the IPU Model runs on the host: a hardware peak would say nothing about it
        return peak(device.name, precision)

    def memory_bandwidth(self, device: DeviceRecord) -> MemoryBandwidth | None:
        if device.details.get("simulator"):
            return None
        return GRAPHCORE_PEAKS.memory_bandwidth(device.name)

    def driver_versions(self) -> dict[str, str]:
        versions = {}
        for package in ("poptorch", "tensorflow", "gcipuinfo", "popdist"):
            try:
                versions[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                continue
        return versions

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        config, options = context.config, context.accelerator_options_as(GraphcoreOptions)
        placement = self.placement(config, options, context.pipeline_layout)
        _, poprun = resolve_instances(options)
        if config.framework is Framework.tensorflow:
            from .tensorflow import create_keras_executor

            popdist = _popdist_for_tensorflow(placement) if placement.instances > 1 else None
            return create_keras_executor(
                workload,
                context.workload_options,
                config,
                placement,
                options,
                process=poprun,
                popdist=popdist,
                layout=context.pipeline_layout,
                precision=context.precision_policy,
            )
        return self._poptorch_executor(workload, context, placement, options, poprun)

    def _poptorch_executor(
        self,
        workload: Workload,
        context: RunContext,
        placement: IpuPlacement,
        options: GraphcoreOptions,
        poprun: PoprunProcess | None,
    ) -> Executor:
        config, workload_options = context.config, context.workload_options
        import importlib

        from .executor import PopTorchExecutor, PopTorchInferenceExecutor
        from .options import OptionSettings

        poptorch = importlib.import_module("poptorch")
        popdist = None
        if placement.instances > 1 and importlib.util.find_spec("popdist") is not None:
            popdist = importlib.import_module("popdist")
            importlib.import_module("popdist.poptorch")
            if popdist.isPopdistEnvSet():
                _check_popdist(popdist, placement)
        split = pipeline_split(context, placement, workload) if placement.pipelined else DEFAULT_SPLIT
        settings = OptionSettings(
            seed=config.seed,
            ipu_model=options.ipu_model,
            executable_cache_dir=options.executable_cache_dir or None,
            precision=context.precision_policy,
            process=poprun,
            available_memory_proportion=options.available_memory_proportion,
            partials_type=options.partials_type,
            recomputation=recomputes(config, options),
            loss_scaling=options.loss_scaling,
        )
        details: dict[str, Any] = {
            "ipu_model": options.ipu_model,
            "executable_cache_dir": options.executable_cache_dir or None,
            "instance_index": poprun.instance_index if poprun else 0,
        }
        if placement.instances > 1:
            details["poprun_command"] = format_command(poprun_command(placement, ["<command>"]))
        executor = PopTorchInferenceExecutor if config.mode == "inference" else PopTorchExecutor
        return executor(
            workload.build_torch(workload_options, config.seed),
            config,
            placement,
            settings,
            poptorch=poptorch,
            popdist=popdist,
            split=split,
            layout=context.pipeline_layout,
            details=details,
        )


def _check_sdk(config: RunConfig) -> None:
    """The framework's IPU build is installed here (a machine's profile is planned without it)."""
    if config.framework is Framework.torch and not _has_poptorch():
        raise ConfigError("framework", "torch", POPLAR_SDK_INSTRUCTIONS)
    if config.framework is Framework.tensorflow and not _tensorflow_is_graphcore_build():
        raise ConfigError(
            "framework",
            "tensorflow",
            "needs the IPU build of TensorFlow from the Poplar SDK (its version has '+gc'): "
            "pip install <sdk>/tensorflow-2.6*+gc*.whl <sdk>/keras-2.6*+gc*.whl",
        )


def _check_ipus_here(config: RunConfig, placement: IpuPlacement) -> None:
    ipus = count_ipus()
    if ipus == 0:
        raise ConfigError(
            "accelerator_options.ipu_model",
            False,
            f"{NO_IPU_HINT}; set ipu_model=true to run on the IPU Model simulator",
        )
    if ipus is not None and placement.reserved_ipus > ipus:
        raise ConfigError(
            "replicas",
            config.replicas,
            f"the run reserves {placement.reserved_ipus} IPUs ({placement.total_ipus} used); this host sees {ipus}",
        )


def _check_on_machine(context: RunContext, placement: IpuPlacement) -> None:
    """The placement rules against a described IPU-POD: its IPUs, and its NUMA nodes for poprun."""
    machine = context.machine
    assert machine is not None
    if placement.reserved_ipus > machine.devices:
        raise ConfigError(
            "replicas",
            context.config.replicas,
            f"the run reserves {placement.reserved_ipus} IPUs ({placement.total_ipus} used); "
            f"{machine.name!r} has {machine.devices}",
        )
    if machine.numa_nodes is not None and placement.instances > machine.numa_nodes:
        # ACES (section 3.1, Table 1): 16 instances on a POD16 with 8 NUMA nodes ran slower than 8,
        # "the processes swap among the nodes, overwhelming the host server".
        context.warn(
            f"{placement.instances} poprun instances on {machine.name!r}, which has {machine.numa_nodes} NUMA nodes: "
            "more instances than NUMA nodes made the ACES paper's IPU-POD16 slower (Table 1); "
            f"consider accelerator_options.instances={machine.numa_nodes}"
        )


def _check_instances(config: RunConfig, options: GraphcoreOptions, placement: IpuPlacement) -> None:
    """Several instances: core starts them with poprun, or this process is one poprun started."""
    instances, process = resolve_instances(options)
    if process is None:
        if instances > 1 and shutil.which("poprun") is None:
            raise ConfigError(
                "accelerator_options.instances",
                instances,
                "several instances are started by poprun, which is not on PATH here (it comes with the Poplar "
                "SDK: source <sdk>/enable.sh); or start them yourself: "
                + format_command(poprun_command(placement, _this_command())),
            )
        return
    if instances != process.instances:
        raise ConfigError(
            "accelerator_options.instances",
            instances,
            f"this process is one of {process.instances} started together; {instances} instances need one process "
            "each, started by poprun: " + format_command(poprun_command(placement, _this_command())),
        )


def _this_command() -> list[str]:
    """How this process was started, for the poprun command line a refusal suggests."""
    argv = list(sys.argv) or ["<command>"]
    if Path(argv[0]).name == "core":
        return ["core", *argv[1:]]
    return ["python3", *argv]


def _popdist_for_tensorflow(placement: IpuPlacement) -> Any:
    """PopDist with its TensorFlow module, for an instance poprun started: PopDistStrategy and
    ``popdist.tensorflow.set_ipu_config`` read poprun's PopDist variables, so they must be there."""
    import importlib

    popdist = importlib.import_module("popdist")
    importlib.import_module("popdist.tensorflow")
    if not popdist.isPopdistEnvSet():
        raise ConfigError(
            "accelerator_options.instances",
            placement.instances,
            "TensorFlow instances share their replicas through PopDist, whose variables only poprun sets: "
            "start them with poprun (core does, outside one), or 1",
        )
    _check_popdist(popdist, placement)
    return popdist


def _check_popdist(popdist: Any, placement: IpuPlacement) -> None:
    """poprun's own numbers must be the run's (poprun overrides what the application asks for)."""
    checks = [
        ("replicas", popdist.getNumTotalReplicas(), placement.replicas, "--num-replicas"),
        ("devices_per_replica", popdist.getNumIpusPerReplica(), placement.ipus_per_replica, "--ipus-per-replica"),
        ("accelerator_options.instances", popdist.getNumInstances(), placement.instances, "--num-instances"),
    ]
    for field, launched, asked, flag in checks:
        if launched != asked:
            raise ConfigError(field, asked, f"poprun was started with {flag} {launched}; run with the same value")


def pipeline_split(context: RunContext, placement: IpuPlacement, workload: Workload | None = None) -> SplitChoice:
    """Where a replica's pipeline stages begin: the options, else the workload's published split,
    else balanced; checked against the workload's blocks (ConfigError naming the valid ones).

    A workload written against core 0.2 may name split points with ``pipeline_split_points(options,
    stages)`` instead of ``pipeline_layout``; that still works, with a DeprecationWarning."""
    options = context.accelerator_options_as(GraphcoreOptions)
    stages = placement.ipus_per_replica
    choice = choose_split_points(context.pipeline_layout, stages, options.pipeline_splits, options.layers_per_ipu)
    named = getattr(workload, "pipeline_split_points", None)
    if choice.split_points is None and context.pipeline_layout is None and callable(named):
        warnings.warn(
            f"{type(workload).__name__}.pipeline_split_points() is deprecated and will be removed in core 0.4; "
            "declare Workload.pipeline_layout() instead (core.plugin.PipelineLayout)",
            DeprecationWarning,
            stacklevel=2,
        )
        points = tuple(named(context.workload_options, stages) or ())
        if points:
            choice = SplitChoice(points, f"{type(workload).__name__}.pipeline_split_points()")
    return choice


def recomputes(config: RunConfig, options: GraphcoreOptions) -> bool:
    """The IPU's recomputation: its own option, or core's ``recompute = "full"``, which means the same."""
    return options.recomputation or config.recompute == "full"


def _check_numerics(config: RunConfig, options: GraphcoreOptions, policy: type[PrecisionPolicy]) -> None:
    """PopTorch options that mean nothing for this run are refused rather than silently ignored
    (the IPU TensorFlow path's: tensorflow_settings.ipu_keras_settings)."""
    if options.loss_scaling is not None and not (policy.scales_loss and config.mode == "train"):
        raise ConfigError(
            "accelerator_options.loss_scaling",
            options.loss_scaling,
            f"fp16 training only (loss scaling keeps fp16 gradients from underflowing); this run is "
            f"{config.precision.value} {config.mode}: leave it unset",
        )
    if recomputes(config, options) and config.mode != "train":
        field, value = (
            ("recompute", config.recompute)
            if config.recompute != "none"
            else ("accelerator_options.recomputation", True)
        )
        raise ConfigError(
            field, value, "training only: it recomputes activations for the backward pass, which inference does not run"
        )


def _check_data(config: RunConfig) -> None:
    """A dataset PopTorch can feed, refused before anything compiles where it cannot (the IPU
    TensorFlow path's are checked by tensorflow_settings.check_tensorflow_data)."""
    if config.data in SYNTHETIC_SOURCES:
        return
    from .data import IPU_TORCH_FORMATS, data_format

    found = data_format(config)
    if found not in IPU_TORCH_FORMATS:
        raise ConfigError(
            "data",
            config.data,
            f"a {found} dataset has samples of different shapes and PopTorch compiles one shape per input; "
            f"on IPUs: {', '.join(IPU_TORCH_FORMATS)} or {', '.join(SYNTHETIC_SOURCES)}",
        )


def _check_target(config: RunConfig, options: GraphcoreOptions) -> None:
    """What a run to a target (docs/to-target.md) can be on IPUs: PopTorch, reading the workload's own
    splits, one process, a replica per IPU, an update per host call. Everything else is refused here,
    naming the field, rather than failing once the IPUs are compiled for."""
    if config.framework is not Framework.torch:
        raise ConfigError(
            "framework",
            config.framework.value,
            "a run to a target on graphcore is PopTorch's (torch): the IPU Keras executor does not evaluate "
            "a held-out split yet",
        )
    if config.data not in SYNTHETIC_SOURCES:
        raise ConfigError(
            "data",
            config.data,
            "on graphcore a run to a target reads the workload's own training and held-out splits: "
            + ", ".join(SYNTHETIC_SOURCES)
            + " (image folders split into train/ and val/ are read by the CPU and GPU executors)",
        )
    instances, _ = resolve_instances(options)
    if instances > 1:
        raise ConfigError(
            "accelerator_options.instances",
            instances,
            "1 for a run to a target: poprun's instances would each evaluate a share of the held-out split with "
            "no way to add their counts before the next update",
        )
    if config.devices_per_replica > 1:
        raise ConfigError(
            "devices_per_replica",
            config.devices_per_replica,
            "1 for a run to a target on graphcore: the evaluation's inference model is not pipelined yet",
        )
    if config.device_iterations > 1:
        raise ConfigError(
            "device_iterations",
            config.device_iterations,
            "1 for a run to a target: it evaluates between weight updates, and a host call of several device "
            "iterations would run past an epoch's end or an evaluation",
        )
