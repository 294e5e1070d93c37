"""The package layering (pyproject's ``[tool.importlinter]`` contracts) and no import cycles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("lra", "models", "attention", "kernels")


def test_lint_imports_keeps_every_contract():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def module_graph() -> nx.DiGraph:
    """Module -> module imports (function-level imports included), packages' own ``__init__`` edges left out."""
    imports = grimp.build_graph(*PACKAGES)
    graph = nx.DiGraph()
    for module in imports.modules:
        for imported in imports.find_modules_directly_imported_by(module):
            if not module.startswith(imported + "."):  # a submodule importing its package's __init__
                graph.add_edge(module, imported)
    return graph


def test_no_import_cycles():
    cycles = [sorted(component) for component in nx.strongly_connected_components(module_graph()) if len(component) > 1]
    assert cycles == [], f"import cycles: {cycles}"

