"""Runs to a target quality with core's Keras executor (docs/to-target.md): digits reaches its target
with its curve, a missed target ends with its status, and the evaluation on fixed weights is the
model's own predictions over the held-out split, whether one replica or two (MirroredStrategy) take
it, or gradient accumulation splits the global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.api import run_here
from core.base.results import RunState

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
TRAINING_SAMPLES = 1437  # digits' 1,797 images less the 360 held out
UPDATES_PER_EPOCH = TRAINING_SAMPLES // 32


def test_keras_digits_reaches_its_target_with_its_curve() -> None:
    target = {"metric": "top1", "value": 0.9, "max_epochs": 30}
    result = run_here("digits", "cpu", framework="tensorflow", power_meter="none", target=target)
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None
    assert outcome.reached and outcome.stopped_by == "target"
    last = outcome.curve[-1]
    assert last.value >= 0.9 and all(point.value < 0.9 for point in outcome.curve[:-1])
    assert set(last.metrics) == {"top1", "loss"}
    # One evaluation per epoch of whole global batches, the last partial one dropped.
    assert [point.samples for point in outcome.curve] == [
        epoch * UPDATES_PER_EPOCH * 32 for epoch in range(1, len(outcome.curve) + 1)
    ]
    assert outcome.samples_to_target == last.samples and outcome.epochs_to_target == last.samples / TRAINING_SAMPLES
    assert outcome.time_to_target_seconds == last.seconds == outcome.training_seconds
    assert outcome.evaluation_seconds == pytest.approx(sum(point.evaluation_seconds for point in outcome.curve))
    assert outcome.initialization_seconds == result.setup_seconds
    assert result.samples_per_epoch == TRAINING_SAMPLES
    assert result.throughput_per_second is None  # no steady window: not faked


def test_keras_missed_target_ends_target_not_reached_keeping_the_curve() -> None:
    target = {"metric": "loss", "value": 0.0, "max_epochs": 1, "evaluate_every_samples": 448}
    result = run_here("digits", "cpu", framework="tensorflow", power_meter="none", target=target)
    outcome = result.to_target
    assert result.status.state is RunState.target_not_reached and outcome is not None
    assert not outcome.reached and outcome.stopped_by == "max_epochs"
    # 448 samples are 14 updates of 32; an epoch is 44: evaluations at 14, 28, 42 and 44 updates.
    assert [point.samples for point in outcome.curve] == [448, 896, 1344, UPDATES_PER_EPOCH * 32]
    assert outcome.time_to_target_seconds is None and outcome.energy_to_target_joules is None
    assert all(point.value > 0.0 for point in outcome.curve)


# One process, one TensorFlow start: the host CPU is split into two logical devices before TensorFlow's
# runtime starts, which the test's own process cannot promise (another test may have started it).
WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from core.base.config import make_config
    from core.executors.keras import KerasExecutor, KerasPlacement, split_host_cpu
    from core.workloads.digits import Digits, DigitsOptions

    devices = split_host_cpu(2)
    import tensorflow as tf

    def executor(replicas, micro, accumulation):
        config = make_config(workload="digits", accelerator="cpu", framework="tensorflow", replicas=replicas,
                             micro_batch_size=micro, gradient_accumulation=accumulation,
                             target={"metric": "top1", "value": 1.0, "max_epochs": 3})
        if replicas == 1:
            make = lambda: tf.distribute.OneDeviceStrategy("/cpu:0")
        else:
            make = lambda: tf.distribute.MirroredStrategy(devices=devices,
                                                          cross_device_ops=tf.distribute.ReductionToOneDevice())
        placement = KerasPlacement(make_strategy=make, replicas=replicas, device_label="/cpu:0")
        return KerasExecutor(Digits().build_keras(DigitsOptions(), seed=0), config, placement)

    def by_hand(model):
        spec = Digits().build_keras(DigitsOptions(), seed=0)
        logits = model.predict(spec.evaluation_inputs, batch_size=64, verbose=0).astype(np.float64)
        labels = spec.evaluation_targets
        top = logits.max(axis=1, keepdims=True)
        log_softmax = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        loss = -log_softmax[np.arange(len(labels)), labels].mean()
        return {"top1": float((logits.argmax(axis=1) == labels).mean()), "loss": float(loss)}

    curves, hand = {}, {}
    for name, shape in {"whole": (1, 32, 1), "replicated": (2, 16, 1), "accumulated": (1, 16, 2)}.items():
        run = executor(*shape)
        points = [run.evaluate()]  # the seeded weights, before any update
        hand[name] = by_hand(run.model)
        for _ in range(3):
            run.run_steps(1437 // 32)
            run.synchronize()
            points.append(run.evaluate())
        hand[name + "_trained"] = by_hand(run.model)
        curves[name] = points
        run.close()
    with open(sys.argv[1], "w") as out:
        json.dump({"curves": curves, "hand": hand}, out)
""")


def test_keras_evaluation_is_the_models_own_and_replicas_or_accumulation_keep_the_curve(tmp_path: Path) -> None:
    script, out = tmp_path / "worker.py", tmp_path / "curves.json"
    script.write_text(WORKER)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, str(script), str(out)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = json.loads(out.read_text())
    curves, hand = found["curves"], found["hand"]
    whole = curves["whole"]
    # Fixed weights: the evaluation is the model's own predictions, counted by hand (top-1 exactly; the
    # loss to fp32 rounding), for one replica and for two replicas' shards added up.
    for name in curves:
        assert curves[name][0]["top1"] == hand[name]["top1"]
        assert curves[name][0]["loss"] == pytest.approx(hand[name]["loss"], rel=1e-5)
        assert curves[name][-1]["top1"] == hand[name + "_trained"]["top1"]
        assert curves[name][-1]["loss"] == pytest.approx(hand[name + "_trained"]["loss"], rel=1e-5)
    # The same seeded weights before any update, whoever evaluates.
    assert curves["replicated"][0] == pytest.approx(whole[0], rel=1e-6)
    # The same global batches in the same order: the summed gradients differ by rounding only, so after
    # each epoch top-1 is within one held-out image (1/360) and the loss within 1%.
    assert whole[-1]["top1"] > whole[0]["top1"] + 0.5  # it trained
    for name in ("replicated", "accumulated"):
        for ours, theirs in zip(curves[name][1:], whole[1:]):
            assert abs(ours["top1"] - theirs["top1"]) <= 1 / 360 + 1e-12, name
            assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-2), name
