"""The Graphcore code path must run on the Poplar SDK's last stack: Python 3.10 and torch 2.0.1.

Every repository module that a Graphcore run imports (found by running one, on the fakes, in a
fresh interpreter) must parse as Python 3.10 (``ast.parse(feature_version=(3, 10))``, and
``py_compile`` under a real 3.10 interpreter where one is installed), and use no standard-library
or torch API newer than that stack. Also: ``core plugins`` lists graphcore as unavailable here with
the install instruction, without importing any framework or SDK.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKES = Path(__file__).parent / "fakes" / "graphcore"
PYTHON_310 = Path("/root/.pyenv/versions/3.10.13/bin/python")

# APIs that do not exist on Python 3.10 or torch 2.0.1 (the version that added each in brackets).
NEWER_APIS = {
    r"(?m)^\s*(?:import\s+tomllib\b|from\s+tomllib\s+import)": "tomllib (3.11)",
    r"\bStrEnum\b": "enum.StrEnum (3.11)",
    r"\bExceptionGroup\b|\bexcept\s*\*": "exception groups (3.11)",
    r"\bTaskGroup\b": "asyncio.TaskGroup (3.11)",
    r"datetime\.UTC\b|from datetime import [^\n]*\bUTC\b": "datetime.UTC (3.11)",
    r"typing\.(Self|LiteralString|Never|assert_never|reveal_type|Required|NotRequired|Unpack|TypeVarTuple"
    r"|override)\b": "typing additions (3.11+)",
    r"from typing import [^\n]*\b(Self|LiteralString|Never|assert_never|Required|NotRequired|Unpack"
    r"|override)\b": "typing additions (3.11+)",
    r"contextlib\.chdir|hashlib\.file_digest|math\.(cbrt|exp2)\b|itertools\.batched": "stdlib additions (3.11+)",
    r"torch\.amp\.GradScaler": "torch.amp.GradScaler (torch 2.3)",
    r"torch\.accelerator\b": "torch.accelerator (torch 2.6)",
    r"torch\.compiler\b": "torch.compiler (torch 2.1)",
    r"torch\.export\b": "torch.export (torch 2.1)",
    r"torch\.nn\.attention\b": "torch.nn.attention (torch 2.2)",
    r"torch\.float8": "float8 dtypes (torch 2.1)",
    r"torch\.get_device_module\b": "torch.get_device_module (torch 2.3)",
    r"torch\.library\.custom_op\b": "torch.library.custom_op (torch 2.4)",
    r"device_mesh\b": "torch.distributed.device_mesh (torch 2.2)",
    r"torch\.utils\._pytree\.register_pytree_node\b": "public pytree registration (torch 2.2)",
}

# Imports one Graphcore run (PopTorch, pipelined, gcipuinfo meter, IPU Model) and the TensorFlow
# path's module, then prints the repository files it loaded.
_PROBE = """
import json, os, sys
sys.path.insert(0, {fakes!r})
import gcipuinfo
gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(4, **{{"user process id": str(os.getpid())}}))
from core import run
from core.testing import TINY_FCNN
import core_plugins.graphcore.tensorflow
result = run("fcnn", "graphcore", workload_options=TINY_FCNN, micro_batch_size=4, replicas=2, devices_per_replica=2,
             gradient_accumulation=3, device_iterations=2, steps=2, warmup_steps=1, power_sample_interval_seconds=0.01)
assert result.status.ok, result.status
assert result.energy_joules, result.energy_unavailable_reason
# Only the project's own packages: a virtual environment inside the checkout is not on the path.
roots = tuple(os.path.join({root!r}, package) + os.sep for package in ("core", "plugins"))
files = sorted({{m.__file__ for m in list(sys.modules.values())
                 if getattr(m, "__file__", None) and m.__file__.startswith(roots) and m.__file__.endswith(".py")}})
print(json.dumps(files))
"""


@pytest.fixture(scope="module")
def graphcore_path_files() -> list[Path]:
    code = _PROBE.format(fakes=str(FAKES), root=str(ROOT) + os.sep)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    files = [Path(f) for f in json.loads(completed.stdout.strip().splitlines()[-1])]
    assert any(f.name == "executor.py" and f.parent.name == "graphcore" for f in files)
    assert ROOT / "core" / "running" / "runner.py" in files and ROOT / "core" / "energy" / "meters.py" in files
    return files


def test_graphcore_path_parses_as_python_310(graphcore_path_files: list[Path]) -> None:
    every_plugin_file = sorted((ROOT / "plugins" / "graphcore").rglob("*.py"))
    for path in sorted(set(graphcore_path_files) | set(every_plugin_file)):
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 10))


@pytest.mark.skipif(not PYTHON_310.exists(), reason=f"no Python 3.10 interpreter at {PYTHON_310}")
def test_graphcore_path_compiles_under_python_310(graphcore_path_files: list[Path], tmp_path: Path) -> None:
    every_plugin_file = sorted((ROOT / "plugins" / "graphcore").rglob("*.py"))
    files = sorted({str(p) for p in graphcore_path_files} | {str(p) for p in every_plugin_file})
    # Compile to a scratch location: no __pycache__ written into the repository by another interpreter.
    code = (
        "import py_compile, sys\n"
        "for i, f in enumerate(sys.argv[1:]):\n"
        f"    py_compile.compile(f, cfile={str(tmp_path)!r} + '/%d.pyc' % i, doraise=True)\n"
    )
    completed = subprocess.run([str(PYTHON_310), "-c", code, *files], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


_GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "AttributeError"}


def feature_detected_lines(source: str) -> set[int]:
    """Lines that only run where the feature exists: the body of ``try`` blocks that catch a
    missing module or attribute, and of ``if`` blocks testing ``hasattr``/``sys.version_info``."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        guarded: list[ast.stmt] = []
        if isinstance(node, ast.Try):
            caught = {
                n.id for h in node.handlers if h.type is not None for n in ast.walk(h.type) if isinstance(n, ast.Name)
            }
            if caught & _GUARD_EXCEPTIONS:  # the new API, and the fallback for where it is missing
                guarded = node.body + [statement for handler in node.handlers for statement in handler.body]
        elif isinstance(node, ast.If) and re.search(r"hasattr|version_info", ast.unparse(node.test)):
            guarded = node.body
        for statement in guarded:
            lines.update(range(statement.lineno, (statement.end_lineno or statement.lineno) + 1))
    return lines


def newer_api_uses(source: str) -> list[tuple[int, str]]:
    guarded = feature_detected_lines(source)
    found = []
    for pattern, what in NEWER_APIS.items():
        for match in re.finditer(pattern, source):
            line = source.count("\n", 0, match.start()) + 1
            if line not in guarded:
                found.append((line, what))
    return found


def test_graphcore_path_uses_no_newer_python_or_torch_api(graphcore_path_files: list[Path]) -> None:
    found = []
    for path in sorted(set(graphcore_path_files) | set((ROOT / "plugins" / "graphcore").rglob("*.py"))):
        found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in newer_api_uses(path.read_text("utf-8"))]
    assert not found, "\n".join(found)


def test_the_denylist_catches_what_it_should() -> None:
    samples = {
        "from typing import Self": "typing additions (3.11+)",
        "scaler = torch.amp.GradScaler('cuda')": "torch.amp.GradScaler (torch 2.3)",
        "import tomllib": "tomllib (3.11)",
    }
    for source, what in samples.items():
        assert [w for _, w in newer_api_uses(source)] == [what], source
    # Feature detection is allowed: the new API runs only where it exists.
    assert newer_api_uses("try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n") == []
    assert newer_api_uses("if hasattr(torch.amp, 'GradScaler'):\n    s = torch.amp.GradScaler('cpu')\n") == []
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))


def test_core_plugins_lists_graphcore_unavailable_with_the_instruction() -> None:
    heavy = ("torch", "tensorflow", "poptorch", "gcipuinfo", "popdist")
    code = (
        "import sys, json; from core.cli import main; rc = main(['plugins', '--json']); "
        f"assert not [m for m in {heavy!r} if m in sys.modules], 'heavy import'; sys.exit(rc)"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr
    rows = {row["name"]: row for row in json.loads(completed.stdout)}
    graphcore = rows["graphcore"]
    assert graphcore["state"] == "loaded"
    (accelerator,) = graphcore["registers"]["accelerators"]
    assert accelerator["name"] == "graphcore" and accelerator["available"] is False
    assert "Poplar SDK" in accelerator["reason"] and "<sdk>/poptorch-*.whl" in accelerator["reason"]
    assert "torch==2.0.1" in accelerator["reason"] and "Python 3.10" in accelerator["reason"]
    (meter,) = graphcore["registers"]["power_meters"]
    assert meter["name"] == "gcipuinfo" and meter["available"] is False and "gcipuinfo-*.whl" in meter["reason"]


def test_pyproject_graphcore_extra_installs_nothing_from_an_index() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r"^graphcore = \[\]", text, re.M)
