"""The test tiers of tests/conftest.py name tests that exist, and mark what they say."""

import ast

from tests.conftest import SLOW_MODULES, SLOW_TESTS, UNIT_TESTS, is_slow


def functions_of(module: str) -> set[str]:
    tree = ast.parse((UNIT_TESTS / module).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_slow_test_named_exists():
    assert {m for m in SLOW_MODULES if not (UNIT_TESTS / m).exists()} == set()
    missing = {module: names - functions_of(module) for module, names in SLOW_TESTS.items()}
    assert {module: names for module, names in missing.items() if names} == {}


def test_slow_means_a_listed_unit_test_or_module():
    assert is_slow(UNIT_TESTS / "test_trainer_ddp.py", "test_ranks_record_where_they_ran")
    assert is_slow(UNIT_TESTS / "test_local_sweep.py", "test_local_sweep_runs_every_trial_and_writes_sweep_json")
    assert not is_slow(UNIT_TESTS / "test_local_sweep.py", "test_forced_local_launcher_and_bad_value_runs_nothing")
    assert not is_slow(UNIT_TESTS.parent / "cluster" / "test_trainer_ddp.py", "test_ranks_record_where_they_ran")
