"""Rooflines: the peak tables' bandwidths, the CPU's derived roofs, the FCNN's bytes per sample, the
roofline arithmetic at hand-computed points, results that carry them, and the report's plots."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import synthetic_result

from core.base.config import Precision, make_config
from core.base.results import DeviceRecord, RunResult
from core.report import write_report
from core.report.heatmap import build_heatmap
from core.report.roofline import Roofs, rooflines
from core.storage.store import ResultStore
from core.storage.summary import summarise
from core.workloads.fcnn import Fcnn, FcnnOptions, activation_values_per_sample, bytes_per_sample, weight_count
from plugins.amd.peaks import memory_bandwidth as amd_bandwidth
from plugins.cpu.peaks import derive_bandwidth, derive_peak, parse_cpuinfo
from plugins.graphcore.peaks import GRAPHCORE_PEAKS
from plugins.nvidia.peaks import NVIDIA_PEAKS

TOY = FcnnOptions(layers=4, hidden_width=64, input_width=64, output_width=16)

# --- the FCNN's bytes per sample, by hand --------------------------------------------------------


def test_fcnn_bytes_per_sample_by_hand() -> None:
    # Phi = 64^2 x 3 + 64 x (64 + 16) = 17,408 weights.
    assert weight_count(TOY) == 17_408
    # Linear layers (64,64), 3 x (64,64), (64,16): sum(n + m) = 4 x 128 + 80 = 592.
    # Forward: 592 + ReLU 2 x 4 x 64 = 1,104; weight gradients 592; input gradients (not the first
    # layer) 3 x 128 + 80 = 464; ReLU backward 3 x 4 x 64 = 768: 2,928 values.
    assert activation_values_per_sample(TOY) == 2_928
    assert activation_values_per_sample(TOY, training=False) == 1_104
    # fp32, micro-batch 4, no accumulation: 3 Phi x 4 B / 4 + 5 Phi x 4 B / 4 + 2,928 x 4 B.
    assert bytes_per_sample(TOY, 4, 1, Precision.fp32) == 52_224 + 87_040 + 11_712
    # Accumulating 2 micro-batches halves the optimizer's share; bf16 halves the activations'.
    assert bytes_per_sample(TOY, 4, 2, Precision.bf16) == 52_224 + 43_520 + 5_856
    # Inference: the weights once per micro-batch and the forward activations.
    assert bytes_per_sample(TOY, 4, 1, Precision.fp32, training=False) == 17_408 + 4_416
    # The workload hands the same figure to a run from its configuration.
    config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=4, precision="fp32")
    assert Fcnn().memory_bytes_per_sample(TOY, config) == 150_976
    # Intensity grows with the batch, towards D_H / 4 activations-bound (fp32): AI4NP's Fig. 4 shape.
    intensities = [6 * 17_408 / bytes_per_sample(TOY, b, 1, Precision.fp32) for b in (1, 16, 256, 4096)]
    assert intensities == sorted(intensities) and intensities[-1] < 6 * 17_408 / (2_928 * 4)


# --- the roofline's arithmetic ----------------------------------------------------------------------


def test_roof_values_at_hand_computed_points() -> None:
    roofs = Roofs("cpu", "fp32", peak_flops_per_second=166e9, bandwidth_bytes_per_second=460.8e9, memory="DDR5")
    assert roofs.ridge_intensity == pytest.approx(166 / 460.8)
    assert roofs.attainable(0.1) == pytest.approx(46.08e9)  # under the ridge: bandwidth x intensity
    assert roofs.attainable(1.0) == 166e9  # beyond it: the peak
    assert roofs.attainable(roofs.ridge_intensity) == pytest.approx(166e9)
    assert roofs.bound(0.1) == "memory" and roofs.bound(10) == "compute"
    # A cache roof (5 TB/s) meets the peak at 166e9 / 5e12 = 0.0332 FLOP/byte.
    assert roofs.attainable(0.01, 5e12) == pytest.approx(50e9)


# --- the peak tables --------------------------------------------------------------------------------


def test_vendor_bandwidths() -> None:
    def gigabytes(name: str) -> float | None:
        bandwidth = NVIDIA_PEAKS.memory_bandwidth(name)
        return None if bandwidth is None else bandwidth.bytes_per_second / 1e9

    assert gigabytes("Tesla T4") == 320
    assert gigabytes("Tesla V100-SXM2-16GB") == 900
    assert gigabytes("Quadro RTX 6000") == 672
    assert gigabytes("NVIDIA A100 80GB PCIe") == 1935
    assert gigabytes("NVIDIA A100-PCIE-40GB") == 1555
    assert gigabytes("NVIDIA A100-SXM4-80GB") == 2039
    assert gigabytes("NVIDIA H100 80GB HBM3") == 3350
    assert gigabytes("NVIDIA H200") == 4800
    assert gigabytes("NVIDIA GH200 480GB") == 4000
    # Every NVIDIA entry has a bandwidth, and the A100's split kept its FLOP/s.
    assert all(entry.bandwidth is not None for entry in NVIDIA_PEAKS.entries)
    assert NVIDIA_PEAKS.flops_per_second("NVIDIA A100 80GB PCIe", Precision.fp16) == 312e12
    # AMD: per package, half per GCD; the MI300X's Infinity Cache as a second roof.
    package, gcd = amd_bandwidth("AMD Instinct MI250X"), amd_bandwidth("AMD Instinct MI250X", per_gcd=True)
    assert package is not None and gcd is not None and gcd.bytes_per_second == package.bytes_per_second / 2
    mi300x = amd_bandwidth("MI300X-O")
    assert mi300x is not None and mi300x.caches_bytes_per_second == {"Infinity Cache": 17.2e12}
    assert amd_bandwidth("AMD Instinct MI250X / MI250") is None
    # Graphcore: on-chip SRAM, per IPU.
    sram = GRAPHCORE_PEAKS.memory_bandwidth("M2000 ipu2")
    assert sram is not None and sram.bytes_per_second == 47.5e12 and "SRAM" in sram.memory
    assert GRAPHCORE_PEAKS.flops_per_second("M2000 ipu2", Precision.fp16) == 250e12


_CPUINFO_PROCESSOR = """processor\t: {processor}
vendor_id\t: {vendor}
cpu family\t: {family}
model\t\t: {model}
model name\t: {name}
cpu MHz\t\t: 2500.000
physical id\t: 0
core id\t\t: {core}
flags\t\t: fpu sse avx2 fma {flags}
"""
#: /proc/cpuinfo's blocks of processors 0, 1 and 2; 1 and 2 are the two threads of core 1
_CPU_CORES = {0: 0, 1: 1, 2: 1}


def _facts(usable: tuple[int, ...] = (0, 1, 2), **fields: object) -> object:
    values = {"vendor": "AuthenticAMD", "family": 25, "model": 17, "name": "AMD EPYC", "flags": "avx512f avx512_bf16"}
    values.update(fields)
    text = "\n".join(
        _CPUINFO_PROCESSOR.format(processor=processor, core=core, **values) for processor, core in _CPU_CORES.items()
    )
    facts = parse_cpuinfo(text, usable)
    assert facts is not None
    return facts


def test_cpu_roofs_are_derived_from_cpuinfo() -> None:
    # Zen 4: two 256-bit FMA pipes whatever avx512f says; processors 1 and 2 share core 1: 2 cores.
    zen4 = _facts()
    peak = derive_peak(zen4, Precision.fp32)  # type: ignore[arg-type]
    assert peak is not None and peak[0] == 2 * 2 * 8 * 2 * 2.5e9 and peak[1].startswith("derived:")
    bf16 = derive_peak(zen4, Precision.bf16)  # type: ignore[arg-type]
    assert bf16 is not None and bf16[0] == 2 * peak[0]  # avx512_bf16
    fp16 = derive_peak(zen4, Precision.fp16)  # type: ignore[arg-type]
    assert fp16 is not None and fp16[0] == peak[0]  # no avx512_fp16: fp32 lanes
    bandwidth = derive_bandwidth(zen4)  # type: ignore[arg-type]
    assert bandwidth is not None and bandwidth.bytes_per_second == 12 * 4800e6 * 8
    # Only the usable CPUs count.
    one = derive_peak(_facts(usable=(0,)), Precision.fp32)  # type: ignore[arg-type]
    assert one is not None and one[0] == peak[0] / 2
    # An unlisted Intel CPU: 512-bit lanes from avx512f, 2 FMA units assumed (and said), no bandwidth.
    other = _facts(vendor="GenuineIntel", family=6, model=999, flags="avx512f")
    derived = derive_peak(other, Precision.fp32)  # type: ignore[arg-type]
    assert derived is not None and derived[0] == 2 * 2 * 16 * 2 * 2.5e9 and "assumed" in derived[1]
    assert derive_bandwidth(other) is None  # type: ignore[arg-type]
    # AMX's tile rate is not modelled: no 16-bit peak rather than one MFU could pass.
    assert derive_peak(_facts(flags="avx512f amx_bf16 avx512_bf16"), Precision.bf16) is None  # type: ignore[arg-type]
    assert derive_peak(zen4, Precision.tf32) is None  # type: ignore[arg-type]


# --- results and the report --------------------------------------------------------------------------


def test_older_results_read_without_roofline_figures() -> None:
    result = synthetic_result()
    document = result.model_dump(mode="json")
    for name in (
        "memory_bytes_per_sample",
        "memory_bandwidth_bytes_per_second",
        "memory_bandwidth_source",
        "memory_kind",
        "cache_bandwidths_bytes_per_second",
        "arithmetic_intensity",
    ):
        document.pop(name)
    document["schema_version"] = "1.5"
    old = RunResult.model_validate(document)
    assert old.arithmetic_intensity is None and old.memory_bandwidth_bytes_per_second is None
    # The intensity is computed on read, never trusted from the document.
    result.memory_bytes_per_sample = 1_000.0
    document = result.model_dump(mode="json") | {"arithmetic_intensity": 1e9}
    assert RunResult.model_validate(document).arithmetic_intensity == result.flops_per_sample / 1_000.0


def _roofline_store(tmp_path: Path, peak: float = 100e9) -> ResultStore:
    """An FCNN sweep of 2 hidden widths x 3 batches on one made-up CPU: 100 GFLOP/s, 50 GB/s."""
    store = ResultStore(tmp_path / "results.db")
    for width in (32, 256):
        for batch in (1, 16, 256):
            options = FcnnOptions(layers=4, hidden_width=width, input_width=64, output_width=16)
            result = synthetic_result(
                micro_batch_size=batch, throughput=1000.0 * batch, workload_options=options.model_dump()
            )
            result.flops_per_sample = 6.0 * weight_count(options)
            result.flops_per_second = result.flops_per_sample * 1000.0 * batch
            result.memory_bytes_per_sample = bytes_per_sample(options, batch, 1, Precision.fp32)
            result.devices = [DeviceRecord(index=0, name="Made-up CPU", kind="cpu")]
            result.peak_flops_per_second = peak
            result.model_flops_utilization = result.flops_per_second / peak
            result.memory_bandwidth_bytes_per_second = 50e9
            result.memory_kind = "DDR5"
            result.peak_flops_source = "derived: made up"
            result.memory_bandwidth_source = "derived: made up"
            key = f"w{width}-b{batch}"
            store.add(result, sweep="roof", cell_key=key, cell_label=key, repeat=0)
    return store


def test_report_draws_the_roofline_and_the_log_log_flops_plot(tmp_path: Path) -> None:
    store = _roofline_store(tmp_path)
    cells = summarise(store.runs(sweep="roof"))
    [(roofs, points)] = rooflines(cells)
    assert roofs.ridge_intensity == 2.0 and len(points) == 6
    files = write_report(store, tmp_path / "report")
    plots = {path.name for path in files.plots}
    assert {"roof-roofline.png", "roof-flops-vs-batch-log.png", "roof-heatmap-mfu-1.png"} <= plots
    html = files.html.read_text(encoding="utf-8")
    # The roofs table: peak, bandwidth and the ridge at 100e9 / 50e9 = 2 FLOP/byte.
    assert 'data-column="value" data-value="2.0">2 FLOP/byte' in html
    # Each run's attainable roof, by hand: the narrow net at batch 1 is far left of the ridge.
    narrow = FcnnOptions(layers=4, hidden_width=32, input_width=64, output_width=16)
    intensity = 6.0 * weight_count(narrow) / bytes_per_sample(narrow, 1, 1, Precision.fp32)
    assert intensity < 2.0
    markdown = files.markdown.read_text(encoding="utf-8")
    achieved = 6.0 * weight_count(narrow) * 1000.0 / 1e9
    attainable = min(100e9, 50e9 * intensity) / 1e9
    row = f"| hidden_width=32 | 1 | {intensity:.4g} | {achieved:.4g} | {attainable:.4g} | "
    assert row + f"{achieved / attainable * 100:.1f} % | memory |" in markdown
    assert "Warning" not in markdown.split("### Roofline", 1)[1].split("### ", 1)[0]  # every run is below the peak


def test_runs_above_the_peak_say_the_peak_is_too_low(tmp_path: Path) -> None:
    # A peak of 1 GFLOP/s (a CPU's nominal-clock derivation, say) under most of the runs.
    store = _roofline_store(tmp_path, peak=1e9)
    above = sum((cell.flops_per_second or 0.0) > 1e9 for cell in summarise(store.runs(sweep="roof")))
    assert 0 < above < 6
    files = write_report(store, tmp_path / "report")
    section = files.markdown.read_text(encoding="utf-8").split("### Roofline", 1)[1].split("\n### ", 1)[0]
    assert f"Warning: {above} run(s) achieved more than the peak" in section and "derived: made up" in section


def test_heatmap_normalises_to_the_best_cell_and_keeps_blank_cells(tmp_path: Path) -> None:
    store = _roofline_store(tmp_path)
    store.add(
        synthetic_result(micro_batch_size=1024, state="oom", workload_options={"hidden_width": 256}),
        sweep="roof",
        cell_key="w256-b1024",
        cell_label="oom",
        repeat=0,
    )
    cells = summarise(store.runs(sweep="roof"))
    heatmap = build_heatmap(cells, "micro_batch_size", "workload_options.hidden_width", (), "best")
    assert heatmap is not None and heatmap.x_values == [1, 16, 256, 1024] and heatmap.y_values == [32, 256]
    best = max(cell.flops_per_second or 0 for cell in cells)
    width32_batch16 = next(cell for cell in cells if cell.cell_key == "w32-b16")
    assert heatmap.values[0][1] == pytest.approx(width32_batch16.flops_per_second / best)
    assert max(value for row in heatmap.values for value in row if value is not None) == 1.0
    assert heatmap.values[1][3] is None and heatmap.states[1][3] == "oom"
    assert heatmap.values[0][3] is None and heatmap.states[0][3] == "-"
    mfu = build_heatmap(cells, "micro_batch_size", "workload_options.hidden_width", (), "mfu")
    assert mfu is not None and mfu.values[0][1] == pytest.approx(width32_batch16.flops_per_second / 100e9)
