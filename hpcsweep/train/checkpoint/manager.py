"""Checkpoints: sharded, written in the background, renamed into place whole, kept as ``newest + top-k``.

A checkpoint is a directory ``checkpoints/stepNNNNNNNN-valLOSS.pt/`` when the trial evaluated at that
step (LOSS is that step's validation loss), else ``checkpoints/stepNNNNNNNN.pt/``:

- ``model/``: the weights that train, a DCP checkpoint (``hpcsweep.train.checkpoint.store``): every
  rank writes its share, each rank reads what it needs. Under LoRA only the adapters: a frozen base
  is never saved (``hpcsweep.train.checkpoint.trained_state``).
- ``resume/``: what only resuming needs, a DCP checkpoint too: the optimizer state and every
  rank's RNG state (each rank writes and reads its own), and with a stateful gradient
  communication hook (PowerSGD, local SGD: ``hpcsweep.train.grad_comm``) each rank's state of it.
- ``trainer.pt``: a small plain file (rank 0): step (which is also the sampler's position, see
  ``hpcsweep.train.data.corpora``), status, validation loss, scheduler, scaler and early-stopping state, and
  ``base_model``, the identity of the model the weights were trained from.

A save is staged to CPU memory on every rank, then written by a background thread into
``.tmp-NAME/``, which rank 0 renames to ``NAME`` once every file is durable: a directory with a
checkpoint's name is complete, and ``.tmp-*`` is what a killed save left, removed at start-up.
Only the newest checkpoint keeps ``resume/``; the ``keep_top_k`` best by validation loss keep
their weights. Trial dirs from before this format hold one ``.pt`` file per checkpoint; they
still resume (``load_checkpoint_file``). Every file loads with ``torch.load(weights_only=True)``,
DCP's index with an unpickler that allows DCP's metadata classes only.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.train import fault
from hpcsweep.train.checkpoint.store import CheckpointStore, DcpStore, check_complete
from hpcsweep.train.distributed import WorldInfo, broadcast_object
from hpcsweep.train.checkpoint.rng_state import rng_state, set_rng_state
from hpcsweep.train.checkpoint.trained_state import load_trained_state_dict, trained_state_dict

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "step", "status")
"""What a checkpoint file of the old one-file format must hold."""
DONE_STATUSES = ("completed", "stopped_early", "pruned")
"""The statuses of a trial that has ended for good: running its trial dir again trains nothing."""
TRAINER_FILE, WEIGHTS_DIR, RESUME_DIR = "trainer.pt", "model", "resume"
TEMP_PREFIX = ".tmp-"
# Names from before ``stepNNNNNNNN.pt`` (``-valinf``, or a loss of an earlier step) still parse: they resume.
_NAME = re.compile(r"^step(\d{8})(?:-val([0-9.e+-]+|inf|nan))?\.pt$")
_OLD_TEMP = re.compile(r"^\.step\d{8}-val.*\.pt\.tmp\d+$")
"""The temp file of a one-file save (old format), left behind when the save was killed."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, corrupt, unsafe or incomplete."""


def checkpoint_name(step: int, val_loss: float | None) -> str:
    """The name of a checkpoint; it carries the val loss of ``step`` (None: not evaluated at that step),
    so top-k needs no file reads."""
    if val_loss is None:
        return f"step{step:08d}.pt"
    return f"step{step:08d}-val{val_loss:.6f}.pt" if math.isfinite(val_loss) else f"step{step:08d}-val{val_loss}.pt"


def parse_name(name: str) -> tuple[int, float] | None:
    """``(step, val_loss)`` of a checkpoint name (``inf`` when it has none), or None for any other file."""
    match = _NAME.match(name)
    if not match:
        return None
    return int(match.group(1)), math.inf if match.group(2) is None else float(match.group(2))


@dataclasses.dataclass(frozen=True)
class Retention:
    """What pruning keeps: ``full`` checkpoints whole, ``weights_only`` without ``resume/``."""

    full: frozenset[str]
    weights_only: frozenset[str]


def plan_retention(names: list[str], keep_top_k: int) -> Retention:
    """The newest checkpoint whole (resuming needs it), the ``keep_top_k`` best by val loss as weights."""
    parsed = {n: parse_name(n) for n in names}
    ckpts = [n for n, p in parsed.items() if p is not None]
    if not ckpts:
        return Retention(frozenset(), frozenset())
    newest = max(ckpts, key=lambda n: parsed[n][0])
    best = sorted(ckpts, key=lambda n: (parsed[n][1], -parsed[n][0]))[:keep_top_k]
    return Retention(frozenset({newest}), frozenset(best) - {newest})


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    fsync_dir(path.parent)


def load_plain_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` and ``mmap=True``, or ``CheckpointError`` saying why not."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for bad files
        raise CheckpointError(f"{path}: {type(err).__name__}: {str(err).splitlines()[0]}") from err


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """Load one checkpoint file of the old one-file format, or raise ``CheckpointError``."""
    state = load_plain_file(path)
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path}: missing keys {missing}")
    return state


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint found on disk: its path, whether it can be resumed from, and its plain state."""

    path: Path
    full: bool
    """Holds what resuming needs (``resume/``, or an old-format file)."""
    trainer: dict[str, Any]
    """``trainer.pt``, or the whole old-format file."""

    @property
    def status(self) -> str:
        return self.trainer["status"]


def inspect_checkpoint(path: Path) -> CheckpointInfo:
    """Read and check one checkpoint, or raise ``CheckpointError`` saying why it is unusable."""
    if path.is_file():
        return CheckpointInfo(path, True, load_checkpoint_file(path))
    problem = check_complete(path / WEIGHTS_DIR)
    if problem:
        raise CheckpointError(problem)
    trainer = load_plain_file(path / TRAINER_FILE)
    full = (path / RESUME_DIR).is_dir()
    if full and (problem := check_complete(path / RESUME_DIR)):
        raise CheckpointError(problem)
    return CheckpointInfo(path, full, trainer)


def checkpoint_paths(directory: Path) -> list[Path]:
    """Every checkpoint in ``directory`` (directory, or file of the old format), the newest step first."""
    if not directory.is_dir():
        return []
    found = [(parsed[0], p) for p in directory.iterdir() if (parsed := parse_name(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def remove_stale_temp(directory: Path) -> list[str]:
    """Remove what killed saves left in ``directory`` (``.tmp-*``, old ``.NAME.tmpPID``); their names."""
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX) or _OLD_TEMP.match(p.name)]
    stale += [p for d in directory.iterdir() if parse_name(d.name) and d.is_dir() for p in d.glob(f"{TEMP_PREFIX}*")]
    for path in stale:
        _remove(path)
    return sorted(str(p.relative_to(directory)) for p in stale)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@dataclasses.dataclass
class _PendingSave:
    future: Future
    step: int
    started: float
    size_of: Path | None
    done_at: float | None = None


class CheckpointManager:
    """Saves, prunes and finds the checkpoints of one trial under ``directory``.

    Every rank calls ``save``, ``wait``, ``resume`` and ``close`` (they are collectives); rank 0
    alone renames, prunes and removes stale temp files. The trial dir is on a shared file system,
    as it must be for requeued trials to resume on other nodes.
    """

    def __init__(
        self, directory: Path, *, keep_top_k: int, world: WorldInfo, store: CheckpointStore | None = None,
        base_model: dict[str, Any] | None = None,
    ):
        self.directory, self.keep_top_k, self.world = directory, keep_top_k, world
        self.base_model = dict(base_model or {})
        """The base model's identity (``hpcsweep.train.checkpoint.trained_state.base_model_identity``), in
        ``trainer.pt``."""
        self.is_coordinator = world.rank == 0
        if self.is_coordinator:
            directory.mkdir(parents=True, exist_ok=True)
            # Before any rank can start a save: the first one follows resume()'s broadcast.
            for name in remove_stale_temp(directory):
                log.warning("removed %s, left by a save that did not finish", directory / name)
        self.store = store or DcpStore(
            world.world_size, pin_memory=world.device.type == "cuda",
            pause=fault.save_pause(os.environ, directory.parent, world.rank),
        )
        self._pending: _PendingSave | None = None
        self._closed = False
        self.first_save: tuple[float, int] | None = None
        """``(seconds until durable, bytes)`` of this run's first save, once it is known."""

    # ----- saving ------------------------------------------------------------------------------

    def save(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict[str, Any],
        step: int,
        val_loss: float | None,
        wait: bool,
        comm_state: bytes | None = None,
    ) -> None:
        """Save the checkpoint of ``step`` in the background, or until it is durable with ``wait``.

        ``trainer_state`` (rank 0's counts) must hold ``status``; it becomes ``trainer.pt``.
        ``comm_state`` is this rank's gradient-communication state (``GradComm.state_bytes``).
        """
        self.wait()
        started = time.monotonic()
        name = checkpoint_name(step, val_loss)
        temp = self.directory / f"{TEMP_PREFIX}{name}"
        staged = self.store.stage({
            "model": trained_state_dict(model),
            "optimizer": get_optimizer_state_dict(model, optimizer),
            "rng": {f"rank{self.world.rank}": rng_state(self.world.device)},
            **({} if comm_state is None else {"comm": {f"rank{self.world.rank}": comm_state}}),
        })
        plain = {**trainer_state, "step": step, "val_loss": val_loss, "world_size": self.world.world_size,
                 "base_model": self.base_model}
        parts = {
            temp / WEIGHTS_DIR: {"model": staged["model"]},
            temp / RESUME_DIR: {k: staged[k] for k in ("optimizer", "rng", "comm") if k in staged},
        }
        if self.is_coordinator:
            future = self.store.write(parts, lambda: self._put_in_place(temp, name, plain), step=step)
        else:
            future = self.store.write(parts, lambda: None, step=step)
        pending = _PendingSave(future, step, started, self.directory / name if self.is_coordinator else None)
        future.add_done_callback(lambda _: setattr(pending, "done_at", time.monotonic()))
        self._pending = pending
        if wait:
            self.wait()

    def poll(self) -> None:
        """Finish off a save that has completed in the background (raising its error); never blocks."""
        if self._pending is not None and self._pending.future.done():
            self.wait()

    def wait(self) -> None:
        """Block until the save under way (if any) is durable and in place; raise its error."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.future.result()
        if self.first_save is None:
            size = sum(p.stat().st_size for p in pending.size_of.rglob("*") if p.is_file()) if pending.size_of else 0
            self.first_save = ((pending.done_at or time.monotonic()) - pending.started, size)
        log.info("checkpoint of step %d durable", pending.step)

    def _put_in_place(self, temp: Path, name: str, plain: dict[str, Any]) -> None:
        atomic_torch_save(plain, temp / TRAINER_FILE)
        for part in (WEIGHTS_DIR, RESUME_DIR):
            fsync_dir(temp / part)
        final = self.directory / name
        if final.exists():  # saved at this step before (a rerun): swap, never leaving neither
            aside = self.directory / f"{TEMP_PREFIX}replaced-{name}"
            os.replace(final, aside)
            os.replace(temp, final)
            _remove(aside)
        else:
            os.replace(temp, final)
        fsync_dir(self.directory)
        self._prune()
        log.info("saved checkpoint %s", name)

    def _prune(self) -> None:
        names = [p.name for p in checkpoint_paths(self.directory)]
        keep = plan_retention(names, self.keep_top_k)
        for name in names:
            path = self.directory / name
            if name in keep.full:
                continue
            if name in keep.weights_only:
                if (path / RESUME_DIR).is_dir():
                    # Renamed first: a prune cut short leaves a weights-only checkpoint, never half a resume/.
                    aside = path / f"{TEMP_PREFIX}{RESUME_DIR}"
                    os.replace(path / RESUME_DIR, aside)
                    _remove(aside)
                continue
            aside = self.directory / f"{TEMP_PREFIX}pruned-{name}"
            os.replace(path, aside)
            _remove(aside)

    # ----- finding and loading -----------------------------------------------------------------

    def newest_valid(self) -> CheckpointInfo | None:
        """The newest checkpoint that resuming can use, skipping (with a warning) any that it cannot.

        Raises ``CheckpointError`` when checkpoints exist but none can be resumed from: starting
        over would silently throw away the training they hold.
        """
        problems = []
        for path in checkpoint_paths(self.directory):
            try:
                info = inspect_checkpoint(path)
            except CheckpointError as err:
                log.warning("skipping unusable checkpoint: %s", err)
                problems.append(str(err))
                continue
            if info.full:
                return info
        if problems:
            raise CheckpointError(
                f"no checkpoint in {self.directory} can be resumed from ({'; '.join(problems)}); "
                "move the directory away to train this trial from the start"
            )
        return None

    def resume(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, comm_state: bool = False
    ) -> dict[str, Any] | None:
        """Load the newest usable checkpoint into ``model``, ``optimizer`` and this rank's RNGs.

        Rank 0 chooses; every rank then reads only its part. Returns the plain trainer state
        (``trainer.pt``, plus ``path``), or None when there is nothing to resume. With
        ``comm_state`` (a trial that saves one), it holds this rank's saved ``comm_state`` too
        (None when the checkpoint has another world size).
        """
        chosen: tuple[str | None, str | None] = (None, None)
        if self.is_coordinator:
            try:
                found = self.newest_valid()
                chosen = (str(found.path) if found else None, None)
            except CheckpointError as err:
                chosen = (None, str(err))
        path_text, error = broadcast_object(self.world, chosen)
        if error:
            raise CheckpointError(error)
        if path_text is None:
            return None
        path = Path(path_text)
        info = inspect_checkpoint(path)
        if path.is_file():
            return {**self._load_one_file(info.trainer, model, optimizer), "path": path}
        target = {"model": trained_state_dict(model)}
        self.store.read(path / WEIGHTS_DIR, target)
        load_trained_state_dict(model, target["model"])
        same_world = info.trainer["world_size"] == self.world.world_size
        resume: dict[str, Any] = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        if same_world:
            resume["rng"] = {f"rank{self.world.rank}": rng_state(self.world.device)}
        if same_world and comm_state:
            resume["comm"] = {f"rank{self.world.rank}": b""}  # a byte item: DCP replaces it with what was saved
        self.store.read(path / RESUME_DIR, resume)
        set_optimizer_state_dict(model, optimizer, resume["optimizer"])
        if same_world:
            set_rng_state(resume["rng"][f"rank{self.world.rank}"], self.world.device)
        comm = resume["comm"][f"rank{self.world.rank}"] if "comm" in resume else None
        return {**info.trainer, "path": path, "rng_restored": same_world, "comm_state": comm}

    def _load_one_file(self, state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        same_world = len(state["rng"]) == self.world.world_size
        if same_world:
            set_rng_state(state["rng"][self.world.rank], self.world.device)
        plain = {k: v for k, v in state.items() if k not in ("model", "optimizer", "rng")}
        return {**plain, "world_size": len(state["rng"]), "rng_restored": same_world}

    def close(self) -> None:
        """Wait for the save under way, then release the store (every rank; safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            self.store.close()


def trial_already_done(trial_dir: Path, metrics: dict[str, Any] | None) -> bool:
    """True when metrics.json says the trial ended and its final checkpoint says so too."""
    if not metrics or metrics.get("status") not in DONE_STATUSES:
        return False
    paths = checkpoint_paths(TrialFiles(trial_dir).checkpoints)
    if not paths:
        return False
    try:
        return inspect_checkpoint(paths[0]).status == metrics["status"]
    except CheckpointError:
        return False
