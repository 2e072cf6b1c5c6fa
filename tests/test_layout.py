"""The package layout docs/architecture.md describes: no import points up a layer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "momentry_edge"
# docs/architecture.md's layers; every other module is a base module (layer 0).
LAYERS = {
    "store": 1,
    "outputs": 2,
    "cluster": 2,
    "stored_results": 3,
    "search": 3,
    "privacy": 3,
    "jobs": 4,
    "processors": 4,
    "upkeep": 4,
    "ingest": 5,
    "sidecars": 5,
    "provision": 5,
    "forget": 5,
    "worker": 6,
    "http": 6,
    "service": 7,
    "cli": 8,
}


def _imports() -> list[tuple[str, str, int]]:
    """(importing module, imported unit, line): every import of the package's own modules,
    those inside functions too, as the unit (package or top-level module) they name."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        here = [p for p in parts if p != "__init__"]
        package = here if path.name == "__init__.py" else here[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif (node.module or "").startswith("momentry_edge"):
                target = node.module.split(".")[1:]
            else:
                continue
            units = [target[0]] if target else [alias.name for alias in node.names]
            found += [(".".join(here) or "__init__", unit, node.lineno) for unit in units]
    return found


def _unit(module: str) -> str:
    return module.split(".")[0]


def test_no_import_points_up_from_one_package_to_a_higher_one() -> None:
    imports = _imports()
    assert any(unit == "jobs" for _, unit, _ in imports)  # the walk found the package's own
    up = [
        f"{module}:{line} imports {unit}"
        for module, unit, line in imports
        if _unit(module) != unit
        and LAYERS.get(unit, 0) >= LAYERS.get(_unit(module), 0)
        and LAYERS.get(unit, 0) > 0
    ]
    assert not up, "imports that point up (see docs/architecture.md): " + "; ".join(up)


def test_every_package_is_on_the_map() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), (
        f"add to LAYERS and docs/architecture.md: {packages - set(LAYERS)}"
    )


LONG_MODULE = 600  # lines
LONG_CLASS = 300


def test_a_long_module_or_class_says_at_its_top_why_it_is_one_piece() -> None:
    unexplained = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        name = path.relative_to(PACKAGE)
        if len(lines) > LONG_MODULE and not any("One piece" in line for line in lines[:15]):
            unexplained.append(f"{name} ({len(lines)} lines)")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.ClassDef) or node.end_lineno is None:
                continue
            size = node.end_lineno - node.lineno + 1
            top = lines[node.lineno - 1 : node.lineno + 10]
            if size > LONG_CLASS and not any("One piece" in line for line in top):
                unexplained.append(f"{name}:{node.name} ({size} lines)")
    assert not unexplained, "split these, or say at the top why each is one piece: " + (
        "; ".join(sorted(unexplained))
    )
