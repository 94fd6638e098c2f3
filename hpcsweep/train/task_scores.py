"""Task scores: lm-evaluation-harness on the trial's model as it trains, in memory.

``TaskScorer`` runs ``tasks.names`` through lm-eval's ``HFLM`` wrapped around the model the trainer
holds (no export, no second load), on the logging rank only; the other ranks wait for it in the
trainer's next collective. Task data come from the local files the task YAMLs name
(``HF_DATASETS_OFFLINE=1``, ``hpcsweep.model.offline``). A run never changes training: the model
goes back to train mode and every random generator lm-eval might touch (Python's, NumPy's, torch's)
is restored, so a trial with tasks trains the same bits as one without.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcsweep.config import TasksConfig

log = logging.getLogger(__name__)

SKIPPED_FIELDS = ("alias", "name", "sample_len", "sample_count")
"""Fields of an lm-eval result that are no score."""


def scores_from_results(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """``{NAME: {METRIC: value}}`` from lm-eval's ``results`` (pure).

    lm-eval names a score ``METRIC,FILTER`` (``acc,none``); the ``none`` filter is dropped
    (``acc``), another one joined with ``_`` (``exact_match_strict``). Standard errors and fields
    that are no number are left out.
    """
    scores: dict[str, dict[str, float]] = {}
    for name, fields in results.items():
        task: dict[str, float] = {}
        for key, value in fields.items():
            metric, _, filter_name = key.partition(",")
            if metric in SKIPPED_FIELDS or metric.endswith("_stderr"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            task[metric if filter_name in ("", "none") else f"{metric}_{filter_name}"] = float(value)
        scores[name] = task
    return scores


def tensorboard_scalars(scores: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``{"tasks/NAME/METRIC": value}``."""
    return {f"tasks/{name}/{metric}": value for name, task in scores.items() for metric, value in task.items()}


def is_due(step: int, every: int, max_steps: int) -> bool:
    """Whether the tasks run after optimizer step ``step``: every ``every`` steps (0: never before the end), and at the end."""
    return step == max_steps or (every > 0 and step % every == 0)


@contextlib.contextmanager
def training_state_kept(model: torch.nn.Module) -> Iterator[None]:
    """Run the body in eval mode, then restore train mode and every random generator's state."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices):
        model.eval()
        try:
            yield
        finally:
            model.train(was_training)
            random.setstate(python_state)
            np.random.set_state(numpy_state)


class TaskScorer:
    """Runs a trial's lm-eval tasks on its model; build it once, on the logging rank."""

    def __init__(self, cfg: TasksConfig, tokenizer_dir: str, *, trust_remote_code: bool = False) -> None:
        from lm_eval.tasks import TaskManager

        from hpcsweep.train.folder_tokenizer import load_folder_tokenizer

        self.cfg = cfg
        self.tokenizer = load_folder_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
        # Only the user's folder is indexed: lm-eval's hundreds of built-in tasks are never read.
        self.task_manager = TaskManager(include_path=str(Path(str(cfg.include_path)).expanduser()),
                                        include_defaults=False)

    def score(self, model: torch.nn.Module) -> dict[str, dict[str, float]]:
        """Every task's scores on ``model`` (unwrapped: no DDP), ``{NAME: {METRIC: value}}``."""
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM

        with training_state_kept(model), torch.no_grad():
            # A peft model evaluates through its base, which holds the adapters in place.
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            lm = HFLM(pretrained=base, tokenizer=self.tokenizer, batch_size=self.cfg.batch_size)
            results = simple_evaluate(
                model=lm, tasks=list(self.cfg.names), task_manager=self.task_manager, limit=self.cfg.limit,
                # lm-eval would reseed every generator; training's own states are kept instead.
                random_seed=None, numpy_random_seed=None, torch_random_seed=None,
                log_samples=False, verbosity="WARNING",
            )
        return scores_from_results(results["results"])


def build_task_scorer(
    cfg: TasksConfig, tokenizer_dir: str | None, is_writer: bool, *, trust_remote_code: bool,
) -> TaskScorer | None:
    """The scorer of a trial with tasks, on the logging rank; None elsewhere or without tasks. Its
    tokenizer loads with ``trust_remote_code`` (``model.trust_remote_code``)."""
    if not cfg.names or not is_writer:
        return None
    if tokenizer_dir is None:
        raise ValueError(f"tasks.names={cfg.names} is not allowed: task scores need a tokenizer (model.path or data.tokenizer)")
    return TaskScorer(cfg, tokenizer_dir, trust_remote_code=trust_remote_code)
