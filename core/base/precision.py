"""Precision policies: what each ``precision`` name does to a step, one class per name.

Modelled on Lightning Fabric's precision plugins (``forward_context``, ``convert_module``,
``backward``, ``optimizer_step``): a policy is an object of its own, not a flag that executors
branch on. A name without a policy cannot run: planning refuses it (``core.running.planning``),
so nothing can silently train in fp32 under another precision's name.

Adding a precision is one subclass of :class:`PrecisionPolicy` and one registration (core's own in
:data:`BUILTIN_POLICIES`; a plugin's through the ``core_register_precisions`` hook). An accelerator
lists the names it supports (``Accelerator.precisions``) and may run one in its own way with a
subclass of the registered policy (``Accelerator.precision_policy``).

This module sits at the bottom of core: it imports no other core module at import time, and
PyTorch and TensorFlow only inside the methods that use them.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, cast

from core.base.deprecation import REMOVED_IN, warn_deprecated

if TYPE_CHECKING:
    import torch
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

#: how a precision's name is spelled: lower case, a letter first (fp32, bf16, fp8_e4m3)
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
NAME_RULE = "a precision name: a lower-case letter, then up to 31 lower-case letters, digits or '_'"


class _OpenNames(type):
    """What the enum's class did that code written against it may still do: iterate core's names
    and look one up by name (``Precision["bf16"]``)."""

    def __iter__(cls) -> Iterator[Precision]:
        warn_deprecated(
            "iterating core.plugin.Precision gives core's own names only (plugins register more): a run's "
            "allowed names are its accelerator's precisions(framework)",
            removed_in=REMOVED_IN,
        )
        return iter([Precision(name) for name in BUILTIN_POLICIES])

    def __getitem__(cls, name: str) -> Precision:
        if name not in BUILTIN_POLICIES:
            raise KeyError(name)
        return Precision(name)


class Precision(str, metaclass=_OpenNames):
    """The name of a precision policy, as a run's ``precision`` holds it.

    Open, unlike the enum it was in 0.2.0: core's names are attributes (``Precision.fp32``,
    ``.tf32``, ``.bf16``, ``.fp16``) and a plugin that registers a policy adds its own name. The
    name is checked for its spelling here and against the registered policies in planning. Equal
    names are one object (``Precision("bf16") is Precision.bf16``), so comparisons written with
    ``is`` against the enum keep working; ``==`` against a plain string works too.
    """

    fp32: ClassVar[Precision]
    tf32: ClassVar[Precision]
    bf16: ClassVar[Precision]
    fp16: ClassVar[Precision]
    default: ClassVar[Precision]
    _interned: ClassVar[dict[str, Precision]] = {}

    def __new__(cls, name: object) -> Precision:
        if isinstance(name, Precision):
            return name
        if not isinstance(name, str):
            raise TypeError(f"{NAME_RULE}; got {type(name).__name__} {name!r}")
        text = str.__str__(name)
        if not NAME_PATTERN.fullmatch(text):
            raise ValueError(f"{NAME_RULE}; got {text!r}")
        interned = cls._interned.get(text)
        if interned is None:
            interned = cls._interned[text] = super().__new__(cls, text)
        return interned

    @property
    def value(self) -> str:
        """The name as a plain string (the enum's attribute, kept for the code written against it)."""
        return str.__str__(self)

    @property
    def name(self) -> str:
        """The enum's other attribute: the same name."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Precision({self.value!r})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        from pydantic_core import core_schema

        # Text only (a number or a boolean is refused by the string schema, as every strict field
        # is); the spelling is checked here, the policy in planning. Serialised as the plain name.
        return core_schema.no_info_after_validator_function(
            cls._validated,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str.__str__, when_used="json"),
        )

    @classmethod
    def _validated(cls, text: str) -> Precision:
        if not NAME_PATTERN.fullmatch(text):
            # The names core knows; planning lists a plugin's too, against the accelerator's.
            meant = text.strip().lower()
            hint = f" (did you mean {meant!r}?)" if NAME_PATTERN.fullmatch(meant) else ""
            raise ValueError(f"{NAME_RULE}{hint}; core's are {', '.join(BUILTIN_POLICIES)}, plugins may add more")
        return cls(text)


Precision.fp32 = Precision("fp32")
Precision.tf32 = Precision("tf32")
Precision.bf16 = Precision("bf16")
Precision.fp16 = Precision("fp16")
Precision.default = Precision("default")

#: bytes of one value of each dtype a policy may compute in (what an activation costs in memory)
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
}


class PrecisionPolicy:
    """What one precision does to a step; subclass it once per precision name.

    Class attributes declare what the policy claims (tests/test_precision.py checks, for every
    precision each built-in accelerator lists, that the matmuls compute in ``compute_dtype``);
    the methods do it. An instance serves one PyTorch executor (``PrecisionPolicy(device)``) and
    holds that run's state (fp16's gradient scaler); the Keras executor reads the class.
    """

    #: the name runs ask for (``--precision``); unique among registered policies
    name: ClassVar[str]
    description: ClassVar[str] = ""
    #: the dtype matmuls and convolutions compute in (a torch dtype name: float32, bfloat16, ...)
    compute_dtype: ClassVar[str]
    #: False: float32 matmuls and convolutions stay true fp32 (TF32 tensor cores off); True: TF32 allowed
    allows_tf32: ClassVar[bool] = False
    #: the loss is scaled and a step with non-finite gradients skipped (fp16's dynamic loss scaling)
    scales_loss: ClassVar[bool] = False
    #: the Keras mixed-precision policy of the TensorFlow path; None: no TensorFlow path
    keras_policy: ClassVar[str | None] = None
    #: the precision whose datasheet peak MFU is measured against; None: the policy's own name
    peak_precision: ClassVar[str | None] = None

    def __init__(self, device: torch.device | str = "cpu") -> None:
        import torch

        self.device = torch.device(device)

    @classmethod
    def activation_bytes(cls) -> int:
        """Bytes of one activation value (the roofline's memory traffic): the compute dtype's size
        (override it for a dtype :data:`DTYPE_BYTES` does not list)."""
        return DTYPE_BYTES[cls.compute_dtype]

    @classmethod
    def torch_dtype(cls) -> torch.dtype:
        """``compute_dtype`` as a torch dtype."""
        import torch

        dtype = getattr(torch, cls.compute_dtype)
        assert isinstance(dtype, torch.dtype), cls.compute_dtype
        return dtype

    # --- PyTorch -------------------------------------------------------------------------------

    def configure_torch(self) -> dict[str, Any]:
        """Set PyTorch's process-wide float32 switches for this policy; returns what the result
        records of the policy (``executor_details``). fp32 means true fp32: TF32 off for matmul
        and, separately, for cuDNN's convolutions."""
        import torch

        matmul_tf32, convolution_tf32, matmul_precision = self.float32_switches(_torch_defaults(torch))
        torch.set_float32_matmul_precision(matmul_precision)
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32 = convolution_tf32
        autocast = self.autocast_dtype()
        matmul = torch.backends.cuda.matmul
        return {
            "precision": self.name,
            "precision_policy": f"{type(self).__module__}.{type(self).__qualname__}",
            "compute_dtype": self.compute_dtype,
            "autocast_dtype": str(autocast).removeprefix("torch.") if autocast is not None else None,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            # Whether 16-bit matmuls may reduce (sum) in 16 bits: PyTorch allows it by default.
            "fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
            "bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "grad_scaler": self.scales_loss,
        }

    def float32_switches(self, framework_defaults: dict[str, Any]) -> tuple[bool, bool, str]:
        """(TF32 for matmuls, TF32 for cuDNN's convolutions, ``float32_matmul_precision``) under this
        policy; ``framework_defaults`` holds PyTorch's own (see :func:`_torch_defaults`)."""
        return self.allows_tf32, self.allows_tf32, "high" if self.allows_tf32 else "highest"

    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype :meth:`forward_context` autocasts to; None where it does not autocast."""
        return None

    def forward_context(self) -> AbstractContextManager[Any]:
        """The context the forward pass and the loss run in (autocast for mixed policies)."""
        dtype = self.autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The model as this policy keeps it, once it is on the device and before any optimizer or
        wrapper sees it (a mixed policy keeps float32 weights: unchanged)."""
        return module

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """A micro-batch's inputs as the model takes them (on the device, before the forward pass)."""
        return tensor

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` as backward takes it (fp16's: multiplied by the loss scale); a pipeline's last
        stage calls it inside the schedule's loss function, whose backward runs through every stage."""
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradients of ``loss`` (one micro-step)."""
        self.scale_loss(loss).backward()

    def scale_over_mesh(self, scaler: Any) -> None:
        """Scale the loss with ``scaler`` (core.executors.mesh_scaler.MeshGradScaler) where the step is
        spread over a device mesh: its inf check is one verdict of every process of the run, which
        all skip the step on and lower the scale by alike. A policy that scales its loss otherwise
        overrides this (its own scaler would skip a step on some processes only)."""
        if self.scales_loss:
            raise NotImplementedError(f"precision {self.name!r} scales its loss without a device mesh's scaler")

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the accumulated gradients (one weight update)."""
        optimizer.step()

    # --- TensorFlow / Keras --------------------------------------------------------------------

    @classmethod
    def configure_keras(cls, tf: Any, keras: Any) -> None:
        """Set Keras's global dtype policy (before the model is built: layers read it when made)
        and, for a float32 policy, TensorFlow's TF32 switch."""
        if cls.keras_policy is None:
            raise ValueError(f"precision {cls.name!r} has no Keras policy: it runs with PyTorch only")
        keras.mixed_precision.set_global_policy(cls.keras_policy)
        if cls.compute_dtype == "float32":
            # A mixed policy leaves the switch as the process had it: its matmuls are 16-bit.
            tf.config.experimental.enable_tensor_float_32_execution(cls.keras_tf32(_tensorflow_tf32_default(tf)))

    @classmethod
    def keras_tf32(cls, framework_default: bool) -> bool:
        """Whether TensorFlow may run float32 matmuls and convolutions on TF32 under this policy;
        ``framework_default`` is TensorFlow's own (see :func:`_tensorflow_tf32_default`)."""
        return cls.allows_tf32

    @classmethod
    def keras_optimizer(cls, optimizer: Any, keras: Any) -> Any:
        """The workload's optimizer as this policy trains with it (loss-scaled for fp16)."""
        if cls.scales_loss and not isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
            # fp16 gradients underflow without loss scaling (bf16 has fp32's range).
            return keras.mixed_precision.LossScaleOptimizer(optimizer)
        return optimizer


class MixedPrecisionPolicy(PrecisionPolicy):
    """Autocast to ``compute_dtype`` around the forward pass; float32 weights, gradients and
    optimizer state (PyTorch's AMP, Keras's mixed policies)."""

    def autocast_dtype(self) -> torch.dtype | None:
        return self.torch_dtype()


class Fp32Policy(PrecisionPolicy):
    name = "fp32"
    description = "true fp32: float32 everywhere, TF32 tensor cores off"
    compute_dtype = "float32"
    keras_policy = "float32"


class Tf32Policy(PrecisionPolicy):
    name = "tf32"
    description = "float32 tensors, matmuls and convolutions allowed on TF32 tensor cores"
    compute_dtype = "float32"
    allows_tf32 = True
    keras_policy = "float32"


class DefaultPolicy(PrecisionPolicy):
    """The framework's own float32 math, as it runs without being told: PyTorch computes matmuls in
    true fp32 and lets cuDNN's convolutions use TF32; TensorFlow runs both on TF32 where the device
    has it. What was in force is recorded (``executor_details``), and MFU is measured against the
    fp32 peak, so a run that TF32 speeds up shows above 100 % of it (AI4NP's A100 FP32 column)."""

    name = "default"
    description = "the framework's own float32 defaults (PyTorch: fp32 matmuls, TF32 convolutions; TensorFlow: TF32)"
    compute_dtype = "float32"
    keras_policy = "float32"
    peak_precision = "fp32"

    def float32_switches(self, framework_defaults: dict[str, Any]) -> tuple[bool, bool, str]:
        return (
            bool(framework_defaults["matmul_allow_tf32"]),
            bool(framework_defaults["cudnn_allow_tf32"]),
            str(framework_defaults["float32_matmul_precision"]),
        )

    @classmethod
    def keras_tf32(cls, framework_default: bool) -> bool:
        return framework_default


# The frameworks' float32 switches as this process had them before a policy first set them: the
# frameworks' own defaults, unless the program changed them itself (then that is its default).
_framework_defaults: dict[str, Any] = {}


def _torch_defaults(torch: Any) -> dict[str, Any]:
    if "torch" not in _framework_defaults:
        _framework_defaults["torch"] = {
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
    return dict(_framework_defaults["torch"])


def _tensorflow_tf32_default(tf: Any) -> bool:
    if "tensorflow" not in _framework_defaults:
        _framework_defaults["tensorflow"] = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    return bool(_framework_defaults["tensorflow"])


class Bf16Policy(MixedPrecisionPolicy):
    name = "bf16"
    description = "autocast to bfloat16 (Keras mixed_bfloat16), float32 weights"
    compute_dtype = "bfloat16"
    keras_policy = "mixed_bfloat16"


class Fp16Policy(MixedPrecisionPolicy):
    name = "fp16"
    description = "autocast to float16 (Keras mixed_float16), float32 weights, dynamic loss scaling"
    compute_dtype = "float16"
    scales_loss = True
    keras_policy = "mixed_float16"

    @functools.cached_property
    def scaler(self) -> Any:
        """The run's dynamic loss scaler (a GradScaler), made at the first backward (inference makes none)."""
        import torch

        # The device-generic GradScaler(device_type) arrived in torch 2.3; older releases scale on CUDA only.
        if hasattr(torch.amp, "GradScaler"):
            return torch.amp.GradScaler(self.device.type)
        return torch.cuda.amp.GradScaler()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return cast("torch.Tensor", self.scaler.scale(loss))

    def scale_over_mesh(self, scaler: Any) -> None:
        self.scaler = scaler

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The scaler skips a step whose gradients hold a NaN/inf and lowers the scale: loss
        # scaling at work, not a fault (the executor checks the unscaled losses instead).
        self.scaler.step(optimizer)
        self.scaler.update()


#: core's own policies, by name, registered on every plugin manager before any plugin
BUILTIN_POLICIES: dict[str, type[PrecisionPolicy]] = {
    policy.name: policy for policy in (Fp32Policy, Tf32Policy, Bf16Policy, Fp16Policy, DefaultPolicy)
}


def policy_problem(policy: object) -> str | None:
    """Why ``policy`` cannot be registered as a precision policy, or None where it can."""
    if not isinstance(policy, type) or not issubclass(policy, PrecisionPolicy):
        return f"expected a PrecisionPolicy subclass (the class, not an instance), got {policy!r}"
    name = getattr(policy, "name", None)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return f"{policy.__qualname__}.name is {name!r}: {NAME_RULE}"
    dtype = getattr(policy, "compute_dtype", None)
    if not isinstance(dtype, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", dtype):
        return f"{policy.__qualname__}.compute_dtype is {dtype!r}: a torch dtype name, such as {', '.join(DTYPE_BYTES)}"
    try:
        size = policy.activation_bytes()
    except KeyError:
        size = None
    if type(size) is not int or size < 1:
        return (
            f"{policy.__qualname__}.activation_bytes() is {size!r}: bytes of one {dtype} value (DTYPE_BYTES lists "
            f"{', '.join(DTYPE_BYTES)}; override activation_bytes for another dtype)"
        )
    keras_policy = policy.keras_policy
    if keras_policy is not None and not isinstance(keras_policy, str):
        return f"{policy.__qualname__}.keras_policy is {keras_policy!r}: a Keras policy name, or None"
    return None


# --- the policy of the run in progress --------------------------------------------------------

_in_force: ContextVar[type[PrecisionPolicy] | None] = ContextVar("core_precision_policy", default=None)


@contextlib.contextmanager
def policy_in_force(policy: type[PrecisionPolicy]) -> Iterator[None]:
    """Make ``policy`` the one :func:`policy_for` answers while a run executes (the runner sets
    the plan's, so core's executors and workloads use the policy planning chose, whichever
    accelerator built the executor and however)."""
    token = _in_force.set(policy)
    try:
        yield
    finally:
        _in_force.reset(token)


def policy_for(precision: str) -> type[PrecisionPolicy]:
    """The policy of ``precision``: the running plan's, else core's own of that name.

    :raises LookupError: for a plugin's name outside a planned run (plan the run, which resolves
        it against the registered policies, instead of building an executor by hand).
    """
    policy = _in_force.get()
    if policy is not None and policy.name == precision:
        return policy
    builtin = BUILTIN_POLICIES.get(str(precision))
    if builtin is None or builtin.name != precision:
        raise LookupError(
            f"precision {str(precision)!r} is no policy of core's ({', '.join(BUILTIN_POLICIES)}) and no run "
            "planned it here: a plugin's precision runs through planning (core.run, core run), which resolves it"
        )
    return builtin
