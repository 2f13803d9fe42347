"""The ``core`` command's parser: ``--version``, "did you mean" for whatever a user can misspell
(a command, a flag, a choice, a workload, an accelerator, an option key), and ``core run --help``
grouped with examples. In process: nothing here runs a workload."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_plugins import HEAVY_MODULES

from core import hookimpl
from core.base.config import RunConfig
from core.base.errors import ConfigError, closest_name
from core.cli import build_parser, main
from core.cli.run_arguments import RUN_EXAMPLES, RUN_GROUPS
from core.contract.commands import Command
from core.testing import registered_plugins

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def refused(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    """What ``core ARGUMENTS`` says on stderr when argparse refuses them (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(list(arguments))
    assert exited.value.code == 2
    return " ".join(capsys.readouterr().err.split())


def run_refused(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    """What ``core run ARGUMENTS --dry-run`` says when planning refuses them (exit 2)."""
    assert main(["run", *arguments, "--dry-run"]) == 2
    return " ".join(capsys.readouterr().err.split())


def run_parser() -> argparse.ArgumentParser:
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices["run"]
    return parser


# --- core --version ----------------------------------------------------------------------------------


def test_version_prints_the_version_pyproject_declares(capsys: pytest.CaptureFixture[str]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"core {version}\n"


def test_version_loads_no_plugin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A broken install of some plugin must not cost `core --version`, and it stays quick.
    import core.contract.manager

    def no_plugins() -> None:
        raise AssertionError("core --version loaded the plugins")

    monkeypatch.setattr(core.contract.manager, "get_plugin_manager", no_plugins)
    with pytest.raises(SystemExit) as exited:
        main(["--debug", "--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("core ")


def test_version_of_a_core_not_installed_is_a_fault_said_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib import metadata

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 1
    assert "core's version is unknown: it is not installed" in capsys.readouterr().err


# --- did you mean: argparse's own refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments,meant",
    [
        (["run", "fcnn", "--batchsize", "64"], "(did you mean --batch-size?)"),
        (["run", "fcnn", "--batchsize=64"], "(did you mean --batch-size?)"),
        (["run", "fcnn", "--batch_size", "64"], "(did you mean --batch-size?)"),
        (["run", "fcnn", "--Steps", "3"], "(did you mean --steps?)"),
        (["run", "fcnn", "--acelerator", "cpu"], "(did you mean --accelerator?)"),
        (["run", "fcnn", "--dryrun"], "(did you mean --dry-run?)"),
        (["sweep", "grid.toml", "--dryrun"], "(did you mean --dry-run?)"),
        (["results", "--fromat", "csv"], "(did you mean --format?)"),
        (["--debgu", "plugins"], "(did you mean --debug?)"),
        (
            ["run", "fcnn", "--batchsize", "64", "--stpes", "3"],
            "(did you mean --batch-size for --batchsize, --steps for --stpes?)",
        ),
    ],
)
def test_an_unknown_flag_names_the_closest_flag_of_its_command(
    arguments: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    said = refused(capsys, *arguments)
    assert "unrecognized arguments:" in said and said.endswith(meant), said


def test_cores_own_option_after_the_command_is_said_to_go_before_it(capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(capsys, "run", "fcnn", "--version")
    assert said.endswith("unrecognized arguments: --version (--version goes before the command: core --version)")


def test_an_unknown_flag_like_none_is_refused_without_a_guess(capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(capsys, "run", "fcnn", "--zzzzzzzz", "1")
    assert "unrecognized arguments: --zzzzzzzz 1" in said and "did you mean" not in said


@pytest.mark.parametrize(
    "arguments,meant",
    [
        (["rn", "fcnn"], "did you mean 'run'?"),
        (["Report"], "did you mean 'report'?"),
        (["sweeps", "grid.toml"], "did you mean 'sweep'?"),
        (["results", "--format", "cvs"], "did you mean 'csv'?"),
        (["sweep", "grid.toml", "--workers", "wram"], "did you mean 'warm'?"),
        (["sweep", "grid.toml", "--executor", "slurn"], "did you mean 'slurm'?"),
    ],
)
def test_an_invalid_choice_names_the_closest_one(
    arguments: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    said = refused(capsys, *arguments)
    assert "invalid choice:" in said and said.endswith(meant), said


def test_an_unknown_command_is_matched_against_the_plugins_commands_too(capsys: pytest.CaptureFixture[str]) -> None:
    class Commands:
        @hookimpl
        def core_register_commands(self, register: Callable[[Command], None]) -> None:
            register(Command("gaudi-info", "show the Gaudi devices", lambda args: 0))

    with registered_plugins(Commands()):
        said = refused(capsys, "gaudi-inf")
    assert "did you mean 'gaudi-info'?" in said, said


# --- did you mean: names core looks up ------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments,field,meant",
    [
        (["resnet5"], "workload", "unknown workload (did you mean 'resnet50'?); registered: "),
        (["FCNN"], "workload", "unknown workload (did you mean 'fcnn'?); registered: "),
        (["fcnn", "--accelerator", "cpux"], "accelerator", "unknown accelerator (did you mean 'cpu'?); registered: "),
        (["fcnn", "--accelerator", "Nvidia"], "accelerator", "(did you mean 'nvidia'?)"),
        (["fcnn", "--power-meter", "rapll"], "power_meter", "unknown power meter (did you mean 'rapl'?); allowed: "),
        (
            ["fcnn", "--node-meters", "rapll"],
            "node_meters",
            "'rapll' is no registered power meter (did you mean 'rapl'?)",
        ),
        (
            ["fcnn", "-o", "layer=8"],
            "workload_options.layer",
            "unknown option for workload 'fcnn' (did you mean 'layers'?); allowed: layers, ",
        ),
        (["fcnn", "-o", "Hidden_Width=8"], "workload_options.Hidden_Width", "(did you mean 'hidden_width'?)"),
    ],
)
def test_an_unknown_name_names_the_closest_registered_one(
    arguments: list[str], field: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    said = run_refused(capsys, *arguments)
    assert said.startswith(f"core: error: invalid {field} ") and meant in said, said


def test_an_unknown_name_like_none_is_refused_with_the_list_alone(capsys: pytest.CaptureFixture[str]) -> None:
    said = run_refused(capsys, "qqqqqqqqqq")
    assert "unknown workload; registered: " in said and "did you mean" not in said


def test_the_suggestion_is_made_where_the_lookup_fails_so_every_caller_has_it(tmp_path: Path) -> None:
    # core.run and a sweep's cells reach the same look-ups and option checks as `core run`.
    from core import run
    from core.sweep import load_sweep, plan_sweep

    with pytest.raises(ConfigError, match=r"unknown accelerator \(did you mean 'cpu'\?\)"):
        run("fcnn", "cpuu")
    with pytest.raises(ConfigError, match=r"unknown option \(did you mean 'steps'\?\)"):
        run("fcnn", "cpu", stpes=3)
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nworkload = "fcnn"\naccelerator = ["cpu", "cpuu"]\n[grid.workload_options]\nlayer = 2\n')
    reasons = [cell.invalid_reason or "" for cell in plan_sweep(load_sweep(grid)).cells]
    assert "(did you mean 'layers'?)" in reasons[0] and "(did you mean 'cpu'?)" in reasons[1], reasons


def test_a_misspelt_machine_profile_names_the_closest_shipped_one(capsys: pytest.CaptureFixture[str]) -> None:
    said = run_refused(capsys, "fcnn", "--machine", "gh200-x5")
    assert "did you mean 'gh200-x4'?" in said, said


@pytest.mark.parametrize(
    "word,names,closest",
    [
        ("FCNN", ["fcnn", "resnet50"], "fcnn"),
        ("resnet5", ["resnet50", "resnet152"], "resnet50"),
        ("--batchsize", ["--batch-size", "--steps"], "--batch-size"),
        ("zzz", ["fcnn", "resnet50"], None),
        ("anything", [], None),
    ],
)
def test_closest_name(word: str, names: list[str], closest: str | None) -> None:
    assert closest_name(word, names) == closest


# --- core run --help: groups and examples ------------------------------------------------------------------


def test_run_help_groups_every_flag_in_order() -> None:
    parser = run_parser()
    titles = [group.title for group in parser._action_groups]
    assert titles[-len(RUN_GROUPS) :] == list(RUN_GROUPS)
    # Every RunConfig field, and every other argument of core run but --help and --debug, is in a group
    # of its own concern: none falls into the last group for want of one.
    grouped = {dest for dests in RUN_GROUPS.values() for dest in dests}
    assert set(RunConfig.model_fields) <= grouped, set(RunConfig.model_fields) - grouped
    arguments = {action.dest for action in parser._actions} - {"help", "debug"}
    assert arguments <= grouped, arguments - grouped
    for group in parser._action_groups:
        if group.title in RUN_GROUPS:
            assert [action.dest for action in group._group_actions] and all(
                action.dest in RUN_GROUPS[group.title] for action in group._group_actions
            ), group.title
    help_text = parser.format_help()
    positions = [help_text.index(f"\n{title}:\n") for title in RUN_GROUPS]
    assert positions == sorted(positions)


def test_run_help_keeps_each_fields_description() -> None:
    # Whitespace aside: argparse wraps the lines where it likes (after a hyphen too).
    help_text = "".join(run_parser().format_help().split())
    for name, info in RunConfig.model_fields.items():
        if name in ("workload", "accelerator", "workload_options", "accelerator_options", "loadgen"):
            continue  # their own syntax: a positional, -o, -a, -l
        assert info.description and "".join(info.description.split()) in help_text, name


def test_run_help_ends_with_examples_from_the_readme_that_parse() -> None:
    help_text = run_parser().format_help()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert help_text.rstrip().endswith(RUN_EXAMPLES[-1])
    parser = build_parser()
    for example in RUN_EXAMPLES:
        assert f"\n  {example}\n" in help_text + "\n"  # its line whole, not wrapped
        assert example in readme, example
        parsed = parser.parse_args(shlex.split(example)[1:])
        assert parsed.command == "run"


def test_every_built_in_command_parses_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("run", "plugins", "devices", "machines", "workloads", "sweep", "report", "results"):
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0, command
        assert capsys.readouterr().out.startswith(f"usage: core {command}"), command


def test_version_imports_nothing_heavy() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from core.cli import main\ntry: main(['--version'])\n"
            "except SystemExit as e: assert e.code == 0\n"
            f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]; assert not heavy, heavy",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("core ")
