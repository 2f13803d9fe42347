"""Pipelining the papers' models over several IPUs per replica: the workloads' own blocks, split points
as options, Graphcore's "layers per IPU", the published splits, refusal while planning (before any
model is built), and the stages the fake PopTorch compiler places each layer on."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from core import ConfigError, run
from core.base.distributed import SINGLE_PROCESS
from core.contract.manager import get_plugin_manager
from core.contract.pipeline import PipelineLayout, RecommendedSplit
from core.running.planning import plan_run
from core.workloads.fcnn import Fcnn
from core_plugins.graphcore.pipeline import choose_split_points

pytestmark = pytest.mark.usefixtures("fake_sdk")

LAYERS = tuple(f"model.encoder.layer.{i}" for i in range(12))
BERT_LIKE = PipelineLayout(
    LAYERS, "encoder layer", repeated_layers=True, recommended={4: RecommendedSplit(LAYERS[0:12:4], "a paper")}
)
CNN_LIKE = PipelineLayout(tuple(f"blocks.{i}" for i in range(8)), "block")


# --- choosing split points (no model) -------------------------------------------------------------


def test_layers_per_ipu_as_graphcore_spells_it() -> None:
    choice = choose_split_points(BERT_LIKE, 4, "", "0,4,4,4")
    assert choice.split_points == (LAYERS[0], LAYERS[4], LAYERS[8]) and choice.rule == "layers_per_ipu 0,4,4,4"
    assert BERT_LIKE.layers_per_stage(choice.split_points) == (0, 4, 4, 4)
    assert choose_split_points(BERT_LIKE, 4, "", "3,3,3,3").split_points == (LAYERS[3], LAYERS[6], LAYERS[9])


@pytest.mark.parametrize(
    "layers_per_ipu,says",
    [
        ("0,4,4,5", "add up to 13; the model has 12 encoder layers"),
        ("4,0,4,4", "every stage after the first needs at least one encoder layer"),
        ("0,6,6", "one count per IPU of a replica: 4"),
        ("0,4,four,4", "comma-separated whole numbers"),
        ("-1,5,4,4", "cannot be negative"),
    ],
)
def test_impossible_layers_per_ipu_are_refused_saying_why(layers_per_ipu: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        choose_split_points(BERT_LIKE, 4, "", layers_per_ipu)
    assert refused.value.field == "accelerator_options.layers_per_ipu" and says in str(refused.value)


def test_split_points_must_be_the_workloads_blocks_in_order() -> None:
    assert choose_split_points(CNN_LIKE, 3, "blocks.2, blocks.5", "").split_points == ("blocks.2", "blocks.5")
    for bad, says in [
        ("blocks.5,blocks.2", "execution order"),
        ("blocks.2,blocks.2", "distinct"),
        ("blocks.2,stem", "stem: not a block of the model"),
        ("blocks.2", "3 stages (devices_per_replica) need 2 split point(s)"),
    ]:
        with pytest.raises(ConfigError) as refused:
            choose_split_points(CNN_LIKE, 3, bad, "")
        assert refused.value.field == "accelerator_options.pipeline_splits" and says in str(refused.value)
        assert "blocks.0, blocks.1" in str(refused.value)  # the valid points are named


def test_layers_per_ipu_needs_identical_layers_and_not_both_forms() -> None:
    with pytest.raises(ConfigError, match="use pipeline_splits"):
        choose_split_points(CNN_LIKE, 2, "", "4,4")
    with pytest.raises(ConfigError, match="not both"):
        choose_split_points(BERT_LIKE, 4, "model.encoder.layer.4", "0,4,4,4")


def test_the_published_split_is_the_default_else_balanced_and_too_many_stages_refused() -> None:
    assert choose_split_points(BERT_LIKE, 4, "", "").rule == "recommended: a paper"
    assert choose_split_points(BERT_LIKE, 3, "", "").split_points is None  # balanced once built
    with pytest.raises(ConfigError) as refused:
        choose_split_points(CNN_LIKE, 10, "", "")
    assert refused.value.field == "devices_per_replica" and "at most 9 pipeline stages" in str(refused.value)


# --- the zoo's layouts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workload,blocks,recommended",
    [
        ("bert-base-squad", 12, {4: (0, 4, 4, 4)}),
        ("gpt2-117m", 12, {4: (0, 4, 4, 4)}),
        ("gpt2-124m", 12, {4: (0, 4, 4, 4)}),
        ("bert-base", 12, {}),
        ("gpt-800m", 16, {}),
        # Graphcore's blocks/1/1, blocks/3/0, blocks/4/5 in timm's per-stage numbering (B4's stages
        # hold 2, 4, 4, 6, 6, 8, 2 blocks) are blocks 3, 10 and 21 of transformers' flat list.
        ("efficientnet-b4", 32, {4: (3, 7, 11, 11)}),
        ("efficientnet-b0", 16, {2: (5, 11)}),
        # The G16-GN variants, which these splits were published for, have the same blocks.
        ("efficientnet-b4-g16-gn", 32, {4: (3, 7, 11, 11)}),
        ("efficientnet-b0-g16-gn", 16, {2: (5, 11)}),
        ("resnet50", 16, {}),
    ],
)
def test_zoo_layouts_are_paths_the_built_model_has(workload: str, blocks: int, recommended: dict) -> None:
    import torch

    zoo = get_plugin_manager().workload(workload)
    options = zoo.parse_options({})
    layout = zoo.pipeline_layout(options)
    assert layout is not None and len(layout.blocks) == blocks
    with torch.device("meta"):
        modules = dict(zoo.build_torch(options, 0).model.named_modules())
    assert all(block in modules for block in layout.blocks)
    assert {
        stages: layout.layers_per_stage(split.split_points) for stages, split in layout.recommended.items()
    } == recommended
    assert all("graphcore/examples" in split.source for split in layout.recommended.values())


# --- refused while planning, before the model is built ---------------------------------------------


def test_an_impossible_split_is_refused_while_planning_without_building(monkeypatch: pytest.MonkeyPatch) -> None:
    zoo = get_plugin_manager().workload("bert-base-squad")
    monkeypatch.setattr(type(zoo), "build_torch", lambda *a: pytest.fail("built the model"))
    with pytest.raises(ConfigError) as refused:
        plan_run(
            get_plugin_manager(),
            "bert-base-squad",
            "graphcore",
            {
                "devices_per_replica": 4,
                "gradient_accumulation": 8,
                "micro_batch_size": 1,
                "accelerator_options": {"layers_per_ipu": "0,4,4,5", "ipu_model": True},
            },
        )
    assert refused.value.field == "accelerator_options.layers_per_ipu"


# --- compiled on the fake PopTorch: the stages hold the layers asked for -----------------------------


def compile_pipelined(workload: str, workload_options: dict[str, Any], **settings: Any) -> tuple[Any, dict]:
    """The training executor built as the run's setup would, compiled; (executor, module -> IPU)."""
    settings = {"power_meter": "none", "workload_options": workload_options, **settings}
    plan = plan_run(get_plugin_manager(), workload, "graphcore", settings)
    executor = plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS))
    executor.training_model.compile(executor._inputs, executor._targets)
    return executor, executor.training_model._executable


def ipu_of(executable: dict, path: str) -> int:
    """The IPU the fake compiler ran ``path`` (of the workload's model) on."""
    return int(executable["module_ipus"][f"model.{path}"])


@pytest.mark.slow
def test_bert_base_squad_on_four_ipus_holds_zero_four_four_four_layers() -> None:
    # ACES Table 2: BERT-base SQuAD fine-tuning on 4 IPUs per replica; Graphcore's squad_base_384
    # (micro-batch 1, device iterations 2, gradient accumulation 8, layers_per_ipu 0,4,4,4).
    executor, executable = compile_pipelined(
        "bert-base-squad",
        {"sequence_length": 32, "synthetic_pool_samples": 16},
        devices_per_replica=4,
        micro_batch_size=1,
        gradient_accumulation=8,
        device_iterations=2,
    )
    try:
        assert executable["stages"] == 4 and executable["ipus_per_replica"] == 4
        layers = [ipu_of(executable, f"model.bert.encoder.layer.{i}") for i in range(12)]
        assert layers == [1] * 4 + [2] * 4 + [3] * 4
        assert ipu_of(executable, "model.bert.embeddings") == 0
        assert ipu_of(executable, "model.qa_outputs") == 3  # the head follows the last layer
        plan = executor.details()
        assert plan["pipeline_balanced_by"].startswith("recommended: graphcore/examples nlp/bert/pytorch")
        assert [stage["layers"] for stage in plan["pipeline_stage_plan"]] == [0, 4, 4, 4]
        embeddings = plan["pipeline_stage_plan"][0]["parameters"]
        assert embeddings == sum(p.numel() for p in executor._user_model.model.bert.embeddings.parameters())
    finally:
        executor.close()


@pytest.mark.slow
def test_gpt2_117m_over_four_ipus_as_caraml_ran_it() -> None:
    executor, executable = compile_pipelined(
        "gpt2-117m",
        {"sequence_length": 32, "synthetic_pool_samples": 16},
        devices_per_replica=4,
        micro_batch_size=1,
        gradient_accumulation=16,
        accelerator_options={"layers_per_ipu": "0,4,4,4"},
    )
    try:
        layers = [ipu_of(executable, f"model.transformer.h.{i}") for i in range(12)]
        assert layers == [1] * 4 + [2] * 4 + [3] * 4
        assert ipu_of(executable, "model.transformer.wte") == 0
        # Issue 28: the output layer shares the embedding's weight, so it runs on IPU 0 too, in a
        # stage of its own after the last (Graphcore's train_gpt2.py: BeginBlock(lm_head, ipu_id=0)).
        assert ipu_of(executable, "model.lm_head") == 0
        assert executable["stages"] == 5 and executable["ipus_per_replica"] == 4
        details = executor.details()
        assert details["pipeline_balanced_by"] == "layers_per_ipu 0,4,4,4"
        assert details["pipeline_tied_layers"] == [{"layer": "model.lm_head", "ipu": 0}]
    finally:
        executor.close()


def test_a_tied_output_layer_adds_a_pipeline_stage_that_gradient_accumulation_must_cover() -> None:
    # 4 IPUs and the tied head: 5 forward stages, 9 in training; accumulation 8 was enough without it.
    with pytest.raises(ConfigError) as refused:
        plan_run(
            get_plugin_manager(),
            "gpt2-117m",
            "graphcore",
            {
                "power_meter": "none",
                "devices_per_replica": 4,
                "micro_batch_size": 1,
                "gradient_accumulation": 8,
                "workload_options": {"sequence_length": 32},
            },
        )
    assert refused.value.field == "gradient_accumulation"
    assert "must be >= 2 x (devices_per_replica + 1) - 1 = 9" in str(refused.value)
    assert "tied to IPU 0's embedding" in str(refused.value)


def test_the_fake_compiler_refuses_a_weight_used_on_two_ipus() -> None:
    # PopTorch 3.3's user guide: layers that share weights must be placed on the same IPU.
    poptorch = pytest.importorskip("poptorch")
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding, self.head = embedding, head

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return poptorch.identity_loss(self.head(self.embedding(tokens)).sum(), reduction="none")

    model = Tied()
    poptorch.BeginBlock(model.embedding, user_id="0", ipu_id=0)
    poptorch.BeginBlock(model.head, user_id="1", ipu_id=1)
    options = poptorch.Options()
    options.Training.gradientAccumulation(4)
    options.useIpuModel(True)
    with pytest.raises(poptorch.Error, match="weight embedding.weight is used on IPUs \\[0, 1\\]"):
        poptorch.trainingModel(model, options).compile(torch.zeros(4, 3, dtype=torch.long))


@pytest.mark.slow
def test_efficientnet_b4_on_four_ipus_at_graphcores_splits() -> None:
    executor, executable = compile_pipelined(
        "efficientnet-b4",
        {"image_size": 64, "synthetic_pool_samples": 16},
        devices_per_replica=4,
        micro_batch_size=2,
        gradient_accumulation=8,
    )
    try:
        blocks = [ipu_of(executable, f"model.efficientnet.encoder.blocks.{i}") for i in range(32)]
        assert blocks == [0] * 3 + [1] * 7 + [2] * 11 + [3] * 11
        assert ipu_of(executable, "model.classifier") == 3
        assert [stage["layers"] for stage in executor.details()["pipeline_stage_plan"]] == [3, 7, 11, 11]
    finally:
        executor.close()


def test_a_balanced_split_of_resnet_blocks_compiles_on_two_ipus() -> None:
    executor, executable = compile_pipelined(
        "resnet50",
        {"variant": "small", "synthetic_pool_samples": 8},
        devices_per_replica=2,
        micro_batch_size=2,
        gradient_accumulation=3,
    )
    try:
        stages = executor.details()["pipeline_stage_plan"]
        assert executor.details()["pipeline_balanced_by"] == "parameter count (bottleneck blocks)"
        paths = [f"model.resnet.encoder.stages.{s}.layers.{b}" for s, n in enumerate((3, 4, 6, 3)) for b in range(n)]
        # By hand: the second IPU holds blocks k.. and the classifier; the best k minimises the larger half.
        model = executor._user_model
        modules = dict(model.named_modules())
        size = [sum(p.numel() for p in modules[path].parameters()) for path in paths]
        head = sum(p.numel() for p in model.model.classifier.parameters())
        total = sum(p.numel() for p in model.parameters())
        best = min(range(1, 16), key=lambda k: max(total - sum(size[k:]) - head, sum(size[k:]) + head))
        assert [stage["layers"] for stage in stages] == [best, 16 - best]
        assert (
            stages[1]["parameters"] == sum(size[best:]) + head
            and stages[0]["parameters"] == total - stages[1]["parameters"]
        )
        assert [ipu_of(executable, path) for path in paths] == [0] * best + [1] * (16 - best)
    finally:
        executor.close()


def test_a_workload_still_naming_split_points_the_old_way_works_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Fcnn, "pipeline_split_points", lambda self, options, stages: ["2"], raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run(
            "fcnn",
            "graphcore",
            workload_options={"layers": 4, "hidden_width": 16, "input_width": 8, "output_width": 4},
            micro_batch_size=4,
            devices_per_replica=2,
            gradient_accumulation=3,
            steps=1,
            warmup_steps=0,
            power_meter="none",
        )
    assert result.status.ok, result.status
    assert any(issubclass(w.category, DeprecationWarning) and "pipeline_layout" in str(w.message) for w in caught)
    assert result.executor_details["pipeline_stage_plan"][1]["first_layer"] == "2"


def test_a_dry_run_shows_the_layers_per_ipu_and_where_they_come_from() -> None:
    from core.machines import load_machine

    plan = plan_run(
        get_plugin_manager(),
        "bert-base-squad",
        "graphcore",
        {"devices_per_replica": 4, "gradient_accumulation": 8},
        machine=load_machine("ipu-pod16"),
    )
    shown = plan.accelerator.placement_summary(plan.context(SINGLE_PROCESS))["pipeline"]
    assert shown.startswith("encoder layers per IPU 0,4,4,4 (recommended: graphcore/examples nlp/bert/pytorch")


def _documented_commands() -> list[tuple[str, list[str]]]:
    """(machine, arguments) of each `core run` in docs/graphcore.md's "The papers' IPU runs as
    commands": ACES ran on an IPU-POD16, CARAML on an IPU-POD4 (the comment above each says which)."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "graphcore.md").read_text(encoding="utf-8")
    section = text.split("## The papers' IPU runs as commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    commands, machine = [], ""
    for line in block.group(1).replace("\\\n", " ").splitlines():
        if line.startswith("# "):
            machine = "ipu-pod4" if line.startswith("# CARAML") else "ipu-pod16"
        elif line.startswith("core run"):
            commands.append((machine, shlex.split(line)[1:]))
    return commands


@pytest.mark.parametrize("machine,command", _documented_commands(), ids=lambda value: str(value)[:40])
def test_every_documented_paper_command_plans_for_its_machine(machine: str, command: list[str]) -> None:
    from core.cli import main

    assert main([*command, "--dry-run", "--machine", machine]) == 0


# --- the TensorFlow path: the workload's Keras blocks ---------------------------------------------


@pytest.fixture
def ipu_tensorflow(fake_tf_ipu: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from core_plugins.graphcore import accelerator as graphcore_accelerator

    monkeypatch.setattr(graphcore_accelerator, "_tensorflow_is_graphcore_build", lambda: True)
    return fake_tf_ipu


@pytest.mark.tensorflow
def test_keras_splits_must_be_a_workloads_block_and_are_refused_while_planning(ipu_tensorflow: Any) -> None:
    settings = {
        "framework": "tensorflow",
        "devices_per_replica": 2,
        "gradient_accumulation": 4,
        "workload_options": {"variant": "small"},
        "accelerator_options": {"pipeline_splits": "conv3_block2_2_conv"},  # inside a block, not its start
    }
    with pytest.raises(ConfigError) as refused:
        plan_run(get_plugin_manager(), "resnet50", "graphcore", settings)
    assert refused.value.field == "accelerator_options.pipeline_splits"
    assert "conv2_block1_1_conv" in str(refused.value) and "16 bottleneck blocks" in str(refused.value)


@pytest.mark.tensorflow
@pytest.mark.slow
def test_keras_efficientnet_b4_is_pipelined_at_graphcores_blocks(ipu_tensorflow: Any) -> None:
    settings = {
        "framework": "tensorflow",
        "devices_per_replica": 4,
        "gradient_accumulation": 8,
        "micro_batch_size": 1,
        "power_meter": "none",
        "workload_options": {"image_size": 64, "synthetic_pool_samples": 8},
    }
    plan = plan_run(get_plugin_manager(), "efficientnet-b4", "graphcore", settings)
    executor = plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS))
    try:
        details = executor.details()
        assert details["pipeline_balanced_by"].startswith("recommended: graphcore/examples vision/cnns")
        ((_, assignment),) = [c[:2] for c in ipu_tensorflow._keras.calls if c[0] == "set_pipeline_stage_assignment"]
        names = [a.layer.name for a in executor.model.get_pipeline_stage_assignment()]
        # Graphcore's blocks/1/1, blocks/3/0, blocks/4/5 (timm's stages 0-6) are Keras' block2b, block4a
        # and block5f (its stages 1-7): stages begin at their first layers.
        starts = [names[assignment.index(stage)] for stage in (1, 2, 3)]
        assert starts == ["block2b_expand_conv", "block4a_expand_conv", "block5f_expand_conv"]
        assert assignment == sorted(assignment)
    finally:
        executor.close()
