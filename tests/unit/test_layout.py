"""The package layout follows the data flow: imports run one way, with no cycle, and the login
node's commands import no torch. Inside ``train``, the rooms import down: never the trainer or the worker."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hpcsweep"
PLUGINS = REPO / "hydra_plugins" / "hpcsweep_plugins"

STAGES = ("sweep", "trial", "train", "results")
"""The stages in data-flow order: a stage may hand work to a later one, never import an earlier one."""
SHARED = ("config", "files", "slurm", "search", "control", "model", "memory_plan", "telemetry", "prepare", "container")
"""Shared by every stage; each imports only what is listed for it in ALLOWED. ``prepare`` is the preparation
job between the login node and the trials; it is shared, not a stage, because the workers read it too (the
tokenizer the cache entry was made with, and its pad id), and it imports no stage. ``container`` is a site's
container runtime as the login node writes it: the settings, the mounts and each runtime's flags, pure."""
TOOLS = ("export",)
"""After a sweep, beside the stages: reads trials with the workers' code; no stage imports a tool."""
COMMANDS = ("__main__", "app", "plan", "profile", "report", "retry", "status", "topology")
"""What users type: ``python -m hpcsweep[.plan|.profile|.report|.retry|.status|.topology]``; nothing imports them."""
ALLOWED = {
    "config": {"config"},
    "files": {"config", "files"},
    "slurm": {"config", "slurm"},
    "search": {"config", "files", "slurm", "search"},
    "control": {"files", "slurm", "control"},
    "model": {"model"},
    "memory_plan": {"config", "memory_plan", "model"},
    "telemetry": {"config", "telemetry"},
    "prepare": {"config", "files", "model", "prepare"},
    "container": {"config", "container"},
    **{stage: {*SHARED, *STAGES[i:]} for i, stage in enumerate(STAGES)},
    "export": {*SHARED, "train", "results", "export"},
}


def part_of(module: str) -> str | None:
    """The layout part of an hpcsweep module (``hpcsweep.trial.runner`` -> ``trial``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "hpcsweep" and len(parts) > 1 else None


def module_name(path: Path) -> str:
    relative = path.relative_to(REPO).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every hpcsweep or hydra_plugins module ``path`` imports, at the top or inside a function."""
    found = set()
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            # ``from hpcsweep.train import stop`` imports the module hpcsweep.train.stop.
            found.update(f"{base}.{alias.name}" for alias in node.names if module_exists(f"{base}.{alias.name}"))
    return {m for m in found if m.split(".")[0] in ("hpcsweep", "hydra_plugins")}


def module_exists(name: str) -> bool:
    path = REPO / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def source_files() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *PLUGINS.rglob("*.py")])


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in source_files()}
    return {name: {m for m in imported_modules(path) if m in modules and m != name} for name, path in modules.items()}


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the data flow: a back edge between stages, a shared part importing a stage,
    anything importing a command (but ``__main__`` its ``app``), the plugins importing a command."""
    bad = []
    for importer, imported in graph.items():
        source = part_of(importer)
        for target in sorted(imported):
            dest = part_of(target)
            if dest in COMMANDS:
                if not (importer == "hpcsweep.__main__" and dest == "app"):
                    bad.append(f"{importer} imports the command {target}")
            elif source in ALLOWED and dest is not None and dest not in ALLOWED[source]:
                bad.append(f"{importer} ({source}) imports {target} ({dest})")
            elif source in ALLOWED and target.startswith("hydra_plugins.hpcsweep_plugins"):
                bad.append(f"{importer} ({source}) imports the plugin {target}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, found by depth-first search (one path per cycle start)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_imports_follow_the_data_flow():
    assert layering_violations(import_graph()) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_checks_catch_a_back_edge_and_a_cycle():
    graph = {
        "hpcsweep.train.trainer": {"hpcsweep.sweep.prepare"},
        "hpcsweep.files.atomic": {"hpcsweep.results.table"},
        "hpcsweep.results.table": {"hpcsweep.status"},
        "hpcsweep.a": {"hpcsweep.b"},
        "hpcsweep.b": {"hpcsweep.a"},
    }
    assert layering_violations(graph) == [
        "hpcsweep.train.trainer (train) imports hpcsweep.sweep.prepare (sweep)",
        "hpcsweep.files.atomic (files) imports hpcsweep.results.table (results)",
        "hpcsweep.results.table imports the command hpcsweep.status",
    ]
    assert cycles(graph) == [["hpcsweep.a", "hpcsweep.b", "hpcsweep.a"]]


def listed(names: list[str], conjunction: str = "and") -> str:
    """``a``, ``b`` and ``c``: parts of the layout quoted, other words as they are."""
    quoted = [f"``{name}``" if name in ALLOWED else name for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} {conjunction} {quoted[-1]}"


def import_rule(part: str) -> str:
    """What ``part``'s docstring must say it may import, generated from ALLOWED (the source of truth).

    Stages name the shared packages as a group, so a new shared package changes no stage's sentence.
    """
    allowed = [p for p in (*SHARED, *STAGES) if p in ALLOWED[part] and p != part]
    never = [p for p in STAGES if p not in ALLOWED[part]]
    if part in STAGES or part in TOOLS:
        allowed = ["the shared packages", *[p for p in allowed if p in STAGES]]
        never_clause = listed([*never, "a command module"], "or")
    else:
        never_clause = "a stage or a command module"
    if not allowed:
        return f"Imports nothing of hpcsweep outside this package; never {never_clause}"
    return f"May import only {listed(allowed)}; never {never_clause}"


def packages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def test_every_package_is_in_the_layout_table():
    assert set(packages()) <= set(ALLOWED), f"add {sorted(set(packages()) - set(ALLOWED))} to SHARED or STAGES"


def test_each_package_docstring_states_the_import_rule_of_the_table():
    wrong = []
    for package in packages():
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or ""
        if import_rule(package) not in " ".join(doc.split()):
            wrong.append(f"hpcsweep/{package}/__init__.py must say: {import_rule(package)}.")
    assert wrong == [], "\n".join(wrong)


def test_the_import_rule_names_what_the_table_allows_and_forbids():
    assert import_rule("sweep") == (
        "May import only the shared packages, ``trial``, ``train`` and ``results``; never a command module")
    assert import_rule("trial") == (
        "May import only the shared packages, ``train`` and ``results``; never ``sweep`` or a command module")
    assert import_rule("results") == (
        "May import only the shared packages; never ``sweep``, ``trial``, ``train`` or a command module")
    assert import_rule("files") == "May import only ``config``; never a stage or a command module"
    assert import_rule("search") == (
        "May import only ``config``, ``files`` and ``slurm``; never a stage or a command module")
    assert import_rule("export") == (
        "May import only the shared packages, ``train`` and ``results``; never ``sweep``, ``trial`` or a command module")
    assert import_rule("prepare") == (
        "May import only ``config``, ``files`` and ``model``; never a stage or a command module")
    assert import_rule("container") == "May import only ``config``; never a stage or a command module"


@pytest.mark.parametrize(
    "modules",
    [
        ["hpcsweep.status"],
        ["hpcsweep.profile"],
        ["hpcsweep.report"],
        ["hpcsweep.retry", "hpcsweep.sweep.retry_submit"],
        ["hpcsweep.topology"],
        ["hpcsweep.plan", "hpcsweep.sweep.plan_preview"],
        ["hydra_plugins.hpcsweep_plugins.launchers", "hpcsweep.sweep.slurm_submit", "hpcsweep.sweep.prepare",
         "hpcsweep.sweep.memory_check"],
        ["hydra_plugins.hpcsweep_plugins.search_sweeper", "hpcsweep.search.study", "hpcsweep.search.trial_slot"],
    ],
)
def test_login_node_code_imports_no_torch(modules):
    code = f"import sys; import {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


TRAIN = PACKAGE / "train"
TRAIN_ROOMS = {
    "data": (),
    "moe": ("data",),
    "checkpoint": (),
    "trackers": (),
    "observe": (),
    "scores": (),
    "preference": (),
}
"""``train``'s rooms, a sub-package per concern, each with the other rooms it may import (the MoE room's
routed tokens are counted over a ``data`` batch)."""
TRAIN_BASE = ("distributed", "fault", "gpu_choices")
"""``train``'s top modules below the rooms: the world and its collectives, the fault hooks, the device's
facts. A room may import them; they import no room, and of ``train`` only each other."""
TRAIN_TOP_FILES = 15
"""The most ``.py`` files ``train``'s top may hold, ``__init__`` and ``__main__`` included: the rest is in rooms."""


def train_part(module: str) -> str | None:
    """Where in ``train`` a module is: its room, ``base`` (``TRAIN_BASE``), ``top`` (the rest of the top,
    ``trainer`` and ``worker`` among them), or None outside ``train`` and for the package itself."""
    parts = module.split(".")
    if parts[:2] != ["hpcsweep", "train"] or len(parts) < 3:
        return None
    if parts[2] in TRAIN_ROOMS:
        return parts[2]
    return "base" if parts[2] in TRAIN_BASE else "top"


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports inside ``train`` that run up: a room importing the top (``trainer``, ``worker``, ...) or a
    room not listed for it, a base module importing a room or the top."""
    bad = []
    for importer, imported in graph.items():
        source = train_part(importer)
        if source is None or source == "top":
            continue
        allowed = {"base"} if source == "base" else {source, "base", *TRAIN_ROOMS[source]}
        for target in sorted(imported):
            dest = train_part(target)
            if dest is not None and dest not in allowed:
                bad.append(f"{importer} ({source}) imports {target} ({dest})")
    return bad


def room_rule(room: str) -> str:
    """What room ``room``'s docstring must say it may import of ``train``, generated from TRAIN_ROOMS."""
    rooms = [f"``{other}``" for other in TRAIN_ROOMS[room]]
    base = listed([f"``{name}``" for name in TRAIN_BASE])
    allowed = listed(["this room", *rooms, f"the base modules {base}"])
    never = "never ``trainer``, ``worker``, train's other top modules or any other room"
    return f"Of ``train``, imports only {allowed}; {never}"


def test_train_rooms_import_down():
    assert room_violations(import_graph()) == []


def test_the_room_check_catches_an_upward_import():
    graph = {
        "hpcsweep.train.data.batch": {"hpcsweep.train.trainer", "hpcsweep.train.distributed"},
        "hpcsweep.train.moe.load_balance": {"hpcsweep.train.data.batch", "hpcsweep.train.checkpoint.store"},
        "hpcsweep.train.distributed": {"hpcsweep.train.gpu_choices", "hpcsweep.train.observe.step_timer"},
        "hpcsweep.train.trainer": {"hpcsweep.train.moe.load_balance"},
    }
    assert room_violations(graph) == [
        "hpcsweep.train.data.batch (data) imports hpcsweep.train.trainer (top)",
        "hpcsweep.train.moe.load_balance (moe) imports hpcsweep.train.checkpoint.store (checkpoint)",
        "hpcsweep.train.distributed (base) imports hpcsweep.train.observe.step_timer (observe)",
    ]


def test_train_holds_only_its_rooms_and_a_short_top():
    rooms = sorted(p.parent.name for p in TRAIN.glob("*/__init__.py"))
    assert rooms == sorted(TRAIN_ROOMS)
    top = sorted(p.name for p in TRAIN.glob("*.py"))
    assert len(top) <= TRAIN_TOP_FILES, top
    assert {f"{name}.py" for name in TRAIN_BASE} <= set(top)


def test_each_room_docstring_states_its_purpose_and_import_rule():
    wrong = []
    for room in TRAIN_ROOMS:
        doc = ast.get_docstring(ast.parse((TRAIN / room / "__init__.py").read_text())) or ""
        if not doc.split("\n", 1)[0].strip():
            wrong.append(f"hpcsweep/train/{room}/__init__.py: its first line must say what the room holds")
        if room_rule(room) not in " ".join(doc.split()):
            wrong.append(f"hpcsweep/train/{room}/__init__.py must say: {room_rule(room)}.")
    assert wrong == [], "\n".join(wrong)


def test_the_preparation_imports_no_train():
    graph = import_graph()
    assert [(m, t) for m, targets in graph.items() if part_of(m) == "prepare"
            for t in targets if part_of(t) == "train"] == []
