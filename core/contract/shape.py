"""A transformer's shape: what planning needs to split a replica over devices and size its memory.

Tensor parallelism splits attention heads and the hidden size, pipeline parallelism whole layers,
and a transformer's activation memory is a function of these few numbers (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models"). A workload says its shape
(``Workload.transformer_shape``) so that planning can check a split and count its memory without
building the model: a 175B model is never built in a dry run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformerShape:
    """Layers, widths and lengths of a stack of identical transformer layers, for one sample."""

    layers: int
    hidden: int
    attention_heads: int
    #: tokens one sample holds (a language model's sequence length; a ViT's patches and CLS token)
    sequence: int
    #: the MLP's inner width (4 x hidden in GPT, BERT and ViT)
    intermediate: int
    #: rows of the output layer's logits per token (the vocabulary of a language model); 0 where the
    #: model predicts per sample, not per token (a classifier's head is negligible)
    vocabulary: int = 0
    #: attention runs in a fused kernel (PyTorch's SDPA, flash attention) that keeps no attention
    #: scores for the backward: the 5as/h term of the activations is not stored, as under selective
    #: recomputation
    fused_attention: bool = False

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "attention_heads", "sequence", "intermediate"):
            if getattr(self, name) < 1:
                raise ValueError(f"TransformerShape.{name} must be at least 1, not {getattr(self, name)}")
        if self.vocabulary < 0:
            raise ValueError(f"TransformerShape.vocabulary must be 0 or more, not {self.vocabulary}")

    def layer_parameters(self) -> int:
        """Parameters of one layer (Megatron's GPT layer, with biases and two layer norms): query, key,
        value and output projections 4h^2 + 4h, the MLP 2hi + i + h, the norms 4h."""
        h, i = self.hidden, self.intermediate
        return 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h

    def layer_forward_flops(self) -> float:
        """Forward FLOPs of one layer for one sample (multiply-adds x 2): the four projections, the
        attention scores and their weighted values (every score, as the kernels compute them), the MLP."""
        h, i, s = self.hidden, self.intermediate, self.sequence
        return 2.0 * s * (4 * h * h + 2 * h * i) + 2.0 * 2 * s * s * h

    def attention_score_forward_flops(self) -> float:
        """Forward FLOPs of one layer's attention scores and weighted values for one sample: what
        selective recomputation computes again (Korthikanti et al. 2022, section 5)."""
        return 2.0 * 2 * self.sequence * self.sequence * self.hidden
