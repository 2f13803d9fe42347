"""The FCNN of the AI4NP paper: parameter count and FLOP accounting against the real model."""

from __future__ import annotations

import pytest

from core.workloads.fcnn import Fcnn, FcnnOptions, bias_count, weight_count


@pytest.mark.parametrize("layers,hidden,inputs,outputs", [(4, 32, 2000, 200), (1, 64, 32, 10), (3, 128, 40, 7)])
def test_phi_matches_the_models_weights(layers: int, hidden: int, inputs: int, outputs: int) -> None:
    options = FcnnOptions(layers=layers, hidden_width=hidden, input_width=inputs, output_width=outputs)
    model = Fcnn().build_torch(options, seed=0).model
    weights = sum(p.numel() for name, p in model.named_parameters() if name.endswith("weight"))
    biases = sum(p.numel() for name, p in model.named_parameters() if name.endswith("bias"))
    # The paper's formula, written out independently of the implementation.
    phi = hidden**2 * (layers - 1) + hidden * (inputs + outputs)
    assert weights == phi == Fcnn().parameter_count(options) == weight_count(options)
    assert biases == layers * hidden + outputs == bias_count(options)


def test_flops_per_update_is_six_phi_bs() -> None:
    options = FcnnOptions(layers=8, hidden_width=8192, input_width=8000, output_width=1000)
    phi = 8192**2 * 7 + 8192 * 9000
    assert Fcnn().flops_per_sample(options) * 16384 == 6 * phi * 16384


def test_the_same_seed_builds_the_same_model_and_data() -> None:
    options = FcnnOptions(layers=2, hidden_width=16, input_width=8, output_width=4, synthetic_pool_samples=32)
    a, b = Fcnn().build_torch(options, seed=3), Fcnn().build_torch(options, seed=3)
    c = Fcnn().build_torch(options, seed=4)
    first = lambda spec: next(spec.model.parameters())  # noqa: E731
    assert (first(a) == first(b)).all() and not (first(a) == first(c)).all()
    assert (a.inputs == b.inputs).all() and (a.targets == b.targets).all()
    assert a.targets.max() < 4 and a.inputs.shape == (32, 8)
