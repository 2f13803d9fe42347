"""Reports over several databases: platforms compared cell by cell in the GH200 paper's words,
scaling against device count, and time and energy to train; each figure checked by hand."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result
from test_report import check_page_in_chromium, parse_html

from core.base.results import DeviceRecord, EnvironmentInfo, RunResult
from core.cli import main
from core.report import ComparisonRequest, ReportError, TrainingPlan, write_report
from core.report.compare import relative
from core.storage.store import ResultStore

# GH200 paper, Table I (a), ResNet50 on CIFAR-100: minutes to train. The same work, so throughput
# is inversely proportional to the time: images/s = IMAGES / (minutes x 60).
IMAGES = 50_000 * 10
MINUTES = {"1x A100": 36.67, "4x A100": 19.74, "GH200": 24.81}


def on_host(result: RunResult, host: str, device: str, driver: str, torch: str) -> RunResult:
    """The result as if recorded on ``host`` with ``device``s: what the runner writes there."""
    result.environment = EnvironmentInfo(
        hostname=host,
        platform="Linux-6.1-x86_64",
        python_version="3.11.9",
        core_version="0.1.0",
        framework_version=torch,
        library_versions={"torch": torch},
        driver_versions={"nvidia": driver},
        processor="made-up processor",
    )
    result.devices = [
        DeviceRecord(index=index, name=device, kind=result.accelerator) for index in range(len(result.devices))
    ]
    return result


def add_cell(store: ResultStore, sweep: str, key: str, results: list[RunResult]) -> None:
    for repeat, result in enumerate(results):
        store.add(result, sweep=sweep, cell_key=key, cell_label=key, repeat=repeat)


def throughput(side: str) -> float:
    return IMAGES / (MINUTES[side] * 60)


@pytest.fixture
def two_hosts(tmp_path: Path) -> tuple[Path, Path]:
    """a100.db: a node with A100s, 1 and 4 replicas; gh200.db: a GH200 node, 1 replica. Batch 64
    has the paper's ResNet50 times; batch 256 runs 10 % faster everywhere (repeats 0.98 and 1.02)."""
    a100, gh200 = ResultStore(tmp_path / "a100.db"), ResultStore(tmp_path / "gh200.db")
    for batch, speed in ((64, 1.0), (256, 1.1)):
        for store, side, replicas, host, device, driver in (
            (a100, "1x A100", 1, "a100-node", "NVIDIA A100-SXM4-80GB", "550.54"),
            (a100, "4x A100", 4, "a100-node", "NVIDIA A100-SXM4-80GB", "550.54"),
            (gh200, "GH200", 1, "gh200-node", "NVIDIA GH200 480GB", "560.35"),
        ):
            rate = throughput(side) * speed
            results = [
                on_host(
                    synthetic_result(
                        accelerator="cuda",
                        micro_batch_size=batch,
                        replicas=replicas,
                        throughput=rate * jitter,
                        samples_per_watt_hour=(2000.0 if side == "GH200" else 1600.0) * jitter,
                    ),
                    host,
                    device,
                    driver,
                    "2.3.1" if side == "GH200" else "2.2.0",
                )
                for jitter in (0.98, 1.02)
            ]
            add_cell(store, "resnet", f"b{batch}-r{replicas}", results)
    a100.close()  # the write-ahead log folded into the files, which a test copies
    gh200.close()
    return a100.path, gh200.path


def rows(html: Path, table: str) -> list[dict[str, tuple[str, str | None]]]:
    return [row for _, row in parse_html(html).tables[table]]


def test_the_paper_percentages_come_back_from_two_databases(two_hosts: tuple[Path, Path], tmp_path: Path) -> None:
    files = write_report(
        list(two_hosts),
        tmp_path / "report",
        comparison=ComparisonRequest(ignored=("replicas",), baseline="GH200"),
    )
    table = rows(files.html, "compare-training-throughput-per-second")
    gh200 = "gh200-node: 1x NVIDIA GH200 480GB (cuda), replicas=1"
    one = "a100-node: 1x NVIDIA A100-SXM4-80GB (cuda), replicas=1"
    four = "a100-node: 4x NVIDIA A100-SXM4-80GB (cuda), replicas=4"
    assert [row["configuration"][0] for row in table] == ["micro_batch_size=64", "micro_batch_size=256"]
    first = table[0]
    # The medians of the two repeats (0.98 and 1.02) are the rates themselves.
    assert float(first[f"throughput_per_second:{gh200}"][1]) == pytest.approx(throughput("GH200"))
    # By hand, from Table I's minutes: 1 - 24.81 / 36.67 = 32.3 % (GH200 faster than 1x A100), and
    # 1 - 19.74 / 24.81 = 20.4 % (GH200 slower than 4x A100, so 4x A100 faster than GH200).
    assert first[f"versus:{one}"][0] == f"32.3 % slower ({24.81 / 36.67:.2f}x)"
    assert float(first[f"versus:{one}"][1]) == pytest.approx(-(1 - 24.81 / 36.67))
    assert first[f"versus:{four}"][0] == f"20.4 % faster ({24.81 / 19.74:.2f}x)"
    assert float(first[f"versus:{four}"][1]) == pytest.approx(1 - 19.74 / 24.81)
    # Batch 256 is 10 % faster on every side: the same percentages.
    assert table[1][f"versus:{one}"][0].startswith("32.3 % slower")
    # Energy: 1600 against 2000 images per Wh, 1 - 1600 / 2000 = 20.0 % more energy per image.
    energy = rows(files.html, "compare-training-samples-per-watt-hour")
    assert energy[0][f"versus:{one}"][0] == "20.0 % more energy (0.80x)"
    # Each side's environment above the tables, and where its runs came from.
    environment = {row["fact"][0]: row for row in rows(files.html, "compare-environment")}
    assert environment["host"][f"side:{gh200}"][0] == "gh200-node"
    assert environment["drivers"][f"side:{one}"][0] == "nvidia 550.54"
    assert environment["framework"][f"side:{gh200}"][0] == "torch 2.3.1"
    assert environment["database"][f"side:{four}"][0] == str(two_hosts[0])
    assert environment["database"][f"side:{gh200}"][0] == str(two_hosts[1])
    markdown = files.markdown.read_text(encoding="utf-8")
    assert markdown.index("## Comparison across platforms and hosts") < markdown.index("## Sweep resnet")
    assert f"## Sweep resnet ({two_hosts[0]})" in markdown and f"## Sweep resnet ({two_hosts[1]})" in markdown
    assert {path.name for path in files.plots} >= {
        "compare-training-throughput-per-second.png",
        "compare-training-samples-per-watt-hour.png",
        "a100-resnet-scaling-efficiency.png",
    }


def test_placement_is_matched_unless_told_otherwise(two_hosts: tuple[Path, Path], tmp_path: Path) -> None:
    """Without --compare-ignore replicas, 4x A100 has no partner: 1x A100 against GH200 only."""
    files = write_report(list(two_hosts), tmp_path / "report")
    table = rows(files.html, "compare-training-throughput-per-second")
    assert [row["configuration"][0] for row in table] == ["micro_batch_size=64", "micro_batch_size=256"]
    versus = [name for name in table[0] if name.startswith("versus:")]
    assert versus == ["versus:gh200-node: 1x NVIDIA GH200 480GB (cuda)"]  # the baseline: the first database's side
    assert table[0][versus[0]][0] == f"32.3 % faster ({36.67 / 24.81:.2f}x)"


def test_relative_is_the_papers_arithmetic() -> None:
    assert relative(1 / 24.81, 1 / 36.67, "faster", "slower")[0] == "32.3 % faster"
    assert relative(1 / 24.81, 1 / 19.74, "faster", "slower")[0] == "20.4 % slower"
    # ViT-H: "4xA100 is 42.7 % faster than GH200", "GH200 is again 54.3 % faster than its single A100".
    assert relative(1 / 509.7, 1 / 890.3, "faster", "slower")[0] == "42.7 % faster"
    assert relative(1 / 890.3, 1 / 1948.01, "faster", "slower")[0] == "54.3 % faster"


def test_the_same_runs_twice_count_once_and_different_ones_conflict(
    two_hosts: tuple[Path, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "a100-copy.db"
    shutil.copy(two_hosts[0], copy)
    files = write_report([two_hosts[0], copy, two_hosts[1]], tmp_path / "same")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "holds the same runs as" in markdown and "counted once" in markdown
    assert "Conflicting duplicates" not in markdown
    # A second sweep on the A100 node measured batch 64 again, differently: a conflict, not a pick.
    store = ResultStore(copy)
    again = on_host(
        synthetic_result(accelerator="cuda", micro_batch_size=64, throughput=123.0),
        "a100-node",
        "NVIDIA A100-SXM4-80GB",
        "550.54",
        "2.2.0",
    )
    add_cell(store, "resnet-again", "b64-r1", [again])
    store.close()
    files = write_report([two_hosts[0], copy, two_hosts[1]], tmp_path / "conflict")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "### Conflicting duplicates" in markdown and "resnet-again" in markdown
    table = rows(files.html, "compare-training-throughput-per-second")
    a100 = "a100-node: 1x NVIDIA A100-SXM4-80GB (cuda)"
    by_batch = {row["configuration"][0]: row for row in table}
    assert by_batch["micro_batch_size=64"][f"throughput_per_second:{a100}"] == ("conflict", None)
    assert by_batch["micro_batch_size=256"][f"throughput_per_second:{a100}"][1] is not None


def test_one_database_without_a_second_platform_has_no_comparison(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "one.db")
    for batch in (8, 16):
        add_cell(store, "cpu", str(batch), [synthetic_result(micro_batch_size=batch)])
    files = write_report(store, tmp_path / "report")
    assert "Comparison across platforms" not in files.markdown.read_text(encoding="utf-8")


def test_scaling_by_hand(tmp_path: Path) -> None:
    """1, 2 and 4 replicas at 100, 180 and 300 samples/s; 8 replicas over 2 nodes at 480."""
    store = ResultStore(tmp_path / "scaling.db")
    for replicas, nodes, rate in ((1, 1, 100.0), (2, 1, 180.0), (4, 1, 300.0), (8, 2, 480.0)):
        add_cell(store, "scale", f"r{replicas}", [synthetic_result(replicas=replicas, nodes=nodes, throughput=rate)])
    files = write_report(store, tmp_path / "report")
    table = {row["devices"][0]: row for row in rows(files.html, "scaling-scale")}
    expected = {
        # devices: (speed-up T(n) / T(1), ideal n / 1, efficiency = speed-up / ideal, ideal T(1) x n)
        "1": (1.0, 1.0, 1.0, 100.0),
        "2": (1.8, 2.0, 0.9, 200.0),
        "4": (3.0, 4.0, 0.75, 400.0),
        "8": (4.8, 8.0, 0.6, 800.0),
    }
    assert set(table) == set(expected)
    for devices, (speedup, ideal, efficiency, ideal_rate) in expected.items():
        row = table[devices]
        assert float(row["speedup"][1]) == pytest.approx(speedup)
        assert float(row["ideal_speedup"][1]) == pytest.approx(ideal)
        assert float(row["scaling_efficiency"][1]) == pytest.approx(efficiency)
        assert float(row["ideal_throughput_per_second"][1]) == pytest.approx(ideal_rate)
    assert table["8"]["nodes"][0] == "2" and table["4"]["nodes"][0] == "1"
    assert table["4"]["scaling_efficiency"][0] == "75.0 %"
    assert (tmp_path / "report" / "plots" / "scale-scaling-efficiency.png").exists()


def training_store(path: Path) -> ResultStore:
    """Batch 64, one replica: 64 samples a host call, first step 0.1 s, 3 warm-up steps in 0.05 s,
    a window of 10 steps (640 samples) at 1000 samples/s (0.64 s), 500 samples per Wh."""
    store = ResultStore(path)
    add_cell(store, "train", "b64", [synthetic_result(throughput=1000.0, samples_per_watt_hour=500.0)])
    return store


def to_train(files: Any) -> dict[str, tuple[str, str | None]]:
    return rows(files.html, "to-train-train")[0]


def test_time_to_train_by_hand(tmp_path: Path) -> None:
    store = training_store(tmp_path / "train.db")
    plan = TrainingPlan(3, "samples:10000")
    files = write_report(store, tmp_path / "report", training=plan)
    row = to_train(files)
    # 3 x 10,000 samples: the first step's 64 in 0.1 s, the other 29,936 at 1000/s: 30.036 s.
    assert float(row["time_to_train_seconds"][1]) == pytest.approx(0.1 + (30_000 - 64) / 1000)
    assert row["time_to_train_seconds"][0] == "30.04 s"
    # 30,000 samples at 500 per Wh: 60 Wh.
    assert float(row["energy_to_train_watt_hours"][1]) == pytest.approx(60.0)
    assert row["samples_per_epoch"][0] == "10,000"
    # 896 samples ran (64 x (1 + 3) + 640): no whole number of 10,000-sample epochs, nothing measured.
    assert row["measured_seconds"] == ("-", None) and row["measured_window_watt_hours"] == ("-", None)
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "### Time and energy to train (estimate)" in markdown
    assert "Estimates, not measurements, for 3 epochs (samples:10000)" in markdown


def test_whole_epochs_are_measured(tmp_path: Path) -> None:
    store = training_store(tmp_path / "train.db")
    # An epoch of 896 samples: the run's own first step, warm-up and window were one epoch.
    files = write_report(store, tmp_path / "run", training=TrainingPlan(1, "samples:896"))
    row = to_train(files)
    assert float(row["measured_seconds"][1]) == pytest.approx(0.1 + 0.05 + 0.64)
    assert row["measured_seconds"][0] == "790 ms for 1 epoch"
    assert float(row["time_to_train_seconds"][1]) == pytest.approx(0.1 + (896 - 64) / 1000)
    # An epoch of 10 global batches (640 samples): the metered window was one epoch, 640 / 500 Wh.
    files = write_report(store, tmp_path / "window", training=TrainingPlan(2, "global-batches:10"))
    row = to_train(files)
    assert float(row["measured_window_watt_hours"][1]) == pytest.approx(640 / 500)
    assert row["measured_window_watt_hours"][0] == "1.28 for 1 epoch"
    assert float(row["energy_to_train_watt_hours"][1]) == pytest.approx(1280 / 500)


def test_a_dataset_epoch_unknown_to_the_run_is_explained(tmp_path: Path) -> None:
    store = training_store(tmp_path / "train.db")
    files = write_report(store, tmp_path / "report", training=TrainingPlan(1, "dataset"))
    assert "Not estimated: no successful cell knows the size of an epoch" in files.markdown.read_text(encoding="utf-8")


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ReportError, match="cannot leave 'accelerator' unmatched"):
        ComparisonRequest(ignored=("accelerator",))
    ComparisonRequest(ignored=("workload_options.hidden_width", "replicas"))
    with pytest.raises(ValueError, match="at least 1"):
        TrainingPlan(0)
    with pytest.raises(ValueError, match="samples:N"):
        TrainingPlan(1, "epochs:3")


def test_the_cli_reads_several_databases(
    two_hosts: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    databases = [str(path) for path in two_hosts]
    output = str(tmp_path / "cli")
    assert main(["report", *databases, "--output", output, "--epochs", "2"]) == 0
    assert "## Comparison across platforms and hosts" in (tmp_path / "cli" / "report.md").read_text(encoding="utf-8")
    for arguments, message in (
        (["--compare-ignore", "seed"], "cannot leave 'seed' unmatched"),
        (["--sweep", "nothing"], "no sweep named 'nothing' in any of"),
        (["--epochs", "0"], "epochs must be at least 1"),
    ):
        capsys.readouterr()
        assert main(["report", *databases, "--output", output, *arguments]) == 2
        assert message in capsys.readouterr().err
    assert main(["report", databases[0], "--epoch-definition", "samples:5", "--output", output]) == 2
    assert "--epoch-definition needs --epochs" in capsys.readouterr().err


def test_the_comparison_page_opens_in_chromium(two_hosts: tuple[Path, Path], tmp_path: Path) -> None:
    files = write_report(
        list(two_hosts),
        tmp_path / "report",
        training=TrainingPlan(10, "samples:50000"),
        comparison=ComparisonRequest(ignored=("replicas",), baseline="GH200"),
    )
    page = files.html.read_text(encoding="utf-8")
    check_page_in_chromium(files.html, tables=page.count("<table"), images=page.count("<img "))
    # Every figure of the comparison sits above the table of its figures.
    table = rows(files.html, "compare-training-time-to-train-seconds")
    assert table[0]["versus:a100-node: 4x NVIDIA A100-SXM4-80GB (cuda), replicas=4"][0].endswith("x)")
    # Two repeats: a count of samples stays whole (the lower middle value, not a mean of two).
    assert {row["samples_per_epoch"][0] for row in rows(files.html, "to-train-a100-resnet")} == {"50,000"}
