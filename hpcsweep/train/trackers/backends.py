"""A trial's loggers, as ``logging.backends`` names them: TensorBoard, MLflow, W&B, on rank 0 only.

``build_loggers`` returns one ``Trackers`` logger that hands every scalar to each backend at the
same step. MLflow and W&B run on threads of their own (``hpcsweep.train.trackers.thread``): a step
only queues their calls, and the end of the trial waits for them ``FINISH_WAIT_S`` at most, all of them
together. A tracker that fails (server down, disk full, package broken, or still sending at that
deadline) never fails the trial: the failure is logged once as a warning, that tracker is left out
from then on, and metrics.json's ``trackers`` says which failed and why. TensorBoard is not guarded,
and writes on the trial's thread: the report reads its events, and a failure to write them is a
failure of the trial's own outputs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcsweep.config import LoggingConfig
from hpcsweep.files import metrics_file
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.train.trackers import tracked_run
from hpcsweep.train.trackers.metrics import Logger, TensorBoardLogger, logging_rank
from hpcsweep.train.trackers.thread import TrackerThread

log = logging.getLogger(__name__)

FINISH_WAIT_S = 30.0
"""How long the end of a trial waits, at most, for its trackers' last sends and ends of run, all of them
together; a tracker still busy then is reported failed and left behind (its thread is a daemon)."""


class Trackers(Logger):
    """Every backend of a trial; the trackers (not TensorBoard) are guarded, each on its own thread.

    ``trackers``: how to start each, on its thread; ``on_this_thread`` names those that start here
    (W&B's ``wandb.init``) before their calls move to the thread."""

    def __init__(self, trial_dir: Path, local: Logger | None, trackers: Mapping[str, Callable[[], Logger]],
                 on_this_thread: frozenset[str] = frozenset()) -> None:
        self.trial_dir, self.local = trial_dir, local
        self.active: dict[str, TrackerThread] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.unsaved: set[str] = set()
        self.deadline: float | None = None
        for name, start in trackers.items():
            if name in on_this_thread:
                tracker = self._guarded(name, start)
                if tracker is None:
                    continue
                start = lambda made=tracker: made  # noqa: E731 - already started
            self.active[name] = TrackerThread(name, start)
            self.unsaved.add(name)
        self._save_records()

    def _guarded(self, name: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - a tracker must never fail the trial
            self._failed(name, err)
            return None

    def _failed(self, name: str, err: BaseException) -> None:
        self.active.pop(name, None)
        log.warning("tracker %s failed, training goes on without it: %s: %s", name, type(err).__name__, err)
        self.records[name] = {**self.records.get(name, {}), "status": "failed", "error": f"{type(err).__name__}: {err}"}
        self._save_records()

    def _check(self) -> None:
        """Report the trackers whose thread failed; record those that have started since the last look."""
        for name, tracker in list(self.active.items()):
            if tracker.error is not None:
                self._failed(name, tracker.error)
        if any(self.active[name].started for name in self.unsaved if name in self.active):
            self._save_records()

    def _save_records(self) -> None:
        for name, tracker in self.active.items():
            if tracker.started:
                self.unsaved.discard(name)
            self.records[name] = {**self.records.get(name, {}), **tracker.report_fields(), "status": "ok"}
        if self.records:
            runs = tracked_run.read_runs(self.trial_dir)
            runs.update(self.records)
            tracked_run.write_runs(self.trial_dir, runs)

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        if self.local is not None:
            self.local.log(metrics, step)
        self._check()
        for tracker in self.active.values():
            tracker.log(metrics, step)

    def _settle(self) -> None:
        """Wait for every tracker's queued calls until the trial's one deadline (``FINISH_WAIT_S`` from the
        first wait); a tracker still busy then counts as failed."""
        if self.deadline is None:
            self.deadline = time.monotonic() + FINISH_WAIT_S
        for name, tracker in list(self.active.items()):
            if not tracker.settle(self.deadline):
                self._failed(name, TimeoutError(f"its sends had not ended {FINISH_WAIT_S:g} s after the trial's end "
                                                "(hpcsweep.train.trackers.backends.FINISH_WAIT_S)"))
        self._check()

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        for tracker in self.active.values():
            tracker.finish(status, summary)
        self._settle()
        self._save_records()

    def report_fields(self) -> dict[str, Any]:
        return {"trackers": {name: dict(record) for name, record in self.records.items()}} if self.records else {}

    def close(self) -> None:
        try:
            for tracker in self.active.values():
                tracker.close()
            self._settle()
            self.active.clear()
        finally:
            if self.local is not None:
                self.local.close()


def build_loggers(
    cfg: LoggingConfig, *, rank: int, world_size: int, tb_dir: Path, trial_dir: Path, nodes: list[str],
    env: Mapping[str, str] | None = None,
) -> Logger:
    """The logging rank's loggers for ``logging.backends``; a no-op logger on every other rank.

    Call before this attempt first writes metrics.json: the status the last attempt left there
    decides whether each tracker continues the trial's run or starts a new one
    (``tracked_run.choose_run``).
    """
    if rank != logging_rank(world_size):
        return Logger()
    env = os.environ if env is None else env
    previous = metrics_file.read_metrics(TrialFiles(trial_dir).metrics)
    previous_status = previous.get("status") if previous else None
    local = TensorBoardLogger(tb_dir) if "tensorboard" in cfg.backends else None
    runs = tracked_run.read_runs(trial_dir)

    def identity() -> tracked_run.RunIdentity:
        return tracked_run.run_identity(trial_dir, env, nodes)

    def choice(name: str) -> tracked_run.RunChoice:
        return tracked_run.choose_run(runs.get(name), previous_status)

    starts: dict[str, Callable[[], Logger]] = {}
    if "mlflow" in cfg.backends:
        from hpcsweep.train.trackers.mlflow_logger import MlflowLogger

        starts["mlflow"] = lambda: MlflowLogger(cfg.mlflow, trial_dir, identity(), choice("mlflow"))
    if "wandb" in cfg.backends:
        from hpcsweep.train.trackers.wandb_logger import WandbLogger

        starts["wandb"] = lambda: WandbLogger(cfg.wandb, trial_dir, identity(), choice("wandb"), env)
    # wandb.init stays on the trial's thread: wandb sets up its service process from there.
    return Trackers(trial_dir, local, starts, on_this_thread=frozenset({"wandb"}))
