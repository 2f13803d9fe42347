"""The tests a plugin author writes, with core's helpers. Run them with pytest from this directory
(docs/example-plugin) after installing core; the plugin need not be installed."""

from __future__ import annotations

import core_example_plugin

import core.workloads
from core.testing import registered_plugins, run_tiny


def test_example_cpu_runs_the_example_workload() -> None:
    # entry_points=False: exactly these plugins, whether or not this package is also installed.
    with registered_plugins(core.workloads, core_example_plugin, entry_points=False):
        result = run_tiny("example-mlp", "example-cpu")
    assert result.throughput_per_second > 0
    assert result.executor_details["torch_num_threads"] == 1


def test_example_cpu_runs_the_builtin_fcnn_in_bf16() -> None:
    with registered_plugins(core.workloads, core_example_plugin, entry_points=False):
        result = run_tiny("fcnn", "example-cpu", precision="bf16")
    assert result.executor_details["autocast_dtype"] == "bfloat16"


def test_example_workload_counts_every_parameter() -> None:
    workload = core_example_plugin.ExampleMlp()
    options = workload.parse_options({"input_width": 5, "hidden_width": 7, "output_width": 3})
    model = workload.build_torch(options, seed=0).model
    assert workload.parameter_count(options) == sum(p.numel() for p in model.parameters())
    assert workload.flops_per_sample(options) == 6 * (5 * 7 + 7 * 3)
