"""Roofs from the source the user chooses: the probe's arithmetic and timing, the per-host cache,
the database's host_roofs, each source's choice and labels, and why no roofline is drawn."""

from __future__ import annotations

import importlib
import json
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest
from synthetic import synthetic_result

from core.base.errors import ConfigError
from core.base.results import DeviceRecord, EnvironmentInfo, RunResult
from core.base.roofs import MEASURED_ROOFS_FORMAT, MeasuredRoofs, RoofSource, parse_roofs_option
from core.cli import main
from core.report import write_report
from core.report.document import Heading, Paragraph
from core.report.roof_sources import RoofRequest, make_request, roof_request, roofs_in_force
from core.report.roofline import rooflines, roofs_of, why_no_roofline
from core.report.sections import sweep_section
from core.roofs.cache import HostKey, cache_path, load_cached, store_cached
from core.roofs.probe import matmul_flops, probe, time_calls, triad_bytes, triad_flops
from core.storage.store import ResultStore, SweepRecord
from core.storage.summary import CellSummary, summarise
from core.sweep.plan import plan_sweep
from core.sweep.spec import make_sweep_spec
from plugins.nvidia.machines import nvidia_machines

# --- the probe ------------------------------------------------------------------------------------


def test_probe_arithmetic_counts_bytes_and_flops() -> None:
    # a = b + s x c over 10 float32 elements: b and c read, a written, 4 bytes each; a multiply and an add.
    assert triad_bytes(10, 4) == 120
    assert triad_flops(10) == 20
    # (3 x 3) @ (3 x 3): 9 outputs, each 3 multiplies and 3 adds.
    assert matmul_flops(3) == 54


def test_timing_leaves_out_the_warm_up_and_takes_the_median_window() -> None:
    now = [0.0]
    durations = iter([5.0, 0.01, 0.02, 0.03, 0.02, 0.01] + [0.02] * 100)  # warm-up 5 s, then per call
    events: list[str] = []

    def call() -> None:
        now[0] += next(durations)
        events.append("call")

    timing = time_calls(call, lambda: events.append("sync"), repeats=3, window_seconds=0.05, clock=lambda: now[0])
    # The warm-up's 5 s never reaches a window; the sizing window (0.01 s) makes windows of 5 calls.
    assert timing.calls_per_window == 5 and timing.windows == 3
    assert timing.seconds_per_call == pytest.approx(0.02)
    # Every timed window is closed by a synchronisation at both of its ends.
    assert events[:2] == ["call", "sync"] and events[-1] == "sync"
    assert events.count("sync") == 1 + 2 * (1 + 3)


def test_probe_measures_with_tiny_sizes() -> None:
    figures = probe(dtypes=("float32",), triad_elements=4096, matmul_size=64, repeats=2, window_seconds=0.002)
    assert figures.bandwidth_bytes_per_second > 0
    assert list(figures.peak_flops_per_second) == ["float32"] and figures.peak_flops_per_second["float32"] > 0
    # The probe's run time is recorded, whatever it was: a bound on it is a bound on the host's load.
    assert figures.seconds >= 0 and "median of 2 windows" in figures.method and "side float32 64" in figures.method


# --- the cache ------------------------------------------------------------------------------------


def _measured(host: str = "node1", device: str = "Made-up CPU", **changes: object) -> MeasuredRoofs:
    record = {
        "format": MEASURED_ROOFS_FORMAT,
        "host": host,
        "device": device,
        "accelerator": "cpu",
        "torch_device": "cpu",
        "core_version": "0.2",
        "torch_version": "2.0",
        "measured_at": "2026-01-02T03:04:05+00:00",
        "probe_seconds": 2.5,
        "memory_bandwidth_bytes_per_second": 20e9,
        "peak_flops_per_second": {"float32": 80e9, "bfloat16": 1e9},
        "method": "triad and matmuls",
    }
    return MeasuredRoofs.model_validate(record | changes)


def _key(roofs: MeasuredRoofs) -> HostKey:
    return HostKey(roofs.host, roofs.device, roofs.torch_device, roofs.core_version, roofs.torch_version)


def test_the_peak_is_the_faster_of_matmul_and_the_linear_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bf16 torch.matmul on this project's EPYC ran at 1.3 GFLOP/s while a model's bf16 Linear
    # layers ran at 11: the probe's peak was below what the runs achieved. The kernels' times here
    # come from a clock they advance themselves, so the choice does not depend on the machine's load.
    import torch

    probe_module = importlib.import_module("core.roofs.probe")  # core.roofs.probe is also a function's name
    now = [0.0]
    monkeypatch.setattr(probe_module.time, "perf_counter", lambda: now[0])

    def taking(seconds: float) -> Callable[[], None]:
        def call() -> None:
            now[0] += seconds

        return call

    fake = [("matmul", taking(0.010)), ("linear", taking(0.001))]
    monkeypatch.setattr(probe_module, "_kernels", lambda torch, x, y, out: fake)
    chosen = probe_module._matmul_of(torch, torch.device("cpu"), torch.float32, 256, 0.1, lambda: None)
    assert (chosen.kernel, chosen.size) == ("linear", 256)


def test_both_kernels_compute_a_square_matmul_of_the_same_flops() -> None:
    import torch

    from core.roofs.probe import _kernels

    x, y = torch.rand((8, 8)), torch.rand((8, 8))
    (_, matmul), (_, linear) = _kernels(torch, x, y, torch.empty((8, 8)))
    assert torch.allclose(matmul(), x @ y) and torch.allclose(linear(), x @ y.T)  # type: ignore[call-overload]


def test_cache_is_kept_per_host_and_refuses_foreign_or_corrupt_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mine, theirs = _measured(), _measured(host="node2")
    path = store_cached(mine, _key(mine))
    assert path.parent == tmp_path / "core" / "roofs"
    assert load_cached(_key(mine)) == (mine, [])
    assert load_cached(_key(theirs)) == (None, [])  # another host: another file, none yet
    # Another host's record under this host's file name (copied over): refused, with a warning.
    cache_path(_key(theirs)).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    found, warnings = load_cached(_key(theirs))
    assert found is None and "measured for host 'node1'" in warnings[0]
    # A newer torch is another key: the old figures are not used for it.
    assert load_cached(HostKey("node1", "Made-up CPU", "cpu", "0.2", "2.1"))[0] is None
    for text, said in (
        ("{not json", "not JSON"),
        (json.dumps({"format": 99}), "format: 99"),
        (json.dumps(mine.model_dump() | {"memory_bandwidth_bytes_per_second": -1.0}), "memory_bandwidth"),
    ):
        path.write_text(text, encoding="utf-8")
        found, warnings = load_cached(_key(mine))
        assert found is None and said in warnings[0] and str(path) in warnings[0]


# --- the database ---------------------------------------------------------------------------------


def test_database_keeps_the_latest_roofs_of_each_host_and_skips_damaged_rows(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "core.db") as store:
        store.save_host_roofs(_measured(measured_at="2026-01-01T00:00:00+00:00"))
        store.save_host_roofs(_measured(memory_bandwidth_bytes_per_second=30e9))
        store.save_host_roofs(_measured(host="node2"))
    with sqlite3.connect(tmp_path / "core.db") as connection:
        connection.execute("INSERT INTO host_roofs VALUES ('node3', 'x', '2026', '{\"format\": 1}')")
    with ResultStore(tmp_path / "core.db", create=False) as store:
        found = {roofs.host: roofs for roofs in store.host_roofs()}
        assert set(found) == {"node1", "node2"} and found["node1"].memory_bandwidth_bytes_per_second == 30e9
        assert [row.table for row in store.skipped_rows] == ["host_roofs"]


def test_a_database_without_the_host_roofs_table_has_none(tmp_path: Path) -> None:
    ResultStore(tmp_path / "core.db").close()
    with sqlite3.connect(tmp_path / "core.db") as connection:
        connection.execute("DROP TABLE host_roofs")
    with ResultStore(tmp_path / "core.db", create=False) as store:
        assert store.host_roofs() == []


# --- choosing the source --------------------------------------------------------------------------


def _cell(
    device: str = "Made-up CPU",
    host: str = "node1",
    precision: str = "fp32",
    accelerator: str = "cpu",
    bandwidth: float | None = 50e9,
    schema: str | None = None,
) -> CellSummary:
    result = synthetic_result(precision=precision, accelerator=accelerator)
    result.devices = [DeviceRecord(index=0, name=device, kind=accelerator)]
    result.environment = EnvironmentInfo(hostname=host, platform="linux", python_version="3", core_version="0.2")
    result.memory_bytes_per_sample = result.flops_per_sample / 4  # intensity 4 FLOP/byte
    result.peak_flops_per_second = 100e9
    result.peak_flops_source = "derived: made up"
    result.memory_bandwidth_bytes_per_second = bandwidth
    result.memory_bandwidth_source = None if bandwidth is None else "derived: made up"
    if schema is not None:
        result = RunResult.model_validate(result.model_dump(mode="json") | {"schema_version": schema})
    store = ResultStore(":memory:")
    store.add(result, sweep="s", cell_key="c", cell_label="c", repeat=0)
    [cell] = summarise(store.runs(sweep="s"))
    return cell


def test_each_source_gives_its_figures_and_says_where_they_come_from() -> None:
    profiles = tuple(profile for profile in nvidia_machines() if profile.roofs is not None)
    measured = (_measured(),)
    cpu = _cell()
    datasheet = roofs_of(cpu, RoofRequest(RoofSource.datasheet, profiles, measured=measured))
    assert datasheet is not None and datasheet.peak_flops_per_second == 100e9
    assert datasheet.origin == "datasheet" and datasheet.flops_source == "datasheet: derived: made up"
    found = roofs_of(cpu, RoofRequest(RoofSource.measured, profiles, measured=measured))
    assert found is not None and (found.peak_flops_per_second, found.bandwidth_bytes_per_second) == (80e9, 20e9)
    assert found.origin == "measured on host node1 on 2026-01-02" and "triad" in found.bandwidth_source
    # bf16 computes in bfloat16: its measured peak; a host nobody measured gets none.
    bf16 = roofs_of(_cell(precision="bf16"), RoofRequest(RoofSource.measured, measured=measured))
    assert bf16 is not None and bf16.peak_flops_per_second == 1e9
    assert roofs_of(_cell(host="node9"), RoofRequest(RoofSource.measured, measured=measured)) is None
    # The poster's T4: Table 1's figures, not the datasheet's; the ridge at 8.1 T / 245.2 G = 33.0.
    t4 = _cell(device="Tesla T4", accelerator="nvidia")
    machine = roofs_of(t4, RoofRequest(RoofSource.machine, profiles))
    assert machine is not None and machine.origin == "machine profile t4"
    assert machine.ridge_intensity == pytest.approx(33.03, abs=0.01) and "AI4NP, Table 1" in machine.flops_source
    # The poster gives no bf16 figure: none is made up.
    assert (
        roofs_of(
            _cell(device="Tesla T4", accelerator="nvidia", precision="bf16"), RoofRequest(RoofSource.machine, profiles)
        )
        is None
    )


def test_auto_takes_measured_then_datasheet_then_machine() -> None:
    profiles = tuple(profile for profile in nvidia_machines() if profile.roofs is not None)
    auto = RoofRequest(RoofSource.auto, profiles, measured=(_measured(),))
    assert roofs_of(_cell(), auto).origin.startswith("measured on host node1")  # type: ignore[union-attr]
    assert roofs_of(_cell(host="node9"), auto).origin == "datasheet"  # type: ignore[union-attr]
    t4 = _cell(device="Tesla T4", accelerator="nvidia", bandwidth=None)
    assert roofs_of(t4, auto).origin == "machine profile t4"  # type: ignore[union-attr]


def test_the_roofs_option_is_checked() -> None:
    assert parse_roofs_option("auto") == (RoofSource.auto, None)
    assert parse_roofs_option("machine:t4") == (RoofSource.machine, "t4")
    for bad in ("sheet", "measured:t4", "machine:"):
        with pytest.raises(ValueError, match="allowed are auto, datasheet, machine, measured"):
            parse_roofs_option(bad)
    assert roof_request("machine:t4").chosen_profile.name == "t4"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="has no roofs"):
        roof_request("machine:a100-80gb-x4")


def test_report_cli_refuses_an_unknown_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ResultStore(tmp_path / "core.db").close()
    assert main(["report", str(tmp_path / "core.db"), "--roofs", "vendor"]) == 2
    assert "--roofs 'vendor': allowed are" in capsys.readouterr().err


# --- why no roofline ------------------------------------------------------------------------------


def test_a_cpu_without_a_bandwidth_says_so_and_how_to_measure_it() -> None:
    cell = _cell(bandwidth=None)
    request = RoofRequest(RoofSource.auto)
    assert rooflines([cell], request) == []
    reason = why_no_roofline([cell], request)
    assert "schema 1.6" not in reason
    assert reason.startswith("no memory bandwidth is known for Made-up CPU on host node1") and "core roofs" in reason
    old = _cell(bandwidth=None, schema="1.5")
    assert "written before schema 1.6" in why_no_roofline([old], request)
    assert "no measured roofs for Made-up CPU on host node1" in why_no_roofline(
        [cell], RoofRequest(RoofSource.measured)
    )


def test_report_draws_measured_roofs_recorded_in_the_database(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "core.db")
    result = synthetic_result()
    result.devices = [DeviceRecord(index=0, name="Made-up CPU", kind="cpu")]
    result.environment = EnvironmentInfo(hostname="node1", platform="linux", python_version="3", core_version="0.2")
    result.memory_bytes_per_sample = result.flops_per_sample / 4
    store.add(result, sweep="s", cell_key="c", cell_label="c", repeat=0)
    store.save_host_roofs(_measured())
    files = write_report(store, tmp_path / "report", roofs=make_request(RoofSource.measured))
    section = files.markdown.read_text(encoding="utf-8").split("### Roofline", 1)[1]
    assert "roofs: measured on host node1 on 2026-01-02" in section
    assert "STREAM-like triad" in section and "float32 matmul peak" in section


def _t4_section(report: dict[str, object]) -> list[str]:
    cell = _cell(device="Tesla T4", accelerator="nvidia", bandwidth=320e9)
    now = datetime.now(timezone.utc)
    spec = {"name": "s", "grid": {"workload": "fcnn"}, "report": report}
    blocks = sweep_section("s", [cell], SweepRecord("s", None, spec, [], now, now), Path("r.db"), slug="s")
    texts = [block.text for block in blocks if isinstance(block, Heading)]
    return texts + ["".join(str(part) for part in block.parts) for block in blocks if isinstance(block, Paragraph)]


def test_a_sweep_files_report_table_chooses_the_roofs_unless_the_report_does() -> None:
    # AI4NP's files ask for the poster's Table 1 roofs (T4: 245.2 GB/s, not the datasheet's 320).
    texts = _t4_section({"plots": ["roofline"], "roofs": "machine:t4"})
    assert any("roofs: machine profile t4" in text for text in texts), texts
    assert any("as the sweep file's [report] table asks" in text for text in texts)
    with roofs_in_force(make_request(RoofSource.datasheet)):  # core report --roofs datasheet
        texts = _t4_section({"plots": ["roofline"], "roofs": "machine:t4"})
    assert any("roofs: datasheet" in text for text in texts), texts
    # A profile the report cannot load is said, and the report's own choice draws the roofline.
    texts = _t4_section({"plots": ["roofline"], "roofs": "machine:no-such-machine"})
    assert any(text.startswith("The sweep file's roofs ('machine:no-such-machine') are not used") for text in texts)
    assert any("roofs: datasheet" in text for text in texts), texts


def test_the_report_tables_roofs_are_checked_when_the_file_is_read() -> None:
    with pytest.raises(ConfigError, match=r"report.roofs = 'sheet': allowed are auto, datasheet, machine"):
        make_sweep_spec({"name": "s", "grid": {"workload": "fcnn"}, "report": {"roofs": "sheet"}})


def test_a_toy_of_a_file_naming_its_machines_roofs_draws_this_hosts() -> None:
    spec = make_sweep_spec(
        {
            "name": "s",
            "machine": "t4",
            "grid": {"workload": "fcnn", "accelerator": "nvidia", "micro_batch_size": 64},
            "report": {"plots": ["roofline"], "roofs": "machine:t4"},
        }
    )
    toy = plan_sweep(spec, toy=True)
    assert toy.spec.report is not None and toy.spec.report.roofs is None and toy.spec.report.plots == ["roofline"]
    kept = make_sweep_spec({"name": "s", "grid": {"workload": "fcnn"}, "report": {"roofs": "measured"}})
    assert plan_sweep(kept, toy=True).spec.report.roofs == "measured"  # type: ignore[union-attr]
