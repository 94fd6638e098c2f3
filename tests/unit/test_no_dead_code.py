"""No dead code: every public function of hpcsweep has a caller outside the tests.

A caller is any use of the function's name in the code that ships or that people run: the
package, the Hydra plugins, the scripts and the benchmarks, plus the names that configs, sbatch
scripts and setup.cfg spell out (``_target_``, entry points). Docstrings do not count: a function
that only a docstring or a test mentions is dead. Matching is by name, so a function is only
reported when no code anywhere uses its name; methods are left out (Hydra, submitit and Python
call them by protocol).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORD = re.compile(r"\w+")

def python_sources() -> list[Path]:
    scripts = [p for p in (REPO / "scripts").iterdir()
               if p.is_file() and p.read_text().startswith("#!/usr/bin/env python")]
    return [*(REPO / "hpcsweep").rglob("*.py"), *(REPO / "hydra_plugins").rglob("*.py"),
            *(REPO / "benchmarks").rglob("*.py"), *(REPO / "configs").rglob("*.py"), *scripts]


def text_sources() -> list[Path]:
    return [*(REPO / "configs").rglob("*.yaml"), *(REPO / "slurm").glob("*.sbatch"), *(REPO / "scripts").glob("*.sh"),
            REPO / "setup.cfg"]


def docstring_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """The string constants that are docstrings: of a module, class or function, or after an assignment."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for before, statement in zip([None, *body], body):
            is_string = isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and isinstance(
                statement.value.value, str)
            documents = (before is None and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                              ast.AsyncFunctionDef))
                         or isinstance(before, (ast.Assign, ast.AnnAssign)))
            if is_string and documents:
                yield statement.value


def names_used(tree: ast.AST) -> set[str]:
    """Every name ``tree`` loads, reads as an attribute, imports, or spells in a string (``getattr``)."""
    docstrings = {id(node) for node in docstring_nodes(tree)}
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.alias):
            used.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            used.update(WORD.findall(node.value))
    return used


def public_functions(path: Path) -> dict[str, str]:
    """``module.function -> function`` for the public top-level functions of ``path``."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return {f"{module}.{node.name}": node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")}


def dead_functions() -> set[str]:
    used = set().union(*(names_used(ast.parse(p.read_text())) for p in python_sources()))
    used |= {word for p in text_sources() for word in WORD.findall(p.read_text())}
    functions = {k: v for p in (REPO / "hpcsweep").rglob("*.py") for k, v in public_functions(p).items()}
    return {qualified for qualified, name in functions.items() if name not in used}


def test_every_public_function_has_a_caller_outside_the_tests():
    dead = dead_functions()
    assert dead == set(), f"dead (delete them, with the tests that only test them): {sorted(dead)}"


def test_a_docstring_or_an_assignment_is_no_caller():
    tree = ast.parse('"""Calls ``helper``."""\nhelper = None\n"""Set by ``other``."""\ndef f():\n    return run()\n')
    assert names_used(tree) == {"run"}
