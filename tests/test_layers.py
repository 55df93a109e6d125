"""The import rules between the top-level packages, read from the source (no import runs).

``gridmarket`` is the ground floor: it imports none of the apps. The apps (``scheduler``,
``mediator``, ``agent``, ``frontend_api``) never import each other: what two of them share (the
chain watcher, the RPC retry rules, the output check) lives in ``gridmarket``. ``devstack`` (the
local grid for development and tests) sits above them all: no runtime package imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ("gridmarket", "scheduler", "mediator", "agent", "frontend_api")
APPS = ("scheduler", "mediator", "agent", "frontend_api")


def imported_packages(path: Path) -> set[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the module at ``path``, including
    the ones inside functions and ``TYPE_CHECKING`` blocks."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
    return found


def forbidden_imports(package: str, forbidden: set[str]) -> list[str]:
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, f"no modules under {package}/"
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules
        for line, name in sorted(imported_packages(path))
        if name in forbidden
    ]


@pytest.mark.parametrize("package", RUNTIME)
def test_no_runtime_package_imports_the_devstack(package: str) -> None:
    assert forbidden_imports(package, {"devstack"}) == []


def test_gridmarket_imports_no_app() -> None:
    assert forbidden_imports("gridmarket", {*APPS, "devstack"}) == []


@pytest.mark.parametrize("app", APPS)
def test_apps_do_not_import_each_other(app: str) -> None:
    assert forbidden_imports(app, set(APPS) - {app}) == []


def test_the_checker_sees_imports_in_functions_and_from_forms(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n"
        "from devstack.anvil import Anvil\n"
        "def f():\n"
        "    import scheduler.store as s\n"
        "from . import sibling\n"
    )
    assert imported_packages(module) == {(1, "os"), (2, "devstack"), (4, "scheduler")}
