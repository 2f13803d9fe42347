"""Language models: BERT-base (masked language modelling) and GPT-2 style decoders, from transformers.

A sample is one sequence of ``sequence_length`` token ids (``sample_unit`` "sequences"); tokens per
second are ``throughput_per_second x tokens_per_sample``, and ``workload_details`` records
``tokens_per_sample``. Inputs and targets are the same token ids, as a real token file gives them:
the causal model shifts them inside its loss, the masked model masks them inside the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.contract.parallel import SequenceParallelPlan, TensorParallelPlan, TensorParallelStyle
from core.contract.pipeline import RecommendedSplit
from core.contract.shape import TransformerShape
from core.contract.workload import TorchTrainingSpec
from core.workloads.counting import Tally
from core.workloads.datasets import TOKEN_DATASETS, TokenDatasetName
from core.workloads.zoo import (
    Source,
    ZooOptions,
    ZooWorkload,
    layers_per_stage_recommendation,
    seeded,
    transformers_source,
)

ADAMW_LEARNING_RATE = 1e-4
IGNORE_INDEX = -100

#: BERT's WordPiece vocabulary (bert-base-uncased) and its [MASK] token
BERT_VOCABULARY = 30522
BERT_MASK_TOKEN = 103
#: share of positions a masked language model predicts
MASKED_FRACTION = 0.15
#: GPT-2's byte-pair vocabulary
GPT2_VOCABULARY = 50257
#: GPT-2's vocabulary padded by Megatron-LM to a multiple of 128 (--make-vocab-size-divisible-by)
MEGATRON_GPT2_VOCABULARY = 50304
#: GPT-2's vocabulary as Graphcore's GPT-2 configuration pads it (nlp/gpt2/pytorch/config/config.json)
GRAPHCORE_GPT2_VOCABULARY = 50272
#: SQuAD's answer: a start and an end position
SQUAD_POSITIONS = 2


class LanguageOptions(ZooOptions):
    dataset: TokenDatasetName = Field(default="openwebtext", description="corpus whose epoch size the run reports")
    sequence_length: int | None = Field(
        default=None,
        ge=8,
        le=1 << 17,
        description="tokens per sample; None: the model's own (small variant: 32)",
    )


class GptOptions(LanguageOptions):
    vocabulary: int | None = Field(
        default=None,
        ge=2,
        le=1 << 20,
        description="token ids the model embeds (a byte-level text: 256); None: the model's own",
    )
    learning_rate: float = Field(default=ADAMW_LEARNING_RATE, gt=0, le=1, description="AdamW's learning rate")


class MaskedLanguageOptions(LanguageOptions):
    dataset: TokenDatasetName = Field(
        default="wikipedia-bookcorpus", description=LanguageOptions.model_fields["dataset"].description
    )


class LanguageWorkload(ZooWorkload):
    optimizer_state_floats: ClassVar[int | None] = 2  # AdamW
    sample_unit: ClassVar[str] = "sequences"
    options_model: ClassVar[type[BaseModel]] = LanguageOptions
    #: a token file, cut into windows of the sequence length
    data_formats: ClassVar[tuple[str, ...] | None] = ("tokens",)
    #: the model's own sequence length, and the context its position table covers
    sequence_length: ClassVar[int]
    small_sequence_length: ClassVar[int] = 32
    vocabulary: ClassVar[int]
    #: (hidden, layers, heads, intermediate) of the full and the small variant
    full: ClassVar[tuple[int, int, int, int]]
    small: ClassVar[tuple[int, int, int, int]] = (64, 2, 2, 256)

    #: attention runs in PyTorch's fused kernel (SDPA), which keeps no attention scores for the
    #: backward (TransformerShape.fused_attention): transformers builds its models with
    #: attn_implementation "sdpa" where none is named (tests/test_replica_plan.py checks each)
    fused_attention: ClassVar[bool] = True

    def dimensions(self, o: LanguageOptions) -> tuple[int, int, int, int]:
        return self.small if o.variant == "small" else self.full

    def transformer_shape(self, options: Any) -> TransformerShape:
        hidden, layers, heads, intermediate = self.dimensions(options)
        return TransformerShape(
            layers=layers,
            hidden=hidden,
            attention_heads=heads,
            sequence=self.tokens_per_sample(options),
            intermediate=intermediate,
            vocabulary=self.vocabulary_of(options),
            fused_attention=self.fused_attention,
        )

    def vocabulary_of(self, o: LanguageOptions) -> int:
        """The vocabulary the model embeds: the options' (a GPT's ``vocabulary``), else its own."""
        chosen = getattr(o, "vocabulary", None)
        return self.vocabulary if chosen is None else chosen

    def token_vocabulary(self, options: Any) -> int | None:
        return self.vocabulary_of(options)

    def learning_rate(self, o: LanguageOptions) -> float:
        return getattr(o, "learning_rate", ADAMW_LEARNING_RATE)

    def tokens_per_sample(self, o: LanguageOptions) -> int:
        if o.sequence_length is not None:
            return o.sequence_length
        return self.small_sequence_length if o.variant == "small" else self.sequence_length

    def positions(self, o: LanguageOptions) -> int:
        """Rows of the learned position table: the model's context, or longer sequences."""
        return max(
            self.tokens_per_sample(o), self.small_sequence_length if o.variant == "small" else self.sequence_length
        )

    def samples_per_epoch(self, options: BaseModel) -> int:
        assert isinstance(options, LanguageOptions)
        return TOKEN_DATASETS[options.dataset].samples_per_epoch(self.tokens_per_sample(options))

    def shape_details(self, o: LanguageOptions) -> dict[str, Any]:
        hidden, layers, heads, intermediate = self.dimensions(o)
        return {
            "dataset": o.dataset,
            "tokens_per_sample": self.tokens_per_sample(o),
            "vocabulary": self.vocabulary_of(o),
            "hidden_size": hidden,
            "layers": layers,
            "attention_heads": heads,
            "intermediate_size": intermediate,
            "non_embedding_parameters": self.non_embedding_parameters(o),
        }

    def non_embedding_parameters(self, o: LanguageOptions) -> int:
        hidden, _, _, _ = self.dimensions(o)
        return self.parameter_count(o) - (self.vocabulary_of(o) + self.positions(o)) * hidden

    def encoder_layers(self, t: Tally, o: LanguageOptions) -> None:
        """Attention and MLP of every layer, over the whole sequence (attention scores are not
        halved for causal masks: the kernels compute, and FlopCounterMode counts, every score)."""
        hidden, layers, _, intermediate = self.dimensions(o)
        tokens = self.tokens_per_sample(o)
        for _ in range(layers):
            for _ in range(4):  # query, key, value, output projections
                t.linear(hidden, hidden, tokens=tokens)
            t.matmul(2 * tokens * tokens * hidden)
            t.linear(hidden, intermediate, tokens=tokens)
            t.linear(intermediate, hidden, tokens=tokens)
            t.params(2 * 2 * hidden)  # two layer norms

    def token_pool(self, o: LanguageOptions, seed: int) -> Any:
        import torch

        generator = torch.Generator().manual_seed(seed + 1)
        return torch.randint(
            0, self.vocabulary_of(o), (o.synthetic_pool_samples, self.tokens_per_sample(o)), generator=generator
        )

    def loss(self) -> Any:
        """(logits, token ids) -> mean loss."""
        raise NotImplementedError

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch

        assert isinstance(options, LanguageOptions)
        model = seeded(seed, lambda: self.torch_model(options))
        model.train()
        tokens = self.token_pool(options, seed)
        learning_rate = self.learning_rate(options)
        return TorchTrainingSpec(
            model=model,
            loss_fn=self.loss(),
            make_optimizer=lambda params: torch.optim.AdamW(params, lr=learning_rate),
            inputs=tokens,
            targets=tokens.clone(),
            vocabulary=self.vocabulary_of(options),
            token_loss_sums=self.token_loss_sums(),
            tensor_parallel_plan=self.tensor_parallel_plan(options),
            pipeline_layout=self.pipeline_layout(options),
            pipeline_stage=self.pipeline_stage(),
        )

    def pipeline_stage(self) -> Any:
        """``TorchTrainingSpec.pipeline_stage`` of the model; None where it cannot be cut by hand."""
        return None

    def token_loss_sums(self) -> Any:
        """(logits, token ids) -> (summed loss, tokens predicted) for a held-out evaluation; None
        where the task's evaluation is not a language model's (``TorchTrainingSpec.token_loss_sums``)."""
        return None


# --- GPT-2 -----------------------------------------------------------------------------------


def causal_lm_loss(logits: Any, tokens: Any) -> Any:
    """Cross-entropy of predicting token t+1 from positions up to t."""
    from torch.nn import functional

    vocabulary = logits.shape[-1]
    return functional.cross_entropy(logits[:, :-1].reshape(-1, vocabulary), tokens[:, 1:].reshape(-1))


def causal_lm_loss_sums(logits: Any, tokens: Any) -> tuple[Any, int]:
    """(summed cross-entropy, tokens predicted) of :func:`causal_lm_loss`'s predictions: every token
    after a sequence's first, predicted from those before it."""
    from torch.nn import functional

    vocabulary = logits.shape[-1]
    predicted = tokens[:, 1:]
    total = functional.cross_entropy(logits[:, :-1].reshape(-1, vocabulary), predicted.reshape(-1), reduction="sum")
    return total, predicted.numel()


def gpt_token_ids(vocabulary: int) -> dict[str, int]:
    """transformers' configurations name GPT-2's end-of-text token (50256) as the first and last; a
    smaller vocabulary (``-o vocabulary``) has no such id, and transformers warns of it: its last."""
    return {} if vocabulary > 50256 else {"bos_token_id": vocabulary - 1, "eos_token_id": vocabulary - 1}


class Gpt2(LanguageWorkload):
    """GPT-2 style decoder (transformers' GPT2LMHeadModel): learned positions, pre-norm layers, MLP 4x
    hidden, output layer tied to the token embeddings."""

    task: ClassVar[str] = "language-modeling"
    options_model: ClassVar[type[BaseModel]] = GptOptions
    vocabulary: ClassVar[int] = GPT2_VOCABULARY
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("GPT2LMHeadModel")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    pipeline_blocks: ClassVar[str | None] = r"\.transformer\.h\.\d+$"
    pipeline_unit: ClassVar[str] = "decoder layer"
    pipeline_repeated_layers: ClassVar[bool] = True

    def recommended_pipeline_splits(self, options: Any, blocks: tuple[str, ...]) -> dict[int, RecommendedSplit]:
        # Graphcore's GPT-2 small on four IPUs (the vendor benchmark CARAML's 117M GPT runs): the
        # embeddings alone on the first IPU, four layers on each of the others.
        return layers_per_stage_recommendation(
            blocks,
            (0, 4, 4, 4),
            "graphcore/examples nlp/gpt2/pytorch/run/pretraining_small.sh (--layers-per-ipu 0 4 4 4)",
        )

    def tensor_parallel_plan(self, options: BaseModel) -> TensorParallelPlan:
        # Megatron's split of a GPT-2 block. Its layers are transformers' Conv1D, weights stored
        # (input, output): transposed. The fused c_attn's outputs are [all q | all k | all v], so
        # each third is split on its own (fused_parts) and a device holds its heads' q, k and v. The
        # attention splits c_attn's output by split_size (the hidden width): per device once split;
        # its heads it infers from the width (view(..., -1, head size)), num_heads kept true anyway.
        # Embeddings, norms and the tied output layer stay whole on every device.
        assert isinstance(options, LanguageOptions)
        _, _, heads, intermediate = self.dimensions(options)
        layer = "model.transformer.h.*"
        styles: dict[str, TensorParallelStyle] = {
            f"{layer}.attn.c_attn": "colwise",
            f"{layer}.attn.c_proj": "rowwise",
            f"{layer}.mlp.c_fc": "colwise",
            f"{layer}.mlp.c_proj": "rowwise",
        }
        return TensorParallelPlan(
            styles=styles,
            head_count_attributes={f"{layer}.attn": ("num_heads", "split_size")},
            divided={"attention heads": heads, "MLP width": intermediate},
            fused_parts={f"{layer}.attn.c_attn": 3},
            transposed=tuple(styles),
        )

    def tally(self, o: Any, framework: Framework) -> Tally:
        hidden, _, _, _ = self.dimensions(o)
        tokens = self.tokens_per_sample(o)
        t = Tally()
        t.params((self.vocabulary_of(o) + self.positions(o)) * hidden)  # token and position embeddings
        self.encoder_layers(t, o)
        t.params(2 * hidden)  # final layer norm
        t.matmul(hidden * self.vocabulary_of(o) * tokens)  # output layer, its weights are the token embeddings
        return t

    def torch_model(self, o: LanguageOptions) -> Any:
        transformers = self.load(Framework.torch)
        hidden, layers, heads, intermediate = self.dimensions(o)
        config = transformers.GPT2Config(
            vocab_size=self.vocabulary_of(o),
            n_positions=self.positions(o),
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=intermediate,
            **gpt_token_ids(self.vocabulary_of(o)),
        )
        return token_logits_module(transformers.GPT2LMHeadModel(config))

    def loss(self) -> Any:
        return causal_lm_loss

    def token_loss_sums(self) -> Any:
        return causal_lm_loss_sums


class Gpt2Small(Gpt2):
    name: ClassVar[str] = "gpt2-124m"
    description: ClassVar[str] = "GPT-2 124M decoder, causal language modelling"
    architecture: ClassVar[str] = "GPT-2 small: 12 layers, hidden 768, 12 heads, context 1024"
    full: ClassVar[tuple[int, int, int, int]] = (768, 12, 12, 3072)
    sequence_length: ClassVar[int] = 1024
    default_micro_batch_size: ClassVar[int] = 8


class Gpt2Caraml117m(Gpt2):
    """CARAML's IPU GPT: Graphcore's GPT-2 small ("117M", the GPT-2 paper's name; 124,451,328
    parameters with Graphcore's vocabulary of 50272)."""

    name: ClassVar[str] = "gpt2-117m"
    description: ClassVar[str] = "GPT-2 117M as CARAML ran it on IPUs (Graphcore's configuration), causal LM"
    architecture: ClassVar[str] = "GPT-2 small: 12 layers, hidden 768, 12 heads, context 1024, vocabulary 50272"
    vocabulary: ClassVar[int] = GRAPHCORE_GPT2_VOCABULARY
    full: ClassVar[tuple[int, int, int, int]] = (768, 12, 12, 3072)
    sequence_length: ClassVar[int] = 1024
    default_micro_batch_size: ClassVar[int] = 1


class GptCaraml800m(LanguageWorkload):
    """CARAML's 800M GPT as Megatron-LM builds it (llm_benchmark_nvidia_amd.yaml): 16 layers,
    hidden 2048, 8 heads, sequence 2048, MLP 4x with GeLU, biases, pre-norm layers, rotary
    position embeddings over the whole head (no position table), output layer tied to the token
    embeddings, GPT-2's vocabulary padded to 50304. transformers' GPT-NeoX is that network
    (with ``rotary_pct=1`` and sequential residuals); attention runs in PyTorch's fused kernel (SDPA)."""

    name: ClassVar[str] = "gpt-800m"
    description: ClassVar[str] = "CARAML's 800M GPT (Megatron-LM: rotary embeddings, SDPA), causal LM"
    architecture: ClassVar[str] = (
        "Megatron GPT 800M: 16 layers, hidden 2048, 8 heads, MLP 8192, rotary, tied output, vocabulary 50304"
    )
    task: ClassVar[str] = "language-modeling"
    options_model: ClassVar[type[BaseModel]] = GptOptions
    vocabulary: ClassVar[int] = MEGATRON_GPT2_VOCABULARY
    full: ClassVar[tuple[int, int, int, int]] = (2048, 16, 8, 8192)
    sequence_length: ClassVar[int] = 2048
    default_micro_batch_size: ClassVar[int] = 4
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("GPTNeoXForCausalLM")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    pipeline_blocks: ClassVar[str | None] = r"\.gpt_neox\.layers\.\d+$"
    pipeline_unit: ClassVar[str] = "decoder layer"
    pipeline_repeated_layers: ClassVar[bool] = True

    def positions(self, o: LanguageOptions) -> int:
        return 0  # rotary: no position table

    def pipeline_stage(self) -> Any:
        return gpt_neox_stage

    def tensor_parallel_plan(self, options: BaseModel) -> TensorParallelPlan:
        # Megatron's split of a GPT-NeoX layer: the fused query/key/value projection by output
        # features (its rows are head after head, each head's q, k and v together, so a device
        # holds whole heads) and the attention's output by input features; the MLP likewise. The
        # attention reshapes by the tensor's width (view(..., -1, 3 x head size)), so no head count
        # is stored per device. Embeddings, norms and the tied output layer stay whole on every device.
        assert isinstance(options, LanguageOptions)
        _, _, heads, intermediate = self.dimensions(options)
        layer = "model.gpt_neox.layers.*"
        return TensorParallelPlan(
            styles={
                f"{layer}.attention.query_key_value": "colwise",
                f"{layer}.attention.dense": "rowwise",
                f"{layer}.mlp.dense_h_to_4h": "colwise",
                f"{layer}.mlp.dense_4h_to_h": "rowwise",
            },
            divided={"attention heads": heads, "MLP width": intermediate},
            # Megatron's sequence parallelism: the norms, dropouts and residual sums of a layer hold
            # 1/t of the sequence; the attention and the MLP gather it whole first.
            sequence_parallel=SequenceParallelPlan(
                layers="model.gpt_neox.layers",
                norms=(f"{layer}.input_layernorm", f"{layer}.post_attention_layernorm"),
                gathered=(f"{layer}.attention", f"{layer}.mlp"),
            ),
        )

    def tally(self, o: Any, framework: Framework) -> Tally:
        hidden, _, _, _ = self.dimensions(o)
        tokens = self.tokens_per_sample(o)
        t = Tally()
        t.params(self.vocabulary_of(o) * hidden)  # token embeddings, also the output layer
        self.encoder_layers(t, o)
        t.params(2 * hidden)  # final layer norm
        t.matmul(hidden * self.vocabulary_of(o) * tokens)  # output layer
        return t

    def torch_model(self, o: LanguageOptions) -> Any:
        transformers = self.load(Framework.torch)
        hidden, layers, heads, intermediate = self.dimensions(o)
        config = transformers.GPTNeoXConfig(
            vocab_size=self.vocabulary_of(o),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            hidden_act="gelu",
            max_position_embeddings=self.tokens_per_sample(o),
            rotary_pct=1.0,  # Megatron rotates the whole head; transformers' default is a quarter
            rotary_emb_base=10000,
            use_parallel_residual=False,  # Megatron's layers are sequential
            tie_word_embeddings=True,
            attention_bias=True,
            attn_implementation="sdpa",
        )
        return token_logits_module(transformers.GPTNeoXForCausalLM(config))

    def loss(self) -> Any:
        return causal_lm_loss

    def token_loss_sums(self) -> Any:
        return causal_lm_loss_sums


def gpt_neox_stage(model: Any, blocks: range, first: bool, last: bool) -> Any:
    """One pipeline stage of :func:`token_logits_module`'s GPT-NeoX: the token embeddings (first stage),
    the decoder layers ``blocks``, the final norm and output layer (last stage), as GPTNeoXModel's
    forward runs them. What other stages hold is replaced by ``nn.Identity``, so the stage keeps the
    model's parameter names and only its own weights; the output layer, tied to the embeddings, is the
    last stage's copy of that weight (the executor sums the two copies' gradients)."""
    import torch
    from torch import nn
    from transformers.masking_utils import create_causal_mask

    causal_lm = model.model
    neox = causal_lm.gpt_neox
    for index in range(len(neox.layers)):
        if index not in blocks:
            neox.layers[index] = nn.Identity()
    if not first:
        neox.embed_in = nn.Identity()
    if not last:
        neox.final_layer_norm = nn.Identity()
        causal_lm.lm_head = nn.Identity()

    class GptNeoXStage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = causal_lm  # the name token_logits_module gives it: parameter names unchanged

        def forward(self, inputs: Any) -> Any:
            hidden = neox.emb_dropout(neox.embed_in(inputs)) if first else inputs
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            mask = create_causal_mask(
                config=neox.config,
                inputs_embeds=hidden,
                attention_mask=None,
                past_key_values=None,
                position_ids=positions,
            )
            embeddings = neox.rotary_emb(hidden, position_ids=positions)
            for index in blocks:
                hidden = neox.layers[index](
                    hidden, attention_mask=mask, position_ids=positions, position_embeddings=embeddings
                )
            if not last:
                return hidden
            return causal_lm.lm_head(neox.final_layer_norm(hidden))

    return GptNeoXStage()


class GptCaraml13b(GptCaraml800m):
    """CARAML's 13B GPT (llm_benchmark_nvidia_amd.yaml, model index 1): Megatron-LM's GPT of 40 layers,
    hidden 5120, 32 heads (CARAML's ``nheads``; GPT-3's 13B has 40 of 128 wide, the same weights),
    MLP 20480 (``--ffn-hidden-size``), sequence 2048, vocabulary 50304; the 800M's network otherwise.
    CARAML trained it with tensor and pipeline parallelism 2 on 44 nodes of 4 GPUs, micro-batch 2,
    64 micro-batches per update."""

    name: ClassVar[str] = "gpt-13b"
    description: ClassVar[str] = "CARAML's 13B GPT (Megatron-LM's sizes: 40 layers, hidden 5120), causal LM"
    architecture: ClassVar[str] = (
        "Megatron GPT 13B: 40 layers, hidden 5120, 32 heads, MLP 20480, rotary, tied output, vocabulary 50304"
    )
    full: ClassVar[tuple[int, int, int, int]] = (5120, 40, 32, 20480)
    default_micro_batch_size: ClassVar[int] = 2


class GptCaraml175b(GptCaraml800m):
    """CARAML's 175B GPT (llm_benchmark_nvidia_amd.yaml, model index 2): GPT-3 175B's sizes as Megatron-LM
    builds them (Narayanan et al. 2021, Table 1): 96 layers, hidden 12288, 96 heads, MLP 49152,
    sequence 2048, vocabulary 50304. CARAML trained it with tensor and pipeline parallelism 8 on 16
    nodes of 4 GPUs, micro-batch 2, 64 micro-batches per update, in bf16."""

    name: ClassVar[str] = "gpt-175b"
    description: ClassVar[str] = "CARAML's 175B GPT (GPT-3's sizes: 96 layers, hidden 12288), causal LM"
    architecture: ClassVar[str] = (
        "Megatron GPT 175B: 96 layers, hidden 12288, 96 heads, MLP 49152, rotary, tied output, vocabulary 50304"
    )
    full: ClassVar[tuple[int, int, int, int]] = (12288, 96, 96, 49152)
    default_micro_batch_size: ClassVar[int] = 2


class Gpt2Caraml800m(Gpt2):
    name: ClassVar[str] = "gpt2-800m"
    description: ClassVar[str] = (
        "GPT-2 style decoder of CARAML's 800M size (learned positions; CARAML's own model is gpt-800m)"
    )
    architecture: ClassVar[str] = (
        "CARAML's 800M GPT as a GPT-2 style decoder: 16 layers, hidden 2048, 8 heads, "
        "context 2048 (800M without embeddings)"
    )
    full: ClassVar[tuple[int, int, int, int]] = (2048, 16, 8, 8192)
    sequence_length: ClassVar[int] = 2048
    default_micro_batch_size: ClassVar[int] = 4


# --- BERT ------------------------------------------------------------------------------------


def masked_positions(tokens: Any) -> Any:
    """Which positions a masked language model predicts: a fixed hash of each token and its position,
    so that the model and the loss agree without sharing state, and every run masks the same
    positions of the same data (BERT's own pre-training data was masked once, statically)."""
    import torch

    positions = torch.arange(tokens.shape[-1], device=tokens.device)
    mixed = (tokens.long() * 2654435761 + positions * 40503 + 12345) % 1000
    return mixed < int(MASKED_FRACTION * 1000)


def masked_lm_loss(logits: Any, tokens: Any) -> Any:
    """Mean cross-entropy over the masked positions (-100 elsewhere)."""
    import torch
    from torch.nn import functional

    mask = masked_positions(tokens)
    labels = torch.where(mask, tokens, torch.full_like(tokens, IGNORE_INDEX))
    total = functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / mask.sum().clamp(min=1)


class BertFamily(LanguageWorkload):
    """BERT-base's encoder (Devlin et al. 2019): what the pre-training and the SQuAD workloads share."""

    options_model: ClassVar[type[BaseModel]] = MaskedLanguageOptions
    vocabulary: ClassVar[int] = BERT_VOCABULARY
    full: ClassVar[tuple[int, int, int, int]] = (768, 12, 12, 3072)
    context: ClassVar[int] = 512
    pipeline_blocks: ClassVar[str | None] = r"\.bert\.encoder\.layer\.\d+$"
    pipeline_unit: ClassVar[str] = "encoder layer"
    pipeline_repeated_layers: ClassVar[bool] = True

    def positions(self, o: LanguageOptions) -> int:
        return max(self.tokens_per_sample(o), self.context)

    def tensor_parallel_plan(self, options: BaseModel) -> TensorParallelPlan:
        # Megatron's split of a BERT layer: query, key and value (three nn.Linear) by output
        # features, the attention's output by input features; the MLP (intermediate, output)
        # likewise. The attention reshapes by the tensor's width (view(..., -1, head size)); its
        # stored head count and width are made per device anyway, so an attention implementation
        # that reads them sees the device's heads. Embeddings, norms and the heads stay whole.
        assert isinstance(options, LanguageOptions)
        _, _, heads, intermediate = self.dimensions(options)
        layer = "model.bert.encoder.layer.*"
        return TensorParallelPlan(
            styles={
                f"{layer}.attention.self.query": "colwise",
                f"{layer}.attention.self.key": "colwise",
                f"{layer}.attention.self.value": "colwise",
                f"{layer}.attention.output.dense": "rowwise",
                f"{layer}.intermediate.dense": "colwise",
                # the layer's own output (index then ".output"), not the attention's output above
                f"{layer}[0-9].output.dense": "rowwise",
            },
            head_count_attributes={f"{layer}.attention.self": ("num_attention_heads", "all_head_size")},
            divided={"attention heads": heads, "MLP width": intermediate},
        )

    def non_embedding_parameters(self, o: LanguageOptions) -> int:
        hidden, _, _, _ = self.dimensions(o)
        return self.parameter_count(o) - (self.vocabulary + self.positions(o) + 2) * hidden

    def encoder_tally(self, o: LanguageOptions) -> Tally:
        """Embeddings (word, position, two token types, their norm) and the encoder layers."""
        hidden, _, _, _ = self.dimensions(o)
        t = Tally()
        t.params((self.vocabulary + self.positions(o) + 2) * hidden + 2 * hidden)
        self.encoder_layers(t, o)
        return t

    def bert_config(self, o: LanguageOptions, **head: Any) -> Any:
        transformers = self.load(Framework.torch)
        hidden, layers, heads, intermediate = self.dimensions(o)
        return transformers, transformers.BertConfig(
            vocab_size=self.vocabulary,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=self.positions(o),
            **head,
        )


class BertBase(BertFamily):
    """BERT-base (Devlin et al. 2019) with its masked-language-model head (transformers' BertForMaskedLM).
    15 % of positions are replaced by [MASK] inside the model and predicted; the head, as in
    transformers, scores every position."""

    name: ClassVar[str] = "bert-base"
    description: ClassVar[str] = "BERT-base, masked language modelling"
    architecture: ClassVar[str] = "BERT-base: 12 layers, hidden 768, 12 heads, MLP 3072, WordPiece 30522"
    task: ClassVar[str] = "masked-language-modeling"
    sequence_length: ClassVar[int] = 128
    default_micro_batch_size: ClassVar[int] = 32
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("BertForMaskedLM")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)

    def tally(self, o: Any, framework: Framework) -> Tally:
        hidden, _, _, _ = self.dimensions(o)
        tokens = self.tokens_per_sample(o)
        t = self.encoder_tally(o)
        t.linear(hidden, hidden, tokens=tokens)  # prediction head transform
        t.params(2 * hidden)  # and its layer norm
        t.matmul(hidden * self.vocabulary * tokens)  # decoder, tied to the word embeddings
        t.params(self.vocabulary)  # decoder bias
        return t

    def torch_model(self, o: LanguageOptions) -> Any:
        transformers, config = self.bert_config(o)
        return masked_token_logits_module(transformers.BertForMaskedLM(config))

    def loss(self) -> Any:
        return masked_lm_loss


def token_logits_module(model: Any) -> Any:
    from torch import nn

    class TokenLogits(nn.Module):
        """``module(token_ids)`` returns logits [batch, sequence, vocabulary]."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens: Any) -> Any:
            return self.model(input_ids=tokens, use_cache=False).logits

    return TokenLogits()


def masked_token_logits_module(model: Any) -> Any:
    import torch
    from torch import nn

    class MaskedTokenLogits(nn.Module):
        """Replaces the masked positions by [MASK], then returns logits for every position."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens: Any) -> Any:
            masked = torch.where(masked_positions(tokens), torch.full_like(tokens, BERT_MASK_TOKEN), tokens)
            return self.model(input_ids=masked).logits

    return MaskedTokenLogits()


class BertBaseSquad(BertFamily):
    """BERT-base fine-tuned for SQuAD question answering, as ACES ran it on IPUs (Table 2):
    transformers' BertForQuestionAnswering (no pooler; a start and an end score per position).
    A synthetic sample is a sequence of token ids and its answer's start and end positions; the
    loss is the mean of the start and end cross-entropies, as transformers computes it."""

    name: ClassVar[str] = "bert-base-squad"
    description: ClassVar[str] = "BERT-base, SQuAD question-answering fine-tuning"
    architecture: ClassVar[str] = "BERT-base + QA head: 12 layers, hidden 768, 12 heads, sequence 384"
    task: ClassVar[str] = "question-answering"
    #: answers need labels a token file does not have: synthetic data only
    data_formats: ClassVar[tuple[str, ...] | None] = ()
    #: Graphcore's SQuAD base configuration (nlp/bert/pytorch/configs_squad.yml, squad_base_384)
    sequence_length: ClassVar[int] = 384
    default_micro_batch_size: ClassVar[int] = 16
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("BertForQuestionAnswering")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)

    def recommended_pipeline_splits(self, options: Any, blocks: tuple[str, ...]) -> dict[int, RecommendedSplit]:
        # Graphcore's SQuAD fine-tuning of BERT-base on four IPUs per replica (ACES Table 2's run).
        return layers_per_stage_recommendation(
            blocks,
            (0, 4, 4, 4),
            "graphcore/examples nlp/bert/pytorch/configs_squad.yml (squad_base_384: layers_per_ipu 0,4,4,4)",
        )

    def tally(self, o: Any, framework: Framework) -> Tally:
        hidden, _, _, _ = self.dimensions(o)
        t = self.encoder_tally(o)
        t.linear(hidden, SQUAD_POSITIONS, tokens=self.tokens_per_sample(o))  # start and end scores
        return t

    def transformer_shape(self, options: Any) -> TransformerShape:
        # per token, a start and an end score instead of a vocabulary's
        return dataclasses.replace(super().transformer_shape(options), vocabulary=SQUAD_POSITIONS)

    def torch_model(self, o: LanguageOptions) -> Any:
        transformers, config = self.bert_config(o, num_labels=SQUAD_POSITIONS)
        return answer_logits_module(transformers.BertForQuestionAnswering(config))

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch

        assert isinstance(options, LanguageOptions)
        model = seeded(seed, lambda: self.torch_model(options))
        model.train()
        tokens = self.token_pool(options, seed)
        generator = torch.Generator().manual_seed(seed + 2)
        starts = torch.randint(0, tokens.shape[1], (tokens.shape[0],), generator=generator)
        lengths = torch.randint(0, 30, (tokens.shape[0],), generator=generator)  # SQuAD answers are short
        ends = torch.minimum(starts + lengths, torch.tensor(tokens.shape[1] - 1))
        return TorchTrainingSpec(
            model=model,
            loss_fn=answer_span_loss,
            make_optimizer=lambda params: torch.optim.AdamW(params, lr=ADAMW_LEARNING_RATE),
            inputs=tokens,
            targets=torch.stack([starts, ends], dim=1),
            vocabulary=self.vocabulary,
            pipeline_layout=self.pipeline_layout(options),  # its layers, for recomputation
            tensor_parallel_plan=self.tensor_parallel_plan(options),
        )


def answer_span_loss(logits: Any, answers: Any) -> Any:
    """Mean of the start and the end positions' cross-entropy (transformers' QA loss)."""
    from torch.nn import functional

    start = functional.cross_entropy(logits[..., 0], answers[:, 0])
    end = functional.cross_entropy(logits[..., 1], answers[:, 1])
    return (start + end) / 2


def answer_logits_module(model: Any) -> Any:
    import torch
    from torch import nn

    class AnswerLogits(nn.Module):
        """``module(token_ids)`` returns [batch, sequence, 2]: each position's start and end scores."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens: Any) -> Any:
            output = self.model(input_ids=tokens)
            return torch.stack([output.start_logits, output.end_logits], dim=-1)

    return AnswerLogits()


LANGUAGE_WORKLOADS = (
    BertBase,
    BertBaseSquad,
    Gpt2Small,
    Gpt2Caraml117m,
    GptCaraml800m,
    GptCaraml13b,
    GptCaraml175b,
    Gpt2Caraml800m,
)
