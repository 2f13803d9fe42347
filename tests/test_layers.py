"""core's packages are layers (docs/layout.md#layers): no import that runs when a module is imported
reaches a higher layer, and no two packages import each other.

What runs at import time counts: a module's top-level statements, its class bodies, the branches of
a top-level ``if``, ``try`` or ``with``. An import under ``if TYPE_CHECKING:`` serves annotations
only and is allowed upward. An import inside a function runs when it is called: a lower layer may
reach up that way only where it says why in a comment and is listed in RUN_TIME_IMPORTS_UP below.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, NamedTuple

ROOT = Path(__file__).resolve().parent.parent

#: bottom to top. ``core`` is core/__init__.py; the other names are core's packages and top-level
#: modules. Packages of one layer may import each other one way only (no cycle).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("base",),  # plain types: config, errors, precision, the result document, process context, ...
    ("contract",),  # the hooks, the plugin manager, the bases plugins implement, the meter interface
    ("data", "workloads", "machines"),  # what a run reads and trains; the plugins' machine profiles
    ("energy", "roofs"),  # what a run draws; what a host can do at most (`core roofs`)
    ("executors",),
    ("running",),
    ("storage",),
    ("sweep", "api"),
    ("report",),
    ("cli",),
    ("core", "plugin", "testing", "_moved"),  # the public surfaces and the old import paths
)
LAYER_OF = {unit: index for index, units in enumerate(LAYERS) for unit in units}

#: imports up a layer inside a function, each with a comment at the import saying why
RUN_TIME_IMPORTS_UP = {
    ("core/contract/accelerator.py", "core.running.launch"),  # the default launcher, torchrun
    ("core/contract/internal_imports.py", "core.plugin"),  # the surface's names, for the warning
}

When = Literal["import", "call", "annotations"]


class Import(NamedTuple):
    where: str  # path:line
    importer: str  # the importing unit
    module: str  # the imported module
    when: When

    @property
    def imported(self) -> str:
        return unit_of(self.module)


def unit_of(module: str) -> str:
    """The package or top-level module of core that the dotted ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "core"


def _targets(node: ast.Import | ast.ImportFrom, package: str, root: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    # ``from core import api`` imports the module core.api; ``from core import run`` only core.
    submodules = [f"{base}.{alias.name}" for alias in node.names]
    found = [m for m in submodules if (root / Path(*m.split("."))).with_suffix(".py").exists()]
    return found + [m for m in submodules if (root / Path(*m.split(".")) / "__init__.py").exists()] or [base]


def _imports(nodes: Iterable[ast.AST], when: When) -> Iterator[tuple[ast.Import | ast.ImportFrom, When]]:
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, when
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _imports(ast.iter_child_nodes(node), "call" if when == "import" else when)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _imports(node.body, "annotations")
            yield from _imports(node.orelse, when)
        else:
            yield from _imports(ast.iter_child_nodes(node), when)


def core_imports(root: Path) -> Iterator[Import]:
    """Every import of a module of core by a module of another unit of core."""
    for path in sorted((root / "core").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, when in _imports(ast.parse(path.read_text(encoding="utf-8")).body, "import"):
            for target in _targets(node, package, root):
                if target.split(".")[0] == "core" and unit_of(target) != unit_of(module):
                    yield Import(f"{path.relative_to(root).as_posix()}:{node.lineno}", unit_of(module), target, when)


def goes_up(found: Import) -> bool:
    return LAYER_OF[found.imported] > LAYER_OF[found.importer]


def layering_problems(root: Path) -> list[str]:
    """What breaks the layers at import time, one line each, naming the module, the import and the layers."""
    problems, edges = [], {}
    for found in core_imports(root):
        unplaced = [unit for unit in (found.importer, found.imported) if unit not in LAYER_OF]
        if unplaced:
            problems.append(f"{found.where}: core.{unplaced[0]} is in no layer (an old path? see core/_moved.py)")
        elif found.when == "import" and goes_up(found):
            problems.append(
                f"{found.where}: {found.importer} (layer {LAYER_OF[found.importer]}) imports {found.module}, of a "
                f"higher layer ({found.imported}, layer {LAYER_OF[found.imported]}): move the module to its layer"
            )
        if found.when == "import":
            edges.setdefault(found.importer, set()).add(found.imported)
    problems += [f"packages import each other at import time: {' -> '.join(cycle)}" for cycle in cycles(edges)]
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (first unit repeated at its end) through each group of units that reach each other."""
    found: list[list[str]] = []
    for start in sorted(edges):
        if any(start in cycle for cycle in found):
            continue
        paths, todo = {start: [start]}, [start]
        while todo:  # breadth first: the shortest way back to start
            unit = todo.pop(0)
            for nxt in sorted(edges.get(unit, ())):
                if nxt == start:
                    found.append([*paths[unit], start])
                    todo = []
                    break
                if nxt not in paths:
                    paths[nxt] = [*paths[unit], nxt]
                    todo.append(nxt)
    return found


def test_no_import_at_import_time_goes_up_a_layer_or_round_a_cycle() -> None:
    problems = layering_problems(ROOT)
    assert not problems, "core's layers (docs/layout.md#layers) are broken:\n" + "\n".join(problems)


def listed(found: Import) -> tuple[str, str]:
    return (found.where.split(":")[0], found.module)


def test_imports_up_inside_functions_are_the_listed_ones() -> None:
    up = {
        found
        for found in core_imports(ROOT)
        if found.when == "call" and {found.importer, found.imported} <= LAYER_OF.keys() and goes_up(found)
    }
    unlisted = sorted(f"{f.where}: {f.importer} imports {f.module}" for f in up if listed(f) not in RUN_TIME_IMPORTS_UP)
    assert not unlisted, (
        "an import inside a function reaches a higher layer: move the module down instead, or where it is "
        "needed only at run time say why in a comment there and list it in RUN_TIME_IMPORTS_UP:\n" + "\n".join(unlisted)
    )
    stale = RUN_TIME_IMPORTS_UP - {listed(f) for f in up}
    assert not stale, f"listed in RUN_TIME_IMPORTS_UP but no longer imported: {sorted(stale)}"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_the_check_finds_an_upward_import_a_cycle_and_an_old_path(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "core/__init__.py": "from core.api import run\n",
            "core/api.py": "def run():\n    pass\n",
            "core/base/__init__.py": "",
            "core/base/config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import core.running\n",
            "core/base/results.py": "try:\n    from core.running.launch import x\nexcept ImportError:\n    pass\n",
            "core/running/__init__.py": "",
            "core/running/launch.py": "def later():\n    from core import api\n",
            "core/data/__init__.py": "from core.workloads import zoo\n",
            "core/workloads/__init__.py": "",
            "core/workloads/zoo.py": "class Zoo:\n    from core.data import loading\n",
            "core/storage/__init__.py": "def f():\n    from core.cli import main\nfrom core.config import RunConfig\n",
        },
    )
    problems = layering_problems(root)
    assert problems == [
        "core/base/results.py:2: base (layer 0) imports core.running.launch, of a higher layer (running, "
        "layer 5): move the module to its layer",
        "core/storage/__init__.py:3: core.config is in no layer (an old path? see core/_moved.py)",
        "packages import each other at import time: data -> workloads -> data",
    ]
    # inside a function: no edge of the graph, but found for RUN_TIME_IMPORTS_UP
    ups = [f for f in core_imports(root) if f.when == "call" and goes_up(f)]
    assert [(f.where, f.module) for f in ups] == [
        ("core/running/launch.py:2", "core.api"),
        ("core/storage/__init__.py:2", "core.cli"),
    ]


def test_the_layout_doc_draws_these_layers() -> None:
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[2] for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    drawn = tuple(
        tuple("core" if name == "__init__" else name for name in re.findall(r"`(?:core/)?([\w]+)(?:/|\.py)`", row))
        for row in rows
    )
    assert drawn == LAYERS
