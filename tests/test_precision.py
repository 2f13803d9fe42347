"""Precision policies: every precision an accelerator lists computes what its policy claims; a
listed name without a policy is refused while planning (it would run as fp32 under another
name); a plugin adds a precision with one class and one registration, and it runs end to end."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import core
from core import ConfigError, Framework, Precision, hookimpl, make_config
from core.base.precision import BUILTIN_POLICIES, policy_for, policy_in_force
from core.cli import main
from core.contract.manager import PluginFault, PluginManager, PluginState
from core.plugin import Accelerator, Bf16Policy, Fp16Policy, Fp32Policy, PrecisionPolicy
from core.running.planning import plan_run
from core.testing import registered_plugins
from core.workloads.fcnn import FcnnOptions, bytes_per_sample
from core_plugins.cpu.accelerator import CpuAccelerator

TINY = {"layers": 1, "hidden_width": 8, "input_width": 8, "output_width": 4, "synthetic_pool_samples": 16}
QUICK = {"steps": 2, "warmup_steps": 0, "power_meter": "none", "micro_batch_size": 4, "workload_options": TINY}

_MATMULS = {
    torch.ops.aten.linear,  # reaches the mode whole under inference_mode, decomposed otherwise
    torch.ops.aten.matmul,
    torch.ops.aten.mm,
    torch.ops.aten.addmm,
    torch.ops.aten.bmm,
    torch.ops.aten.baddbmm,
    torch.ops.aten.convolution,
    torch.ops.aten.convolution_backward,
}


class MatmulDtypes(TorchDispatchMode):
    """Records the dtype of every matmul and convolution (forward and backward) as the kernels
    receive it: below autocast, so what autocast cast is what is seen."""

    def __init__(self, seen: set[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket in _MATMULS:
            self.seen.add(str(args[0].dtype).removeprefix("torch."))
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def _restore_torch_switches() -> Iterator[None]:
    before = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
    torch.set_float32_matmul_precision(before[2])


# --- every listed precision does what its policy claims ----------------------------------------


def _listed() -> list[tuple[str, Framework, str]]:
    """(accelerator, framework, precision) for every precision each built-in accelerator lists."""
    manager = PluginManager()
    manager.load_entry_points()
    listed = []
    for name, registered in sorted(manager.accelerators.items()):
        if not manager.plugins[registered.plugin].builtin:
            continue
        accelerator = registered.item
        for framework in accelerator.frameworks:
            listed += [(name, framework, str(precision)) for precision in accelerator.precisions(framework)]
    return listed


LISTED = _listed()


def test_every_built_in_accelerator_lists_precisions() -> None:
    # Guards the parametrisation below: a plugin that failed to load would silently test nothing.
    assert {name for name, _, _ in LISTED} >= {"amd", "cpu", "graphcore", "nvidia", "xla"}


def _planned_policy(accelerator_name: str, framework: Framework, precision: str) -> type[PrecisionPolicy]:
    """The policy planning hands the run: the registered one, refined by the accelerator."""
    manager = PluginManager()
    manager.load_entry_points()
    policy = manager.precision_policy(precision)
    assert policy is not None, f"{accelerator_name} lists {precision}, which has no registered policy"
    return manager.accelerator(accelerator_name).precision_policy(policy, framework)


def torch_step_dtypes(policy: PrecisionPolicy) -> set[str]:
    """The dtypes of the matmuls and convolutions of one training step of a small convolutional
    network under ``policy``, on the CPU (a vendor's device mapped onto it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3)
    )
    model = policy.convert_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = policy.convert_input(torch.randn(2, 2, 6, 6))
    seen: set[str] = set()
    with MatmulDtypes(seen):
        with policy.forward_context():
            loss = model(inputs).float().square().mean()
        policy.backward(loss)
        policy.optimizer_step(optimizer)
    return seen


@pytest.mark.parametrize(
    "accelerator,framework,precision",
    [case for case in LISTED if case[1] is Framework.torch],
    ids=lambda v: getattr(v, "value", v),
)
def test_each_listed_precision_computes_its_torch_matmuls_in_the_claimed_dtype(
    accelerator: str, framework: Framework, precision: str
) -> None:
    policy = _planned_policy(accelerator, framework, precision)(torch.device("cpu"))
    details = policy.configure_torch()
    assert torch_step_dtypes(policy) == {policy.compute_dtype}
    assert details["precision"] == precision and details["compute_dtype"] == policy.compute_dtype
    # fp32 means true fp32: TF32 only where the policy allows it ("default": where PyTorch does).
    switches = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if precision == "default":
        assert switches == (details["matmul_allow_tf32"], details["cudnn_allow_tf32"])
    else:
        assert switches == (policy.allows_tf32, policy.allows_tf32)
        assert torch.get_float32_matmul_precision() == ("high" if policy.allows_tf32 else "highest")


def keras_step_dtypes(policy: type[PrecisionPolicy]) -> set[str]:
    """The dtypes of the MatMul and Conv2D ops (forward and gradient) of one traced Keras step."""
    import tensorflow as tf
    from tensorflow import keras

    previous = keras.mixed_precision.global_policy()
    previous_tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        policy.configure_keras(tf, keras)
        if policy.compute_dtype == "float32" and policy.name != "default":
            assert tf.config.experimental.tensor_float_32_execution_enabled() is policy.allows_tf32
        conv, dense = keras.layers.Conv2D(4, 3), keras.layers.Dense(3)
        flatten = keras.layers.Flatten()

        def step(x: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.cast(dense(flatten(conv(x))), tf.float32)))
            return tape.gradient(loss, conv.trainable_variables + dense.trainable_variables)

        graph = tf.function(step).get_concrete_function(tf.TensorSpec([2, 6, 6, 2], tf.float32)).graph
        kinds = ("MatMul", "BatchMatMulV2", "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
        return {op.get_attr("T").name for op in graph.get_operations() if op.type in kinds}
    finally:
        keras.mixed_precision.set_global_policy(previous)
        tf.config.experimental.enable_tensor_float_32_execution(previous_tf32)


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    "accelerator,framework,precision",
    [case for case in LISTED if case[1] is Framework.tensorflow],
    ids=lambda v: getattr(v, "value", v),
)
def test_each_listed_precision_computes_its_keras_matmuls_in_the_claimed_dtype(
    accelerator: str, framework: Framework, precision: str
) -> None:
    pytest.importorskip("tensorflow")
    policy = _planned_policy(accelerator, framework, precision)
    assert keras_step_dtypes(policy) == {policy.compute_dtype}


# --- a listed name without a policy cannot run -------------------------------------------------


class Fp8Cpu(CpuAccelerator):
    """The issue's "obvious way": a new name in an accelerator's list, and no policy for it."""

    name = "cpu-fp8"

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return (*super().precisions(framework), Precision("fp8"))


class Fp8Plugin:
    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        register(Fp8Cpu())


def test_a_listed_precision_without_a_policy_is_refused_while_planning() -> None:
    with registered_plugins(Fp8Plugin()) as manager:
        for framework in ("torch", "tensorflow"):
            with pytest.raises(ConfigError) as refused:
                plan_run(manager, "fcnn", "cpu-fp8", {"precision": "fp8", "framework": framework})
            assert refused.value.field == "precision" and refused.value.value == "fp8"
            assert "lists it, but no precision policy of that name is registered" in refused.value.allowed
            assert "supports: fp32, bf16, fp16" in refused.value.allowed  # fp8 is not among them
        with pytest.raises(ConfigError, match="no precision policy"):
            core.run("fcnn", "cpu-fp8", precision="fp8", **QUICK)
        # The accelerator's other precisions still run.
        assert plan_run(manager, "fcnn", "cpu-fp8", {"precision": "bf16"}).precision_policy is Bf16Policy


def test_the_cli_refuses_a_listed_precision_without_a_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "result.json"
    with registered_plugins(Fp8Plugin()):
        code = main(["run", "fcnn", "--accelerator", "cpu-fp8", "--precision", "fp8", "--output", str(output)])
    assert code == 2
    err = capsys.readouterr().err
    assert "invalid precision" in err and "'fp8'" in err and "no precision policy" in err
    assert not output.exists()


def test_a_machine_listing_a_precision_without_a_policy_is_refused_on_a_dry_run(tmp_path: Path) -> None:
    from core.machines import load_machine

    profile = tmp_path / "fp8-box.toml"
    profile.write_text(
        'name = "fp8-box"\ndescription = "a CPU that says fp8"\nsource = "this test"\naccelerator = "cpu-fp8"\n'
        'device = "a CPU"\ndevices = 1\nprecisions = ["fp32", "fp8"]\n',
        encoding="utf-8",
    )
    machine = load_machine(str(profile))
    with registered_plugins(Fp8Plugin()) as manager:
        with pytest.raises(ConfigError, match="no precision policy") as refused:
            plan_run(manager, "fcnn", "cpu-fp8", {"precision": "fp8"}, machine=machine)
        assert "supports: fp32" in refused.value.allowed
        assert (
            plan_run(manager, "fcnn", "cpu-fp8", {"precision": "fp32"}, machine=machine).precision_policy is Fp32Policy
        )


def test_an_unknown_name_lists_the_registered_policies_and_what_the_accelerator_runs() -> None:
    with pytest.raises(ConfigError) as refused:
        core.run("fcnn", "cpu", precision="fp6", **QUICK)
    assert refused.value.field == "precision" and refused.value.value == "fp6"
    assert "registered: fp32, tf32, bf16, fp16" in refused.value.allowed
    assert "supports: fp32, bf16, fp16" in refused.value.allowed


@pytest.mark.parametrize("spelled", ["FP16", "fp16 ", "", "fp-16", "f" * 33])
def test_a_misspelt_name_is_refused_with_the_rule(spelled: str) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(workload="fcnn", accelerator="cpu", precision=spelled)
    assert refused.value.field == "precision" and refused.value.value == spelled
    assert "lower-case" in refused.value.allowed and "fp32, tf32, bf16, fp16" in refused.value.allowed


@pytest.mark.parametrize("value", [16, 16.0, True, None, ["fp16"], b"fp16"])
def test_a_name_that_is_not_text_is_refused(value: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(workload="fcnn", accelerator="cpu", precision=value)
    assert refused.value.field == "precision" and "string" in refused.value.allowed


class BadListCpu(CpuAccelerator):
    name = "cpu-bad-list"

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return ("fp32", "FP8")  # type: ignore[return-value]


class WrongRefinementCpu(CpuAccelerator):
    name = "cpu-wrong-policy"

    def precision_policy(self, policy: type[PrecisionPolicy], framework: Framework) -> type[PrecisionPolicy]:
        return Bf16Policy  # fp16's name, bf16's arithmetic: the silent mismatch planning must refuse


class RenamingRefinementCpu(CpuAccelerator):
    name = "cpu-renaming-policy"

    def precision_policy(self, policy: type[PrecisionPolicy], framework: Framework) -> type[PrecisionPolicy]:
        class Renamed(policy):  # type: ignore[valid-type,misc]
            name = "fp32"  # a subclass, but the result would record another precision than the run's

        return Renamed


@pytest.mark.parametrize(
    "accelerator", [BadListCpu(), WrongRefinementCpu(), RenamingRefinementCpu()], ids=lambda a: a.name
)
def test_an_accelerator_whose_precision_answers_are_wrong_is_a_fault_of_its_plugin(accelerator: Accelerator) -> None:
    class Plugin:
        @hookimpl
        def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
            register(accelerator)

    with registered_plugins(Plugin()) as manager:
        with pytest.raises(PluginFault) as fault:
            plan_run(manager, "fcnn", accelerator.name, {"precision": "fp16"})
    assert fault.value.plugin == "Plugin"
    assert "precision" in fault.value.call


# --- a plugin's precision: one class, one registration -----------------------------------------


class Fp64Policy(PrecisionPolicy):
    """float64 throughout; records what the steps it ran computed in."""

    name = "fp64"
    compute_dtype = "float64"
    keras_policy = "float64"
    seen: ClassVar[set[str]] = set()

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.double()

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.double() if tensor.is_floating_point() else tensor

    def forward_context(self) -> Any:
        return MatmulDtypes(self.seen)

    def backward(self, loss: torch.Tensor) -> None:
        with MatmulDtypes(self.seen):
            super().backward(loss)


class TorchOnlyPolicy(PrecisionPolicy):
    name = "bf16_true"
    compute_dtype = "bfloat16"

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(torch.bfloat16)

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor


class Fp64Cpu(CpuAccelerator):
    name = "cpu-fp64"

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return (*super().precisions(framework), Precision("fp64"), Precision("bf16_true"))


class Fp64Plugin:
    @hookimpl
    def core_register_precisions(self, register: Callable[[type[PrecisionPolicy]], None]) -> None:
        register(Fp64Policy)
        register(TorchOnlyPolicy)

    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        register(Fp64Cpu())


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_a_plugin_precision_runs_end_to_end(mode: str) -> None:
    Fp64Policy.seen.clear()
    with registered_plugins(Fp64Plugin()) as manager:
        assert manager.plugins["Fp64Plugin"].registered["precisions"] == ["fp64", "bf16_true"]
        result = core.run("fcnn", "cpu-fp64", precision="fp64", mode=mode, **QUICK)
    assert result.status.ok, result.status
    assert Fp64Policy.seen == {"float64"}  # the executor ran the plugin's policy, every matmul
    assert result.config.precision == "fp64"
    details = result.executor_details
    assert details["precision"] == "fp64" and details["compute_dtype"] == "float64"
    assert details["precision_policy"].endswith("test_precision.Fp64Policy")
    # The workload's memory traffic takes the policy's activation size (8 bytes), not a table's.
    with policy_in_force(Fp64Policy):
        expected = bytes_per_sample(FcnnOptions(**TINY), 4, 1, "fp64", training=mode == "train")
    assert result.memory_bytes_per_sample == pytest.approx(expected)


def test_a_plugin_precision_runs_from_the_cli(tmp_path: Path) -> None:
    output = tmp_path / "result.json"
    with registered_plugins(Fp64Plugin()):
        code = main(
            ["run", "fcnn", "--accelerator", "cpu-fp64", "--precision", "fp64", "--steps", "2", "--warmup-steps", "0",
             "--power-meter", "none", "--batch-size", "4", "--output", str(output)]
            + [f"-o{key}={value}" for key, value in TINY.items()]
        )  # fmt: skip
    assert code == 0
    stored = json.loads(output.read_text(encoding="utf-8"))
    assert stored["config"]["precision"] == "fp64" and stored["executor_details"]["compute_dtype"] == "float64"


@pytest.mark.tensorflow
def test_a_plugin_precision_trains_with_keras() -> None:
    # core's Keras executor, in this process (the CPU accelerator's thread settings need a fresh
    # TensorFlow runtime, which an earlier test here has started).
    tf = pytest.importorskip("tensorflow")
    from core.executors.keras import KerasExecutor, KerasPlacement
    from core.workloads.fcnn import Fcnn

    config = make_config(
        workload="fcnn", accelerator="cpu-fp64", framework="tensorflow", precision="fp64", micro_batch_size=4
    )
    placement = KerasPlacement(lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), 1, "/cpu:0")
    with policy_in_force(Fp64Policy):
        executor = KerasExecutor(Fcnn().build_keras(FcnnOptions(**TINY), seed=0), config, placement)
    try:
        executor.step()
        executor.synchronize()
        executor.check_finite()
        assert executor.details()["mixed_precision_policy"] == "float64"
        assert {str(getattr(v.dtype, "name", v.dtype)) for v in executor.model.trainable_variables} == {"float64"}
    finally:
        executor.close()


def test_a_policy_without_a_keras_policy_is_refused_with_tensorflow() -> None:
    with registered_plugins(Fp64Plugin()) as manager:
        with pytest.raises(ConfigError) as refused:
            plan_run(manager, "fcnn", "cpu-fp64", {"precision": "bf16_true", "framework": "tensorflow"})
        assert refused.value.field == "precision" and "no Keras policy" in refused.value.allowed
        assert "supports: fp32, bf16, fp16, default, fp64" in refused.value.allowed
        assert plan_run(manager, "fcnn", "cpu-fp64", {"precision": "bf16_true"}).precision_policy is TorchOnlyPolicy


def test_an_executor_built_outside_a_run_knows_core_policies_only() -> None:
    assert policy_for("fp16") is Fp16Policy
    with pytest.raises(LookupError, match="runs through planning"):
        policy_for("fp64")
    with policy_in_force(Fp64Policy):
        assert policy_for("fp64") is Fp64Policy
        assert policy_for("bf16") is Bf16Policy  # another name: core's


# --- registration --------------------------------------------------------------------------


class _NoName(PrecisionPolicy):
    compute_dtype = "float32"


class _Upper(PrecisionPolicy):
    name = "FP8"
    compute_dtype = "float8_e4m3fn"


class _Fp16Again(Fp16Policy):
    pass


class _UnknownSize(PrecisionPolicy):
    name = "fp4"
    compute_dtype = "float4_e2m1fn_x2"


class _BadKeras(PrecisionPolicy):
    name = "odd"
    compute_dtype = "float32"
    keras_policy = 32  # type: ignore[assignment]


@pytest.mark.parametrize(
    "item,message",
    [
        (Fp64Policy(), "the class, not an instance"),
        (Fp64Cpu, "PrecisionPolicy subclass"),
        (_NoName, "_NoName.name is None"),
        (_Upper, "_Upper.name is 'FP8'"),
        (_Fp16Again, "PrecisionPolicy 'fp16' is already registered by core itself"),
        (_UnknownSize, "override activation_bytes"),
        (_BadKeras, "keras_policy is 32"),
    ],
    ids=["instance", "not-a-policy", "no-name", "upper-case", "core-name", "unknown-dtype", "keras-policy"],
)
def test_core_register_precisions_refuses_what_is_not_a_policy(item: object, message: str) -> None:
    class Plugin:
        @hookimpl
        def core_register_precisions(self, register: Callable[[type[PrecisionPolicy]], None]) -> None:
            register(Fp64Policy)
            register(item)  # type: ignore[arg-type]

    manager = PluginManager()
    record = manager.register_plugin(Plugin(), name="bad-precisions")
    assert record.state is PluginState.failed and message in (record.error or ""), record.error
    # Nothing of a plugin that failed to register is kept (its good policy neither), core's are.
    assert sorted(manager.precisions) == sorted(BUILTIN_POLICIES)


def test_core_register_precisions_attributes_each_policy_to_its_plugin() -> None:
    manager = PluginManager()
    record = manager.register_plugin(Fp64Plugin(), name="fp64-plugin")
    assert record.state is PluginState.loaded, record.error
    assert manager.precision_policy("fp64") is Fp64Policy
    assert manager.plugin_of(Fp64Policy) == "fp64-plugin" and manager.plugin_of(Fp16Policy) == "core"
    second = manager.register_plugin(Fp64Plugin(), name="fp64-again")
    assert second.state is PluginState.failed and "already registered by plugin 'fp64-plugin'" in (second.error or "")


# --- the name ----------------------------------------------------------------------------------


def test_a_name_is_one_object_and_compares_as_text() -> None:
    config = make_config(workload="fcnn", accelerator="cpu", precision="bf16")
    assert config.precision is Precision.bf16 and Precision("bf16") is Precision.bf16
    assert config.precision == "bf16" and config.precision.value == "bf16" and str(config.precision) == "bf16"
    assert {Precision.bf16: 2}["bf16"] == 2  # peak tables keyed by Precision answer plain names
    assert json.loads(config.model_dump_json())["precision"] == "bf16"
    assert type(config.model_validate_json(config.model_dump_json()).precision) is Precision


def test_the_enum_forms_of_precision_keep_working() -> None:
    # Plugins written against 0.2, where Precision was an enum of core's four names.
    assert Precision["fp16"] is Precision.fp16 and Precision.fp16.name == "fp16"
    with pytest.raises(KeyError):
        Precision["fp8"]
    with pytest.warns(DeprecationWarning, match="core's own names only"):
        assert [p.value for p in Precision] == ["fp32", "tf32", "bf16", "fp16", "default"]


def test_run_context_hands_a_plugin_test_the_policy_planning_would() -> None:
    from core.testing import run_context
    from core_plugins.graphcore.accelerator import GraphcoreAccelerator
    from core_plugins.graphcore.precision import PopTorchFp16Policy

    ipu = GraphcoreAccelerator()
    config = make_config(workload="fcnn", accelerator="graphcore", precision="fp16")
    assert run_context(config, ipu).precision_policy is PopTorchFp16Policy  # PopTorch's own fp16
    keras = make_config(workload="fcnn", accelerator="graphcore", precision="fp16", framework="tensorflow")
    assert run_context(keras, ipu).precision_policy is Fp16Policy  # Keras's mixed_float16: core's
    with registered_plugins(Fp64Plugin()):
        fp64 = make_config(workload="fcnn", accelerator="cpu-fp64", precision="fp64")
        assert run_context(fp64, Fp64Cpu()).precision_policy is Fp64Policy


# "default" (issue 28): the framework's own float32 math, whatever a run before it set.
_DEFAULT_SCRIPT = """
import json, torch
from core.base.precision import DefaultPolicy, Fp32Policy, Tf32Policy
out = {}
for policy in (Tf32Policy, Fp32Policy, DefaultPolicy):
    details = policy("cpu").configure_torch()
    out[policy.name] = [details[k] for k in ("matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision",
                                              "fp16_reduced_precision_reduction", "bf16_reduced_precision_reduction")]
import tensorflow as tf
from tensorflow import keras
for policy in (Fp32Policy, DefaultPolicy):
    policy.configure_keras(tf, keras)
    out["keras-" + policy.name] = bool(tf.config.experimental.tensor_float_32_execution_enabled())
print("RESULT " + json.dumps(out))
"""


@pytest.mark.tensorflow
def test_default_is_the_frameworks_own_float32_math_whatever_ran_before() -> None:
    import subprocess
    import sys

    pytest.importorskip("tensorflow")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", _DEFAULT_SCRIPT],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["tf32"][:3] == [True, True, "high"] and out["fp32"][:3] == [False, False, "highest"]
    # PyTorch's defaults (since 1.12): fp32 matmuls, TF32 convolutions; 16-bit reductions allowed.
    assert out["default"] == [False, True, "highest", True, True]
    # TensorFlow runs float32 on TF32 by default (since 2.4); fp32 turns it off, default back on.
    assert out["keras-fp32"] is False and out["keras-default"] is True


def test_default_is_measured_against_the_fp32_peak() -> None:
    from core import run

    def tiny(precision: str) -> Any:
        return run(
            "fcnn",
            "cpu",
            precision=precision,
            steps=2,
            warmup_steps=0,
            micro_batch_size=4,
            power_meter="none",
            workload_options={"layers": 2, "hidden_width": 8},
        )

    result, fp32 = tiny("default"), tiny("fp32")
    assert result.status.ok, result.status
    assert result.executor_details["precision"] == "default"
    if fp32.peak_flops_per_second is None:
        pytest.skip("no peak is known for this host's processor")
    assert result.peak_flops_per_second == fp32.peak_flops_per_second
    assert result.model_flops_utilization == pytest.approx(result.flops_per_second / fp32.peak_flops_per_second)
