"""Checkpoints: one plain dict per file, written atomically, kept as ``newest + top-k``.

A checkpoint holds the model, optimizer, scheduler and scaler state, the step (which is also the
sampler's position, see ``hpcsweep.train.data``), early-stopping state, and every rank's RNG state. RNG
states are stored as tensors and ints so ``torch.load(weights_only=True)`` can read them: a file
that needs any other pickled object is refused.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "step", "status")
DONE_STATUSES = ("completed", "stopped_early")
"""The statuses of a trial that has ended for good: running its trial dir again trains nothing."""
_NAME = re.compile(r"^step(\d{8})-val([0-9.e+-]+|inf|nan)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used: truncated, corrupt, unsafe or incomplete."""


def checkpoint_name(step: int, val_loss: float | None) -> str:
    """The file name of a checkpoint; it carries the val loss so top-k needs no file reads."""
    val = math.inf if val_loss is None else val_loss
    return f"step{step:08d}-val{val:.6f}.pt" if math.isfinite(val) else f"step{step:08d}-val{val}.pt"


def parse_name(name: str) -> tuple[int, float] | None:
    """``(step, val_loss)`` of a checkpoint file name, or None for any other file."""
    match = _NAME.match(name)
    return (int(match.group(1)), float(match.group(2))) if match else None


def files_to_keep(names: list[str], keep_top_k: int) -> set[str]:
    """The newest checkpoint plus the ``keep_top_k`` with the lowest val loss."""
    parsed = {n: parse_name(n) for n in names}
    ckpts = [n for n, p in parsed.items() if p is not None]
    if not ckpts:
        return set()
    newest = max(ckpts, key=lambda n: parsed[n][0])
    by_val = sorted(ckpts, key=lambda n: (parsed[n][1], -parsed[n][0]))
    return {newest, *by_val[:keep_top_k]}


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states (torch CPU/CUDA, numpy, python) as tensors, ints and floats."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": {"version": py_version, "internal": list(py_internal), "gauss_next": py_gauss},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def atomic_torch_save(obj: Any, path: Path) -> None:
    """Write ``obj`` to a temp file, fsync it, rename it over ``path``, fsync the directory.

    A crash leaves either the old file or the new one, never half of one.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint_file(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load one checkpoint safely, or raise ``CheckpointError`` saying why it is unusable."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for bad files
        raise CheckpointError(f"{path}: {type(err).__name__}: {str(err).splitlines()[0]}") from err
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path}: missing keys {missing}")
    return state


class CheckpointManager:
    """Saves and finds the checkpoints of one trial under ``directory``.

    Only the rank given ``enable=True`` writes; every rank may read (the trial dir is on a
    shared file system, as it must be for requeued trials to resume on other nodes).
    """

    def __init__(self, directory: Path, *, keep_top_k: int, enable: bool) -> None:
        self.directory = directory
        self.keep_top_k = keep_top_k
        self.enable = enable
        if enable:
            directory.mkdir(parents=True, exist_ok=True)

    def paths_newest_first(self) -> list[Path]:
        """Every checkpoint file, the newest step first."""
        if not self.directory.is_dir():
            return []
        found = [(parse_name(p.name), p) for p in self.directory.iterdir()]
        return [p for parsed, p in sorted((x for x in found if x[0]), key=lambda x: -x[0][0])]

    def save(self, state: dict[str, Any], *, step: int, val_loss: float | None) -> Path | None:
        """Write ``state`` as the checkpoint of ``step``, then prune to newest + top-k."""
        if not self.enable:
            return None
        path = self.directory / checkpoint_name(step, val_loss)
        atomic_torch_save(state, path)
        names = [p.name for p in self.paths_newest_first()]
        keep = files_to_keep(names, self.keep_top_k) | {path.name}
        for name in names:
            if name not in keep:
                (self.directory / name).unlink(missing_ok=True)
        log.info("saved checkpoint %s", path.name)
        return path

    def newest_valid(self, map_location: str | torch.device = "cpu") -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads, skipping (with a warning) any that does not."""
        for path in self.paths_newest_first():
            try:
                return path, load_checkpoint_file(path, map_location)
            except CheckpointError as err:
                log.warning("skipping unusable checkpoint: %s", err)
        return None


def trial_already_done(trial_dir: Path, metrics: dict[str, Any] | None) -> bool:
    """True when metrics.json says the trial ended and its final checkpoint says so too."""
    if not metrics or metrics.get("status") not in DONE_STATUSES:
        return False
    found = CheckpointManager(trial_dir / "checkpoints", keep_top_k=0, enable=False).newest_valid()
    return found is not None and found[1]["status"] == metrics["status"]
