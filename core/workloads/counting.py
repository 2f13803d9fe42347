"""Parameter and FLOP accounting from a model's configuration, without building the model.

A ``Tally`` walks an architecture layer by layer, the way the library builds it, and adds up
trainable parameters and the multiply-accumulates (MACs) of every matrix multiplication and
convolution for one sample. Training FLOPs follow the convention of
``torch.utils.flop_counter.FlopCounterMode``: a multiply-add is 2 FLOPs; normalisation,
activations, pooling, softmax and additions are not counted; the backward pass costs twice the
forward (the gradient of the input and of the weights), except for layers that read the raw
input, whose input gradient is never computed.

Pure Python: ``core workloads`` reports these figures without importing a framework.
"""

from __future__ import annotations

from dataclasses import dataclass


def conv_output(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output length of a convolution or pooling window with ``padding`` added in total."""
    return (size + padding - kernel) // stride + 1


@dataclass
class Tally:
    parameters: int = 0
    #: forward multiply-accumulates of matmuls and convolutions, per sample
    macs: int = 0
    #: the part of ``macs`` in layers that read the raw input (no input gradient in backward)
    input_macs: int = 0

    def conv(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int | tuple[int, int],
        out_height: int,
        out_width: int,
        *,
        groups: int = 1,
        bias: bool = False,
        norm_parameters: int = 0,
        reads_input: bool = False,
    ) -> None:
        """A 2-D convolution producing ``out_height x out_width``; ``norm_parameters`` per output
        channel for a following batch norm (2 with scale and shift, 1 with shift only)."""
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        weights = kh * kw * (in_channels // groups) * out_channels
        self.parameters += weights + (out_channels if bias else 0) + norm_parameters * out_channels
        macs = weights * out_height * out_width
        self.macs += macs
        if reads_input:
            self.input_macs += macs

    def transposed_conv(
        self, in_channels: int, out_channels: int, kernel: int, in_height: int, in_width: int, *, bias: bool = True
    ) -> None:
        """A transposed convolution: every input position scatters a kernel-sized patch."""
        weights = kernel * kernel * in_channels * out_channels
        self.parameters += weights + (out_channels if bias else 0)
        self.macs += weights * in_height * in_width

    def linear(self, in_features: int, out_features: int, *, tokens: int = 1, bias: bool = True) -> None:
        """A dense layer applied to ``tokens`` positions of one sample."""
        self.parameters += in_features * out_features + (out_features if bias else 0)
        self.macs += in_features * out_features * tokens

    def matmul(self, macs: int) -> None:
        """A product of two activations (attention scores, attention-weighted values)."""
        self.macs += macs

    def params(self, count: int) -> None:
        """Parameters that take part in no matmul: norms, embeddings, biases, position tables."""
        self.parameters += count

    @property
    def forward_flops(self) -> int:
        return 2 * self.macs

    @property
    def training_flops(self) -> int:
        """Forward and backward FLOPs per sample."""
        return 2 * (3 * self.macs - self.input_macs)
