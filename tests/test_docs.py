"""The documentation agrees with the code.

- every hook in core/contract/hookspecs.py has a ``## <hook>`` section in docs/hooks.md with its exact
  signature, and the section's example registers and runs;
- local Markdown links resolve; ``core.<name>`` references in backticks exist; every ``core``
  command shown parses;
- snippets quoted from the example plugin appear in its source verbatim;
- the example plugin, installed and found only through its entry point, works end to end (slow).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import core.contract.hookspecs
from core.base.config import make_config
from core.base.results import RunResult
from core.contract.manager import PluginManager, PluginState
from core.testing import run_context

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLE_PLUGIN = DOCS / "example-plugin"
HOOKS_MD = DOCS / "hooks.md"
MARKDOWN_FILES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


# --- helpers ---------------------------------------------------------------------------------


def hook_specs() -> dict[str, types.FunctionType]:
    """Every function in core.contract.hookspecs carrying pluggy's spec marker (``core_spec``)."""
    marker = f"{core.contract.hookspecs.PROJECT_NAME}_spec"
    return {
        name: function
        for name, function in inspect.getmembers(core.contract.hookspecs, inspect.isfunction)
        if hasattr(function, marker)
    }


def normalise_signature(text: str) -> str:
    """One line, single spaces, no padding inside the parentheses, no trailing comma."""
    text = " ".join(text.split())
    text = re.sub(r"\(\s+", "(", text)
    text = re.sub(r",?\s*\)", ")", text)
    return text


def source_signature(function: types.FunctionType) -> str:
    """``def name(params) -> ret:`` exactly as written in the source (quoted annotations kept)."""
    source = inspect.getsource(function)
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    lines = source.splitlines(keepends=True)
    body_start = sum(len(line) for line in lines[: node.body[0].lineno - 1]) + node.body[0].col_offset
    header = source[source.index("def ") : body_start].rstrip()
    assert header.endswith(":"), header
    return normalise_signature(header)


def markdown_sections(text: str) -> dict[str, str]:
    """``## heading`` -> the text up to the next heading of level 1 or 2."""
    sections: dict[str, str] = {}
    for match in re.finditer(r"^## (.+?)\s*$(.*?)(?=^#{1,2} |\Z)", text, re.S | re.M):
        sections[match.group(1)] = match.group(2)
    return sections


def code_blocks(text: str, language: str | None = None) -> list[str]:
    return [m.group(2) for m in _FENCE.finditer(text) if language is None or m.group(1) == language]


def hook_section(name: str) -> str:
    sections = markdown_sections(HOOKS_MD.read_text(encoding="utf-8"))
    assert name in sections, f"docs/hooks.md has no '## {name}' heading"
    return sections[name]


def load_example_module(name: str, code: str) -> types.ModuleType:
    module = types.ModuleType(f"hooks_md_example_{name}")
    exec(compile(code, f"docs/hooks.md ({name} example)", "exec"), module.__dict__)
    return module


def contains_lines(haystack: str, needle: str) -> bool:
    """True if needle's lines occur consecutively in haystack, all shifted by one common indent."""
    hay = haystack.splitlines()
    lines = needle.rstrip("\n").splitlines()
    first = lines[0]
    for start, candidate in enumerate(hay):
        if not candidate.endswith(first) or candidate[: len(candidate) - len(first)].strip():
            continue
        indent = candidate[: len(candidate) - len(first)]
        window = hay[start : start + len(lines)]
        if len(window) == len(lines) and all(
            (h == indent + n) if n.strip() else not h.strip() for h, n in zip(window, lines)
        ):
            return True
    return False


# --- hooks.md --------------------------------------------------------------------------------

HOOKS = sorted(hook_specs())


def test_hookspecs_found() -> None:
    assert len(HOOKS) >= 6, HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_documented_with_exact_signature(hook: str) -> None:
    section = hook_section(hook)
    blocks = code_blocks(section, "python")
    assert blocks, f"docs/hooks.md '## {hook}' has no python code block with its signature"
    expected = source_signature(hook_specs()[hook])
    documented = normalise_signature(blocks[0])
    assert documented == expected, f"docs/hooks.md signature of {hook} differs from core/contract/hookspecs.py"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_firstresult_documented(hook: str) -> None:
    firstresult = getattr(hook_specs()[hook], f"{core.contract.hookspecs.PROJECT_NAME}_spec")["firstresult"]
    assert ("firstresult" in hook_section(hook)) == firstresult


@pytest.fixture
def example_plugin_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))


def _exercise(hook: str, manager: PluginManager, tmp_path: Path) -> None:
    """Call the hook the way core does and check the example did its job."""
    from core_example_plugin import ExampleCpuAccelerator

    config = make_config(workload="example-mlp", accelerator="example-cpu", micro_batch_size=4)
    if hook == "core_register_accelerators":
        assert "example-cpu" in manager.accelerators
    elif hook == "core_register_workloads":
        assert "example-mlp" in manager.workloads
    elif hook == "core_register_power_meters":
        factory = manager.power_meters["example-no-sensor"].item
        assert manager.meters_reading("example-cpu") == [factory] and factory.availability().available
        meter = factory.meter_for([], run_context(config))
        meter.start()
        assert meter.stop().unavailable_reason
    elif hook == "core_register_precisions":
        import torch

        policy = manager.precisions["fp64"].item
        assert manager.plugin_of(policy) == "hooks_md_example_core_register_precisions"
        step = policy("cpu")
        model = step.convert_module(torch.nn.Linear(3, 2))
        with step.forward_context():
            assert model(step.convert_input(torch.ones(1, 3))).dtype == torch.float64
    elif hook == "core_select_power_meter":
        from core import Availability, PowerMeterFactory

        class WallPlug(PowerMeterFactory):
            name = "example-wall-plug"
            accelerators = ("example-gpu",)  # not example-cpu: core's fallback would never pick it

            def availability(self) -> Availability:
                return Availability.yes()

            def create(self, devices: Any, config: Any) -> Any:
                raise NotImplementedError

        wall_plug = WallPlug()
        select = manager.hook.core_select_power_meter
        assert select(accelerator=ExampleCpuAccelerator(), config=config, candidates=[wall_plug]) is wall_plug
    elif hook == "core_register_machines":
        from core.machines import load_machine

        profile = load_machine("example-node", shipped=manager.machine_profiles())
        assert profile.accelerator == "example-cpu" and profile.host_cores == 4
    elif hook == "core_register_packages":
        assert manager.package_names() == ["core-example-plugin"]
    elif hook == "core_run_started":
        manager.hook.core_run_started(config=config)
    elif hook == "core_register_commands":
        import argparse

        command = manager.commands["example-info"].item
        parser = argparse.ArgumentParser()
        assert command.add_arguments is not None
        command.add_arguments(parser)
        assert command.run(parser.parse_args(["--json"])) == 0
    elif hook == "core_report_sections":
        from core.contract.manager import set_plugin_manager
        from core.report.document import Heading, Table
        from core.report.extensions import plugin_sections

        result = RunResult(
            workload="example-mlp",
            accelerator="example-cpu",
            framework="torch",
            config=config,
            samples_per_update=4,
            samples_per_host_call=4,
            world_size=1,
            throughput_per_second=10.0,
        )
        previous = set_plugin_manager(manager)
        try:
            blocks, left_out = plugin_sections([result])
        finally:
            set_plugin_manager(previous)
        assert not left_out and blocks[0] == Heading(2, "The example accelerator")
        table = next(block for block in blocks if isinstance(block, Table))
        assert [value.text for value in table.rows[0]] == ["example-mlp", "10"]
    elif hook == "core_result_ready":
        result = RunResult(
            workload="example-mlp",
            accelerator="example-cpu",
            framework="torch",
            config=config,
            samples_per_update=4,
            samples_per_host_call=4,
            world_size=1,
        )
        manager.hook.core_result_ready(result=result)
        lines = (tmp_path / "results.jsonl").read_text(encoding="utf-8").splitlines()
        assert RunResult.model_validate_json(lines[0]).workload == "example-mlp"
    else:
        pytest.fail(f"tests/test_docs.py does not know how to exercise {hook}; add it to _exercise")


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_example_registers_and_runs(
    hook: str, example_plugin_importable: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = code_blocks(hook_section(hook), "python")
    assert len(blocks) >= 2, f"docs/hooks.md '## {hook}' has no example after its signature"
    monkeypatch.chdir(tmp_path)
    module = load_example_module(hook, blocks[1])
    manager = PluginManager()
    record = manager.register_plugin(module, name=module.__name__)
    assert record.state is PluginState.loaded, record.error
    assert hook in record.hooks
    _exercise(hook, manager, tmp_path)


def test_every_device_hook_and_meter_declaration_is_documented() -> None:
    """What a device changes in core's PyTorch loop (each TorchDeviceHooks method and attribute) and
    what a meter declares it covers are extension points too: writing-a-plugin.md names each."""
    from core.contract.meter import PowerMeterFactory
    from core.executors.pytorch import TorchDeviceHooks

    guide = (DOCS / "writing-a-plugin.md").read_text(encoding="utf-8")
    names = [name for name in vars(TorchDeviceHooks) if not name.startswith("_")] + ["includes", "node_includes"]
    assert hasattr(PowerMeterFactory, "node_includes") and "after_backward" in names
    missing = [name for name in names if f"`{name}" not in guide]
    assert not missing, f"docs/writing-a-plugin.md does not name: {missing}"


def _public_members(cls: type) -> list[str]:
    """What a plugin author can override, set or read on ``cls``: its public attributes and methods,
    dataclass fields included, less what every object has."""
    import dataclasses

    names = {name for name in dir(cls) if not name.startswith("_") and name not in dir(object)}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return sorted(names)


def test_every_member_of_a_plugin_base_is_documented() -> None:
    """Each member of what a plugin subclasses or is handed is named in the guide (or hooks.md, or
    inference.md for the inference members): an undocumented override point does not exist for a
    third party writing from the docs."""
    from core.base.precision import PrecisionPolicy
    from core.contract.accelerator import Accelerator
    from core.contract.commands import Command
    from core.contract.context import RunContext
    from core.contract.launcher import Launcher
    from core.contract.meter import PowerMeter, PowerMeterFactory
    from core.contract.workload import Workload
    from core.executors.keras import KerasPlacement
    from core.executors.pytorch import TorchPlacement
    from core.executors.stand_in import CpuStandIn

    guides = ("writing-a-plugin.md", "hooks.md", "inference.md")
    docs = "".join((DOCS / name).read_text(encoding="utf-8") for name in guides)
    bases = (Accelerator, PowerMeterFactory, PowerMeter, Workload, RunContext, Launcher, PrecisionPolicy)
    missing = [
        f"{cls.__name__}.{name}"
        for cls in (*bases, TorchPlacement, KerasPlacement, Command, CpuStandIn)
        for name in _public_members(cls)
        if f"`{name}" not in docs and f".{name}" not in docs
    ]
    assert not missing, f"docs/writing-a-plugin.md does not name: {missing}"


def test_every_test_helper_is_documented() -> None:
    import core.testing

    guide = (DOCS / "writing-a-plugin.md").read_text(encoding="utf-8")
    testing = guide[guide.index("## Testing") :]
    helpers = [
        name
        for name, value in vars(core.testing).items()
        if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == "core.testing"
    ]
    signature = inspect.signature(core.testing.registered_plugins)
    parameters = [f"{name}=" for name in signature.parameters if name != "plugins"]
    assert "run_on_cpu_as" in helpers
    missing = [f"core.testing.{name}" for name in helpers if f"core.testing.{name}" not in testing]
    missing += [f"registered_plugins({name}...)" for name in parameters if name not in testing]
    assert not missing, f"docs/writing-a-plugin.md#testing does not describe: {missing}"


def test_plugins_json_fields_documented() -> None:
    """hooks.md lists the fields of `core plugins --json` exactly (`traceback` only with --verbose)."""
    from core.cli.listing import plugin_report
    from core.testing import registered_plugins

    with registered_plugins(types.ModuleType("empty"), entry_points=False):
        (row,) = plugin_report()
    text = " ".join(HOOKS_MD.read_text(encoding="utf-8").split())
    listed = re.search(r"`core plugins --json`, with the fields (.+?)\)", text)
    assert listed, "hooks.md no longer lists the fields of `core plugins --json`"
    assert sorted(re.findall(r"`(\w+)`", listed.group(1))) == sorted(row)


def test_builtin_command_names_documented() -> None:
    from core.contract.commands import BUILTIN_COMMANDS

    section = " ".join(hook_section("core_register_commands").split())
    reserved = re.search(r"it may not be one of core's own commands \((.+?)\)", section)
    assert reserved, "hooks.md no longer lists core's own command names"
    assert sorted(re.findall(r"`([a-z-]+)`", reserved.group(1))) == sorted(BUILTIN_COMMANDS)


# --- links, names and commands in every document ---------------------------------------------


def _local_links(path: Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    text = _FENCE.sub("", text)  # links inside code are code, not links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            yield target


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", _FENCE.sub("", markdown), re.M):
        text = re.sub(r"[`*]|\\", "", heading).strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("document", MARKDOWN_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_local_links_resolve(document: Path) -> None:
    broken = []
    for target in _local_links(document):
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path) if path else document
        if not resolved.exists():
            broken.append(target)
        elif (
            anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text(encoding="utf-8"))
        ):
            broken.append(target)
    assert not broken, f"{document.relative_to(ROOT)} has links to missing files or headings: {broken}"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("document", MARKDOWN_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_core_names_in_backticks_exist(document: Path) -> None:
    names = set(re.findall(r"`(core(?:\.[A-Za-z_]\w*)+)(?:\(\))?`", document.read_text(encoding="utf-8")))
    broken = []
    for name in sorted(names):
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            broken.append(name)
    assert not broken, f"{document.relative_to(ROOT)} names what core does not have: {broken}"


#: the modules a reader is meant to import from: a name they re-export is cited through them
PUBLIC_SURFACES = ("core", "core.plugin", "core.testing")


def _defined_at_top_level(module: types.ModuleType, name: str) -> bool:
    """Whether ``module``'s own source defines ``name`` (def, class or assignment), not imports it."""
    source = inspect.getsource(module)
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return True
    return False


def _cited_away_from_home(dotted: str) -> str | None:
    """Why ``core.x.y.Name`` is not how the docs should cite ``Name``, or None where it is.

    A name on the plugin surface is cited as ``core.plugin.Name`` (internal paths may move); any
    other name at the module that defines it, not at one that merely imports it (a re-export left
    behind when a module was split keeps working, but sends a reader to the wrong file), or at a
    package that declares it in ``__all__``."""
    import core.plugin

    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        name = parts[split]
        if module_name in PUBLIC_SURFACES or not hasattr(module, name) or inspect.ismodule(getattr(module, name)):
            return None
        if name in core.plugin.__all__:
            return f"{dotted}: cite it as core.plugin.{name}, the plugin surface"
        if hasattr(module, "__path__") and name in getattr(module, "__all__", ()):
            return None  # a package's declared face (core.sweep.SweepObserver)
        if not _defined_at_top_level(module, name):
            home = getattr(getattr(module, name), "__module__", None)
            where = f" (defined in {home})" if isinstance(home, str) and home.startswith("core") else ""
            return f"{dotted}: {module_name} only imports {name}{where}"
        return None
    return None


@pytest.mark.parametrize("document", MARKDOWN_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_core_names_cited_at_their_home(document: Path) -> None:
    if document.name == "changes.md":
        pytest.skip("the change log cites names as they were when each change was made")
    names = set(re.findall(r"`(core(?:\.[A-Za-z_]\w*)+)(?:\(\))?`", document.read_text(encoding="utf-8")))
    wrong = [why for name in sorted(names) if (why := _cited_away_from_home(name))]
    assert not wrong, f"{document.relative_to(ROOT)} cites names away from their home: {wrong}"


_REPOSITORY_PATH = re.compile(r"`((?:core|plugins|tests|scripts|examples|benchmarks|docs)/[\w./-]*\w/?)`")


@pytest.mark.parametrize("document", MARKDOWN_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_repository_paths_in_backticks_exist(document: Path) -> None:
    """A file or folder named in backticks (not a link, which test_local_links_resolve checks) exists,
    unless the sentence says it is gone."""
    if document.name == "changes.md":
        pytest.skip("the change log names files as they were")
    missing = []
    for line in document.read_text(encoding="utf-8").splitlines():
        for path in _REPOSITORY_PATH.findall(line):
            if not (ROOT / path).exists() and not re.search(r"removed|none any more|no longer", line):
                missing.append(path)
    assert not missing, f"{document.relative_to(ROOT)} names paths the repository does not have: {missing}"


def _shell_commands(document: Path) -> Iterator[list[str]]:
    for block in code_blocks(document.read_text(encoding="utf-8"), "bash"):
        for line in block.replace("\\\n", " ").splitlines():  # a trailing backslash continues the line
            for command in line.split("&&"):
                words = shlex.split(command, comments=True)
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value prefixes
                if words and (words[0] == "core" or words[0].endswith("/bin/core")):
                    # `[--json]` is usage notation for an optional flag: check the command without it.
                    yield [word for word in words[1:] if not (word.startswith("[") and word.endswith("]"))]


@pytest.mark.parametrize("document", MARKDOWN_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_core_commands_shown_parse(document: Path) -> None:
    from core.cli import build_parser

    parser = build_parser()
    for arguments in _shell_commands(document):
        try:
            parser.parse_args(arguments)
        except SystemExit as exited:
            if exited.code != 0:  # --help and --version print and end with 0: they parse
                pytest.fail(f"{document.relative_to(ROOT)}: `core {shlex.join(arguments)}` does not parse")


def test_snippets_appear_verbatim_in_their_source() -> None:
    """A block preceded by ``<!-- snippet: PATH -->`` must occur in PATH (repository-relative)."""
    found = 0
    for document in MARKDOWN_FILES:
        text = document.read_text(encoding="utf-8")
        for match in re.finditer(r"<!-- snippet: (\S+) -->\n```\w*\n(.*?)^```$", text, re.S | re.M):
            source, snippet = ROOT / match.group(1), match.group(2)
            assert source.is_file(), f"{document.name}: snippet source {match.group(1)} does not exist"
            assert contains_lines(source.read_text(encoding="utf-8"), snippet), (
                f"{document.name}: a snippet no longer matches {match.group(1)}:\n{snippet}"
            )
            found += 1
    assert found, "no snippets found: has the marker changed?"


# --- the example plugin itself (in this process, no install) ---------------------------------


def test_example_plugin_imports_no_framework() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(EXAMPLE_PLUGIN)!r}); import core_example_plugin; "
        "print([m for m in ('torch', 'tensorflow', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def torch_threads_restored() -> Iterator[None]:
    """The example accelerator sets torch's process-wide thread count; give other tests theirs back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _example_plugin_tests() -> list[str]:
    source = (EXAMPLE_PLUGIN / "tests" / "test_example_plugin.py").read_text(encoding="utf-8")
    return re.findall(r"^def (test_\w+)\(\)", source, re.M)


@pytest.mark.parametrize("name", _example_plugin_tests())
def test_example_plugin_own_tests_pass(
    name: str, example_plugin_importable: None, torch_threads_restored: None
) -> None:
    """docs/example-plugin/tests, run here (pytest's testpaths does not reach docs/)."""
    spec = importlib.util.spec_from_file_location(
        "example_plugin_tests", EXAMPLE_PLUGIN / "tests" / "test_example_plugin.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    getattr(module, name)()


# --- the example plugin, installed and found through its entry point only --------------------


def _has_setuptools(major: int) -> bool:
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) >= major
    except Exception:  # not installed, or an unparsable version
        return False


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """pip-install docs/example-plugin into a temporary directory; an environment that sees it."""
    base = tmp_path_factory.mktemp("example-plugin")
    source, target = base / "src", base / "site"
    # Build from a copy, so that setuptools' build/ and *.egg-info never land in docs/.
    shutil.copytree(EXAMPLE_PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--target",
        str(target),
        str(source),
    ]
    if _has_setuptools(64):
        command.insert(4, "--no-build-isolation")  # the build needs no package index
    # else pip fetches setuptools into an isolated build environment from the index.
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    environment = dict(os.environ)
    for variable in ("CORE_PLUGINS", "CORE_DISABLE_PLUGINS", "CORE_DISABLE_PLUGIN_AUTOLOAD"):
        environment.pop(variable, None)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), environment.get("PYTHONPATH")]))
    return environment


def core_cli(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.cli", *arguments],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.slow
def test_example_plugin_loads_through_its_entry_point(installed_example: dict[str, str]) -> None:
    completed = core_cli(installed_example, "plugins", "--json")
    assert completed.returncode == 0, completed.stderr
    plugins = {row["name"]: row for row in json.loads(completed.stdout)}
    example = plugins["example"]
    assert example["state"] == "loaded", example["error"]
    assert example["distribution"] == "core-example-plugin"
    assert example["module"] == "core_example_plugin"
    assert example["registers"]["accelerators"] == [{"name": "example-cpu", "available": True, "reason": None}]
    assert example["registers"]["workloads"] == [{"name": "example-mlp"}]


@pytest.mark.slow
def test_example_accelerator_runs_example_workload(installed_example: dict[str, str]) -> None:
    completed = core_cli(
        installed_example,
        "run",
        "example-mlp",
        "--accelerator",
        "example-cpu",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--json",
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["status"]["state"] == "ok"
    assert result["throughput_per_second"] > 0
    assert result["executor_details"]["torch_num_threads"] == 1
    assert result["executor_details"]["intra_op_threads"] == 1


@pytest.mark.slow
def test_example_accelerator_runs_builtin_fcnn(installed_example: dict[str, str]) -> None:
    completed = core_cli(
        installed_example,
        "run",
        "fcnn",
        "--accelerator",
        "example-cpu",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--batch-size",
        "8",
        "--precision",
        "bf16",
        "-o",
        "hidden_width=16",
        "-o",
        "input_width=8",
        "-o",
        "output_width=4",
        "--json",
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["status"]["state"] == "ok"
    assert result["accelerator"] == "example-cpu" and result["workload"] == "fcnn"
    assert result["throughput_per_second"] > 0
    assert result["executor_details"]["autocast_dtype"] == "bfloat16"
