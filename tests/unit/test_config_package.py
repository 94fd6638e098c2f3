"""The ``hpcsweep.config`` package: small modules, every public name reachable from the package."""

import ast
from pathlib import Path

import hpcsweep.config

CONFIG = Path(hpcsweep.config.__file__).parent
MAX_LINES = 400
"""Split a module once it passes about 400 lines (STYLE.md, rule 1)."""


def test_no_config_module_is_over_400_lines():
    long = {p.name: n for p in sorted(CONFIG.glob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules of hpcsweep/config/ (lines): {long}"


def test_the_package_exports_every_public_name_of_its_modules():
    defined = set()
    for path in CONFIG.glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
    public = {name for name in defined if not name.startswith("_")}
    assert sorted(public - set(hpcsweep.config.__all__)) == []
    assert all(hasattr(hpcsweep.config, name) for name in hpcsweep.config.__all__)
