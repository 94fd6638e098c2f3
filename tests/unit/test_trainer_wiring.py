"""The Trainer's wiring is said once, in the order the data flows (issue 40 item 5): ``__init__`` stays short and
calls its parts in that order, each part reading only what an earlier one built."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "hpcsweep" / "train" / "trainer.py"
PARTS = ["_choose", "_build_model", "_distribute", "_build_training", "_start_reporting"]


def trainer_methods() -> dict[str, ast.FunctionDef]:
    (cls,) = [n for n in ast.parse(TRAINER.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def self_attributes(node: ast.AST, kind: type) -> set[str]:
    """The ``self.X`` names ``node`` stores (``ast.Store``) or reads (``ast.Load``)."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self" and isinstance(n.ctx, kind)}


def test_init_is_under_60_lines_and_builds_the_parts_in_data_flow_order():
    methods = trainer_methods()
    init = methods["__init__"]
    assert init.end_lineno - init.lineno + 1 < 60
    called = [n.func.attr for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr.startswith("_")]
    assert called == PARTS


def test_each_part_reads_only_what_init_or_an_earlier_part_built():
    methods = trainer_methods()
    built = self_attributes(methods["__init__"], ast.Store)
    for name in PARTS:
        part = methods[name]
        # Methods of the class (write_report, ...) are called later, by the lambdas the parts hand out.
        reads = self_attributes(part, ast.Load) - set(methods) - self_attributes(part, ast.Store)
        assert reads <= built, f"{name} reads {sorted(reads - built)} before any part built it"
        built |= self_attributes(part, ast.Store)
