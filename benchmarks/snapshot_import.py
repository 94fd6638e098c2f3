"""Import time of hpcsweep from a code snapshot's archive against loose files, side by side.

    python benchmarks/snapshot_import.py [--repeats 9] [--modules hpcsweep.train.worker ...]

Takes a real snapshot (``hpcsweep.sweep.snapshot.take_snapshot``) and lays out the same files three
ways: loose, with a warm ``__pycache__`` (what the snapshot was before the archive); the archive as
the snapshot writes it (sources only, each process compiles what it imports); and the archive with
checked hash-based ``.pyc`` beside each source (what zipimport would load instead of compiling).
Each run is a fresh interpreter that imports the third-party modules first, then times the import
of ``--modules`` (hpcsweep's own modules only), alternating the three layouts so that load from other
work hits them alike; prints the median CPU time of each and the archive sizes.
"""

from __future__ import annotations

import _imp
import argparse
import importlib._bootstrap_external as bootstrap_external
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What a training worker imports, and what a node's task process imports (the app, the runner, the launchers).
WORKER = ["hpcsweep.train.worker"]
TASK = ["hpcsweep.app", "hpcsweep.trial.runner", "hydra_plugins.hpcsweep_plugins.launchers",
        "hydra_plugins.hpcsweep_plugins.search_sweeper"]
TIMED = """
import importlib, sys, time
for name in {third!r}:
    try:
        importlib.import_module(name)
    except Exception:
        pass
start = time.process_time()
for name in {modules!r}:
    importlib.import_module(name)
assert sys.modules["hpcsweep"].__file__.startswith({where!r}), sys.modules["hpcsweep"].__file__
print(time.process_time() - start)
"""


def python_env(path: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(path),
            "PYTHONSAFEPATH": "1"}


def third_party(modules: list[str], path: Path) -> list[str]:
    """The modules other than hpcsweep's that importing ``modules`` loads, in a fresh interpreter."""
    code = (f"import importlib, json, sys\nfor n in {modules!r}: importlib.import_module(n)\n"
            "print(json.dumps([m for m in sys.modules if not m.startswith(('hpcsweep', 'hydra_plugins.hpcsweep'))]))")
    out = subprocess.run([sys.executable, "-c", code], env=python_env(path), capture_output=True, text=True,
                         check=True, cwd=path.parent, timeout=600)
    return json.loads(out.stdout.splitlines()[-1])


def with_bytecode(archive: Path, target: Path) -> None:
    """``archive`` with a checked hash-based ``.pyc`` beside each source, compiled as zipimport would."""
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(target, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            out.writestr(info, data)
            if info.filename.endswith(".py"):
                code = compile(data, f"{target}/{info.filename}", "exec", dont_inherit=True)
                pyc = bootstrap_external._code_to_hash_pyc(
                    code, _imp.source_hash(bootstrap_external._RAW_MAGIC_NUMBER, data), checked=True)
                compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
                compiled.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(compiled, bytes(pyc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--modules", nargs="+", help="modules to time (default: a worker's, then a task's)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from hpcsweep.files.code_snapshot import ARCHIVE_FILE
    from hpcsweep.sweep.snapshot import take_snapshot

    work = Path(tempfile.mkdtemp(prefix="snapshot-import-"))
    (work / "project").mkdir()
    (work / "project" / "train.py").write_text("X = 1\n")
    record = take_snapshot(work / "sweep", work / "project")
    archive = Path(record.path) / ARCHIVE_FILE
    with zipfile.ZipFile(archive) as opened:
        opened.extractall(work / "loose")
    with_bytecode(archive, work / "bytecode.zip")
    layouts = {"loose (warm __pycache__)": work / "loose", "archive": archive,
               "archive with .pyc": work / "bytecode.zip"}
    print(f"snapshot: {record.files} files, {record.bytes} bytes of sources; archive {archive.stat().st_size} "
          f"bytes, with .pyc {(work / 'bytecode.zip').stat().st_size} bytes")
    for modules in ([args.modules] if args.modules else [WORKER, TASK]):
        third = third_party(modules, work / "loose")
        times: dict[str, list[float]] = {name: [] for name in layouts}
        for repeat in range(args.repeats + 1):  # the first round warms __pycache__ and the page cache
            for name, path in layouts.items():
                code = TIMED.format(third=third, modules=modules, where=str(path))
                out = subprocess.run([sys.executable, "-c", code], env=python_env(path), capture_output=True,
                                     text=True, check=True, cwd=work, timeout=600)
                if repeat:
                    times[name].append(float(out.stdout.split()[-1]))
        print(f"import {' '.join(modules)} (CPU ms, median of {args.repeats}):")
        for name, values in times.items():
            print(f"  {name:26s} {statistics.median(values) * 1000:6.0f}  (min {min(values) * 1000:.0f}, "
                  f"max {max(values) * 1000:.0f})")


if __name__ == "__main__":
    main()
