"""Each fact is written once, in its home, and imported everywhere else: two lists of one concept drift apart.

- the target that takes no loss, ``-100``: ``hpcsweep/model/ignore_index.py`` (torch-free, so the preparation,
  the memory plan and the workers may all import it);
- the regex of a module inside one routed expert, and the fused expert tensors' names: ``hpcsweep/model/lora_targets.py``;
- the config keys that hold a MoE layer's routed-expert count: ``hpcsweep/model/expert_count.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hpcsweep"

IGNORE_HOME = "hpcsweep/model/ignore_index.py"
LORA_TARGETS_HOME = "hpcsweep/model/lora_targets.py"
EXPERT_COUNT_HOME = "hpcsweep/model/expert_count.py"

_MINUS_100 = re.compile(r"(?<![\w.])-\s*100(?![\w.])")
"""``-100`` as a number of its own (not ``0-100%``, ``81-100``, ``1e-100``), in code, docstrings or comments."""
_EXPERT_REGEX = re.compile(r"experts\\\.(?:\\d|\[0-9\])")
"""The source of a regex that matches ``experts.N.``: ``experts\\.\\d+`` or ``experts\\.[0-9]+``."""
FUSED_TENSORS = ("gate_up_proj", "down_proj")
COUNT_KEYS = {"n_routed_experts", "num_local_experts", "num_experts"}


def strings_of(node: ast.AST) -> list[str]:
    """The string constants directly inside a tuple, list or set literal."""
    return [e.value for e in getattr(node, "elts", ()) if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def is_fused(name: str, tensor: str) -> bool:
    return name == tensor or name.endswith(f".{tensor}")


def duplicates(files: dict[str, str]) -> list[str]:
    """Where a fact is written outside its home, for ``{path: source}``."""
    found = []
    for path, text in sorted(files.items()):
        if path != IGNORE_HOME:
            found += [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: -100" for m in _MINUS_100.finditer(text)]
        if path == LORA_TARGETS_HOME:
            continue
        found += [f"{path}: the routed-expert module regex" for _ in _EXPERT_REGEX.finditer(text)][:1]
        for node in ast.walk(ast.parse(text)):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and is_fused(node.value, "gate_up_proj"):
                found.append(f"{path}:{line}: the fused expert tensor {node.value!r}")
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = strings_of(node)
                if all(any(is_fused(name, tensor) for name in names) for tensor in FUSED_TENSORS):
                    found.append(f"{path}:{line}: the fused expert tensors {names}")
                if path != EXPERT_COUNT_HOME and len(COUNT_KEYS & set(names)) >= 2:
                    found.append(f"{path}:{line}: the routed-expert count keys {names}")
    return found


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_each_fact_is_written_only_in_its_home():
    assert duplicates(package_sources()) == []


def test_the_homes_hold_the_facts():
    from hpcsweep.model import expert_count, lora_targets
    from hpcsweep.model.ignore_index import IGNORE_INDEX

    assert IGNORE_INDEX == -100
    assert lora_targets.EXPERT_TENSORS == FUSED_TENSORS
    assert lora_targets.EXPERT_PARAMETERS == ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
    assert lora_targets.is_routed_expert_module("model.layers.1.mlp.experts.7.gate_proj")
    assert set(expert_count.ROUTED_EXPERT_KEYS) == COUNT_KEYS


@pytest.mark.parametrize(
    "planted, found",
    [
        ("IGNORE = -100\n", "hpcsweep/train/x.py:1: -100"),
        ("counted = targets != -100\n", "hpcsweep/train/x.py:1: -100"),
        ('EXPERTS = r"(?:.*\\.)?experts\\.\\d+\\..+"\n', "hpcsweep/train/x.py: the routed-expert module regex"),
        ('EXPERT_TENSORS = ("gate_up_proj", "down_proj")\n',
         "hpcsweep/train/x.py:1: the fused expert tensor 'gate_up_proj'"),
        ('NAMES = ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]\n',
         "hpcsweep/train/x.py:1: the fused expert tensor 'mlp.experts.gate_up_proj'"),
        ('KEYS = ("num_local_experts", "num_experts")\n',
         "hpcsweep/train/x.py:1: the routed-expert count keys ['num_local_experts', 'num_experts']"),
    ],
)
def test_a_planted_duplicate_is_caught(planted, found):
    assert found in duplicates({**package_sources(), "hpcsweep/train/x.py": planted})


def test_what_only_looks_like_a_fact_is_not_caught():
    harmless = ('"""0-100% in colour, steps 81-100, 1e-100."""\n'
                'x = experts.gate_up_proj.dtype\n'
                'TARGETS = ("gate_proj", "up_proj", "down_proj")\n'
                'FIELDS = ("dropout", "n_routed_experts", "num_experts_per_tok")\n')
    assert duplicates({"hpcsweep/train/x.py": harmless}) == []
