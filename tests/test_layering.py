"""The package's layers: core <- stages <- workflow <- api <- cli. A module
imports (at the top or inside a function; ``if TYPE_CHECKING:`` blocks
aside) only modules of its own layer or below, and no import cycle exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "amp_convert"

LAYERS: dict[str, tuple[str, ...]] = {
    # tables, types and the graph index every stage shares
    "core": (
        "availability",
        "calls",
        "domains",
        "dtypes",
        "errors",
        "external",
        "graph",
        "graph_edit",
        "kernels",
        "lists",
        "op_profiles",
        "options",
        "order_stats",
        "ortschema",
        "ortversions",
        "passes",
        "schema",
        "typeinfo",
        "version",
    ),
    # load -> plan -> rewrite -> clean up -> check -> validate -> report -> save, and what they use
    "stages": (
        "as_written",
        "blame",
        "branch_runs",
        "calibrate",
        "check",
        "cleanup",
        "constant_stats",
        "coverage",
        "demand",
        "emulate",
        "fold",
        "input_roles",
        "input_specs",
        "inputs",
        "load",
        "lower_values",
        "macs",
        "metrics",
        "mixed_scales",
        "op_rules",
        "offenders",
        "opset",
        "ortinfer",
        "output_paths",
        "output_types",
        "pin",
        "plan",
        "planner",
        "report",
        "report_cells",
        "report_html",
        "report_text",
        "rewrite",
        "rewrite_targets",
        "runner",
        "safety",
        "sample_files",
        "segments",
        "saving",
        "sequence_stats",
        "token_lengths",
        "tolerance",
        "validation",
        "validation_result",
    ),
    "workflow": ("pipeline", "auto", "validation_steps", "workflow", "config"),
    "api": ("api", "mindspore"),
    "cli": ("cli", "cli_config", "cli_options", "cli_output", "cli_params", "__main__"),
}
RANK = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports, outside ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.level == 1:
                names = [child.module] if child.module else [alias.name for alias in child.names]
                found.update(name.split(".")[0] for name in names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


MODULES = {p.stem: _imports(p) for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}


def test_every_module_has_a_layer():
    assert sorted(set(MODULES) - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_only_downward(module):
    upward = sorted(m for m in MODULES[module] if RANK[m] > RANK[module])
    assert upward == [], f"{module} ({list(LAYERS)[RANK[module]]}) imports a higher layer: {upward}"


def test_no_import_cycle():
    done: set[str] = set()

    def walk(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join((*path[path.index(module) :], module)))
        if module in done:
            return
        for other in sorted(MODULES[module]):
            walk(other, (*path, module))
        done.add(module)

    for module in sorted(MODULES):
        walk(module, ())


def test_the_planner_does_not_run_onnxruntime_sessions():
    assert "runner" not in MODULES["plan"]


# The stages that do the work: the command line reaches them only through the workflow.
_PIPELINE = {
    *("pipeline", "planner", "rewrite", "cleanup", "check", "validation", "as_written"),
    *("auto", "calibrate", "runner", "saving"),
}


def test_the_cli_holds_no_pipeline_logic():
    """The command line's modules call the workflow, not the stages, and
    each command parses, calls and prints in at most about 60 lines."""
    cli = [m for m in LAYERS["cli"] if m != "__main__"]
    assert {m: sorted(MODULES[m] & _PIPELINE) for m in cli} == {m: [] for m in cli}
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    commands = [
        f for f in tree.body if isinstance(f, ast.FunctionDef) and any("command" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert len(commands) >= 3  # (convert, compare, lists)
    assert {f.name: f.end_lineno - f.lineno + 1 for f in commands if f.end_lineno - f.lineno + 1 > 60} == {}
