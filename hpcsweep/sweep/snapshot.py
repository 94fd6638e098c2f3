"""A copy of the code a sweep's trials import, taken once before the first ``sbatch``.

A trial may start hours after submission, and a requeued one days later; by then the working tree
has moved on. The snapshot, SWEEP_DIR/.code, holds hpcsweep's own packages (as imported here, their
configs included) and the launcher plugins in one zip archive, ``.code/hpcsweep.zip``
(``hpcsweep.sweep.snapshot_archive`` says why one file beats hundreds on a shared file system),
and the code of the user's working tree (the current directory, when it is a git checkout or holds
Python files) as loose files beside it. Every array task puts the archive and the folder first on
``PYTHONPATH``, so the first run and every requeue import the submitted code.

Of the working tree only code is copied (``is_code``): Python sources, YAML configs (a Hydra app's),
and the data files of Python packages (folders with an ``__init__.py``), never text or JSON Lines,
tokenizer or weight files; no model folder or export (``is_model_folder``), no ``multirun/`` or
``outputs/``, no top ``tests/``, ``benchmarks/`` or ``docs/`` (unless the swept app runs from one:
``NOT_IMPORTED_DIRS``); in a git checkout only the files git tracks or would track (not ignored). A snapshot
over ``MAX_SNAPSHOT_BYTES`` or ``MAX_SNAPSHOT_FILES`` is refused before anything is submitted.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.code_snapshot import ARCHIVE_FILE, SNAPSHOT_DIR, SNAPSHOT_FILE
from hpcsweep.sweep.snapshot_archive import write_archive
from hpcsweep.trial.install import this_install

log = logging.getLogger(__name__)

# A source file larger than this is data or a model, not code.
MAX_FILE_BYTES = 1 << 20
# Names (files or folders, at any depth) never copied: version control, environments, caches,
# Hydra's and Slurm's outputs, checkpoints and data.
EXCLUDED_NAMES = (
    ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "__pycache__", ".pytest_cache",
    ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints", "*.egg-info", "build", "dist", "node_modules",
    "multirun", "outputs", "wandb", "mlruns", "lightning_logs", SNAPSHOT_DIR, f"{SNAPSHOT_DIR}.tmp-*",
    "*.pyc", "*.so", "*.pt", "*.pth", "*.ckpt", "*.safetensors", "*.bin", "*.npy", "*.npz", "*.h5",
    "*.pkl", "*.parquet", "*.arrow", "*.tfevents.*", "events.out.*", "*.log", "*.out", "*.err",
)
# A snapshot larger than this is not code: refused, naming its largest files.
MAX_SNAPSHOT_BYTES = 32 << 20
MAX_SNAPSHOT_FILES = 10_000
# Configs a working tree's code reads wherever they are (Hydra's config_path).
CONFIG_SUFFIXES = (".yaml", ".yml")
# Never code, even inside a Python package: corpora, tokenizers, weights, archives.
DATA_SUFFIXES = (
    ".txt", ".jsonl", ".csv", ".tsv", ".parquet", ".arrow", ".bin", ".safetensors", ".pt", ".pth", ".ckpt",
    ".npy", ".npz", ".h5", ".pkl", ".model", ".tiktoken", ".gz", ".zip", ".tar", ".zst", ".log",
)
TOKENIZER_NAMES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "chat_template.jinja",
)
# A folder holding any of these is a model folder or an export: data, not code. None needs a config.json
# beside it: a LoRA export is adapter_config.json, adapter_model.safetensors, README.md and the base's
# tokenizer and remote code (``hpcsweep.export.writer``), and has none.
MODEL_MARKERS = ("adapter_config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
                 "tokenizer.json", "tokenizer_config.json", "tokenizer.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# The packages whose imports must come from the snapshot, and where each goes inside it (inside the
# archive: ``in_archive``).
PACKAGES = {"hpcsweep": "hpcsweep", "hpcsweep.configs": "hpcsweep/configs",
            "hydra_plugins.hpcsweep_plugins": "hydra_plugins/hpcsweep_plugins"}
GIT_TIMEOUT_S = 30
# A working tree's top folders that a package never imports at run time: its tests, benchmarks and docs
# (hpcsweep's own tests/ alone is 456 files, 2.5 MB). One stays in when the swept app runs from it.
NOT_IMPORTED_DIRS = ("tests", "test", "benchmarks", "docs")


@dataclass(frozen=True)
class SourceTree:
    """A folder to copy, to ``dest`` inside the snapshot, leaving out ``skip`` (paths relative to ``root``)."""

    root: Path
    dest: str
    skip: frozenset[str] = frozenset()
    code_only: bool = False
    """The user's working tree: only what ``is_code`` keeps, and no model folder."""
    listed: frozenset[str] | None = None
    """In a git checkout, the files git tracks or would track (relative to ``root``); None: every file."""


@dataclass(frozen=True)
class SnapshotRecord:
    """What ``SNAPSHOT.json`` holds: where the code came from and how to recognise it."""

    path: str
    source: str | None
    commit: str | None
    diff_sha256: str | None
    files_sha256: str
    """A hash over every copied file's path and content, loose or archived, so that two snapshots of
    the same code hash alike."""
    files: int
    """How many files were copied (into the archive or loose)."""
    bytes: int
    """Their size before compression."""
    stored_bytes: int | None = None
    """What the snapshot takes on disk: the archive plus the loose files, ``SNAPSHOT.json`` aside
    (null in a snapshot taken before hpcsweep archived its packages)."""
    hpcsweep: dict[str, Any] | None = None
    """The hpcsweep copied: its version and the commit of its install (``hpcsweep.trial.install``),
    which each trial's ``environment.json`` repeats; null in a snapshot taken before it was recorded."""

    def as_dict(self) -> dict[str, Any]:
        """The record as written to ``SNAPSHOT.json``."""
        return dict(self.__dict__)


def in_archive(dest: str) -> bool:
    """Whether the snapshot's file ``dest`` (its path inside the snapshot) is one of hpcsweep's own,
    stored in the archive; the working tree's files stay loose."""
    return any(dest.startswith(place + "/") for place in PACKAGES.values())


def excluded(name: str, patterns: Iterable[str] = EXCLUDED_NAMES) -> bool:
    """Whether a file or folder called ``name`` stays out of the snapshot."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def is_model_folder(names: Iterable[str]) -> bool:
    """Whether a folder holding files ``names`` is a model folder or an export (weights, a tokenizer or a
    peft adapter: ``MODEL_MARKERS``, ``WEIGHT_SUFFIXES``), whose files, remote code included, are data.

    A Python package (an ``__init__.py``) never is: its modules are what trials import, and a checkpoint
    or vocabulary kept beside them stays out as a file (``is_code``) without taking the package along.
    """
    names = set(names)
    if "__init__.py" in names:
        return False
    return any(name in MODEL_MARKERS or name.endswith(WEIGHT_SUFFIXES) for name in names)


def is_code(name: str, in_package: bool) -> bool:
    """Whether a working tree's file ``name`` is code: a Python source or a YAML config anywhere, and
    any other file of a Python package (``in_package``) that is not data (``DATA_SUFFIXES``, tokenizers)."""
    if name.endswith(".py") or name.endswith(CONFIG_SUFFIXES):
        return True
    return in_package and not name.endswith(DATA_SUFFIXES) and name not in TOKENIZER_NAMES


def choose_files(tree: SourceTree, max_bytes: int = MAX_FILE_BYTES,
                 patterns: Iterable[str] = EXCLUDED_NAMES) -> list[str]:
    """Paths (relative to ``tree.root``, sorted) of the regular files to copy from ``tree``.

    Symbolic links are left out: a link to a dataset would otherwise pull it in.
    """
    patterns = tuple(patterns)
    chosen = []
    for folder, dirs, files in os.walk(tree.root):
        rel_folder = Path(folder).relative_to(tree.root)
        if tree.code_only and rel_folder != Path(".") and is_model_folder(files):
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not excluded(d, patterns)
                   and (rel_folder / d).as_posix() not in tree.skip and not os.path.islink(Path(folder, d))]
        in_package = "__init__.py" in files
        for name in files:
            path = Path(folder, name)
            rel = (rel_folder / name).as_posix()
            if excluded(name, patterns) or rel in tree.skip or path.is_symlink():
                continue
            if tree.listed is not None and rel not in tree.listed:
                continue
            if tree.code_only and not is_code(name, in_package):
                continue
            if path.stat().st_size > max_bytes:
                log.info("code snapshot leaves out %s: larger than %d bytes", path, max_bytes)
                continue
            chosen.append(rel)
    return sorted(chosen)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def is_working_tree(folder: Path) -> bool:
    """A folder whose code trials may import: a git checkout, or one holding Python files."""
    return (folder / ".git").exists() or any(folder.glob("*.py"))


def git_listed(folder: Path) -> frozenset[str] | None:
    """The files under ``folder`` that git tracks or would track (untracked, not ignored), relative to
    ``folder``; None outside a git checkout."""
    listed = _git(folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is None:
        return None
    return frozenset(name for name in listed.decode().split("\0") if name)


def source_trees(cwd: Path, package_dirs: Mapping[str, Path | None], sweep_dir: Path,
                 listed: frozenset[str] | None = None, app_file: Path | None = None) -> list[SourceTree]:
    """The folders to copy: the working tree ``cwd`` (if it is one, its code only: ``listed`` by git
    when it is a checkout) first, then each package.

    The working tree leaves out the packages' places, so that a stale copy of hpcsweep in it
    cannot mix with the one imported here, the sweep dir, when it lies inside, and its
    ``NOT_IMPORTED_DIRS`` but the one holding ``app_file`` (the swept app's main module); a package
    inside another (an installed ``hpcsweep/configs``) is copied once, with its parent.
    """
    trees = []
    skip = {dest for name, dest in PACKAGES.items() if package_dirs.get(name) is not None}
    if is_working_tree(cwd):
        cwd = cwd.resolve()
        if sweep_dir.resolve().is_relative_to(cwd) and sweep_dir.resolve() != cwd:
            skip.add(sweep_dir.resolve().relative_to(cwd).as_posix())
        app = app_file.resolve() if app_file is not None else None
        skip.update(name for name in NOT_IMPORTED_DIRS
                    if (cwd / name).is_dir() and (app is None or not app.is_relative_to(cwd / name)))
        trees.append(SourceTree(cwd, "", frozenset(skip), code_only=True, listed=listed))
    # A package inside its parent's folder (an installed ``hpcsweep/configs``) comes with the
    # parent; one that lives elsewhere (an editable install maps ``configs/``) is copied on its own.
    separate = {
        name: folder for name, folder in package_dirs.items()
        if folder is not None and not any(
            other is not None and PACKAGES[name].startswith(PACKAGES[n] + "/") and folder.is_relative_to(other)
            for n, other in package_dirs.items()
        )
    }
    for name, folder in separate.items():
        dest = PACKAGES[name]
        nested = frozenset(PACKAGES[n][len(dest) + 1:] for n in separate if PACKAGES[n].startswith(dest + "/"))
        trees.append(SourceTree(folder, dest, nested))
    return trees


def _git(root: Path, *args: str) -> bytes | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_identity(folder: Path) -> tuple[str | None, str | None, str | None]:
    """The checkout holding ``folder``: its top, ``HEAD`` commit, and the SHA-256 of its changes.

    The changes are ``git diff HEAD`` plus every untracked, not ignored file (name and content),
    so two snapshots of the same commit with the same edits hash alike; untracked files the
    snapshot never copies (outputs, checkpoints: ``EXCLUDED_NAMES``) stay out. Nulls outside git.
    """
    top = _git(folder, "rev-parse", "--show-toplevel")
    commit = _git(folder, "rev-parse", "HEAD")
    if top is None or commit is None:
        return None, None, None
    root = Path(top.decode().strip())
    diff = _git(root, "diff", "HEAD", "--binary")
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z")
    if diff is None or untracked is None:
        return str(root), commit.decode().strip(), None
    digest = hashlib.sha256(diff)
    for name in sorted(n for n in untracked.decode().split("\0") if n):
        path = root / name
        if any(excluded(part) for part in Path(name).parts):
            continue
        if path.is_file() and not path.is_symlink():
            digest.update(b"\0" + name.encode() + b"\0" + path.read_bytes())
    return str(root), commit.decode().strip(), digest.hexdigest()


def chosen_files(sweep_dir: Path, cwd: Path) -> list[tuple[SourceTree, list[str]]]:
    """Each tree to copy and its files; ``ValueError`` when they are too many or too large to be code."""
    package_dirs = {name: _package_dir(name) for name in PACKAGES}
    listed = git_listed(cwd) if is_working_tree(cwd) else None
    app_file = getattr(sys.modules.get("__main__"), "__file__", None)
    trees = source_trees(cwd, package_dirs, sweep_dir, listed, Path(app_file) if app_file else None)
    chosen = [(tree, choose_files(tree)) for tree in trees]
    sizes = {tree.root / rel: (tree.root / rel).stat().st_size for tree, names in chosen for rel in names}
    refusal = size_refusal(sizes, cwd)
    if refusal:
        raise ValueError(refusal)
    return chosen


def size_refusal(sizes: Mapping[Path, int], cwd: Path,
                 max_bytes: int | None = None, max_files: int | None = None) -> str | None:
    """Why a snapshot of these files (path -> bytes) is refused, or None (limits: the module's by default)."""
    max_bytes = MAX_SNAPSHOT_BYTES if max_bytes is None else max_bytes
    max_files = MAX_SNAPSHOT_FILES if max_files is None else max_files
    total = sum(sizes.values())
    if total <= max_bytes and len(sizes) <= max_files:
        return None
    largest = sorted(sizes, key=lambda path: -sizes[path])[:3]
    return (f"the code snapshot (hydra.launcher.code_snapshot) of {cwd} would copy {len(sizes)} files, "
            f"{total / 2**20:.1f} MiB (at most {max_files} files, {max_bytes / 2**20:.0f} MiB); the largest: "
            + ", ".join(f"{path} ({sizes[path] / 2**20:.1f} MiB)" for path in largest)
            + "; only Python sources, YAML configs and package data are copied: move the rest out of the "
            "Python packages, or run from another folder, or set hydra.launcher.code_snapshot=false")


def _fill(chosen: Iterable[tuple[SourceTree, list[str]]], target: Path) -> tuple[int, int, str]:
    """Copy the chosen files into ``target``: hpcsweep's packages into the archive, the working tree's
    as loose files; return the file count, the bytes, and a hash of the copy (paths and contents)."""
    contents = {}
    archived = {}
    for tree, names in chosen:
        for rel in names:
            dest = Path(tree.dest, rel).as_posix()
            if in_archive(dest):
                archived[dest] = contents[dest] = (tree.root / rel).read_bytes()
                continue
            (target / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree.root / rel, target / dest)
            contents[dest] = (target / dest).read_bytes()
    if archived:
        write_archive(target / ARCHIVE_FILE, archived)
    digest = hashlib.sha256()
    for dest in sorted(contents):
        digest.update(dest.encode() + b"\0" + hashlib.sha256(contents[dest]).digest())
    return len(contents), sum(map(len, contents.values())), digest.hexdigest()


def stored_size(code_dir: Path) -> int:
    """The bytes of every file under ``code_dir`` but its ``SNAPSHOT.json``."""
    return sum(path.stat().st_size for path in code_dir.rglob("*")
               if path.is_file() and path != code_dir / SNAPSHOT_FILE)


def take_snapshot(sweep_dir: Path, cwd: Path) -> SnapshotRecord:
    """Copy the code trials import to ``sweep_dir/.code``, atomically, and describe it.

    The copy is built in a temporary folder beside it and renamed into place, so a task never
    sees half a snapshot. ``ValueError`` (before anything is copied) when the files are too many or
    too large to be code (``chosen_files``). An existing snapshot is kept: later batches of the same sweep, and its
    requeued tasks, run the code the first batch was submitted with.
    """
    code_dir = sweep_dir / SNAPSHOT_DIR
    if (code_dir / SNAPSHOT_FILE).is_file():
        log.info("code snapshot: keeping %s", code_dir)
        return SnapshotRecord(**_read_record(code_dir))
    chosen = chosen_files(sweep_dir, cwd)
    tmp = sweep_dir / f"{SNAPSHOT_DIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files, size, files_sha256 = _fill(chosen, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    git_root = cwd if is_working_tree(cwd) else _package_dir("hpcsweep")
    source, commit, diff_sha256 = git_identity(git_root) if git_root else (None, None, None)
    record = SnapshotRecord(path=str(code_dir), source=source, commit=commit, diff_sha256=diff_sha256,
                            files_sha256=files_sha256, files=files, bytes=size, stored_bytes=stored_size(tmp),
                            hpcsweep=this_install())
    atomic_write_json(tmp / SNAPSHOT_FILE, record.as_dict())
    os.rename(tmp, code_dir)
    log.info("code snapshot: %d files (%d kB, %d kB stored: hpcsweep's packages in %s) in %s", files,
             size // 1024, record.stored_bytes // 1024, ARCHIVE_FILE, code_dir)
    return record


def _read_record(code_dir: Path) -> dict[str, Any]:
    return json.loads((code_dir / SNAPSHOT_FILE).read_text())


def snapshot_setup_lines(code_dir: Path) -> list[str]:
    """Batch-script lines that make every process of the task import from ``code_dir``: hpcsweep from
    its archive, the working tree's code from the folder.

    The archive comes first, so that hpcsweep is the snapshot's whatever the working tree holds; the
    folder stays on the path for the working tree (and for the hpcsweep of a snapshot taken before
    the archive, which a later batch of its sweep keeps). ``PYTHONSAFEPATH`` keeps ``python -m`` from
    putting the current directory first on ``sys.path``: a job started from the user's checkout
    would import the live tree again. torchrun's workers inherit both variables.
    """
    archive = shlex.quote(str(code_dir / ARCHIVE_FILE))
    return [
        f"export PYTHONPATH={archive}:{shlex.quote(str(code_dir))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONSAFEPATH=1",
    ]


def submission_snapshot(params: Mapping[str, Any], sweep_dir: Path, cwd: Path) -> Path | None:
    """The snapshot every job of a submission imports (the token preparation and the trials): taken
    now, or kept from an earlier batch of the sweep; None with ``code_snapshot`` false."""
    if not params.get("code_snapshot", True):
        return None
    return Path(take_snapshot(sweep_dir, cwd).path)


def with_snapshot(params: Mapping[str, Any], code_dir: Path | None) -> dict[str, Any]:
    """The launcher settings to submit with: ``code_snapshot`` taken out, the setup lines added.

    They come after the user's own setup lines, so that activating an environment there cannot
    undo them.
    """
    out = {key: value for key, value in params.items() if key != "code_snapshot"}
    if code_dir is not None:
        out["setup"] = [*(params.get("setup") or []), *snapshot_setup_lines(code_dir)]
    return out
