"""Task scores: lm-evaluation-harness on the trial's model as it trains, in memory.

``TaskScorer`` runs ``tasks.names`` through lm-eval's ``HFLM`` wrapped around the model the trainer
holds (no export, no second load), on every rank of the trial: each rank scores its share of each
task's examples (lm-eval's own split: rank r takes examples r, r + W, ...), lm-eval gathers the
per-example metrics on rank 0, and the trainer sends rank 0's scores to all. Scoring time falls with
the ranks (``benchmarks/task_scoring.py``). The tasks are loaded once per trial and evaluated with
lm-eval's ``evaluate``: its ``simple_evaluate`` also records the environment, by running ``pip list``
and other commands (0.6 s of the 0.7 s a 16-example task took). Every model call heartbeats the hang
watchdog (``heartbeat``), so a long scoring is no hang.

Task data come from the local files the task YAMLs name (``HF_DATASETS_OFFLINE=1``,
``hpcsweep.model.offline``). A run never changes training: the model goes back to train mode and
every random generator lm-eval might touch (Python's, NumPy's, torch's) is restored, so a trial with
tasks trains the same bits as one without.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
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


FEWSHOT_SEED = 1234
"""The seed of each task's few-shot sampler, set before every scoring (``simple_evaluate``'s default)."""
HEARTBEAT_EVERY_S = 5.0
"""How often, at most, a scoring rank heartbeats the hang watchdog (at a model call)."""


class Heartbeat:
    """Calls ``beat`` at most every ``every_s`` seconds (and at the first call)."""

    def __init__(self, beat: Callable[[], None] | None, every_s: float = HEARTBEAT_EVERY_S) -> None:
        self.beat, self.every_s, self.last = beat, every_s, -math.inf

    def __call__(self) -> None:
        if self.beat is not None and time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self.beat()


def ranked_lm(lm_class: type, *, rank: int, world_size: int, heartbeat: Callable[[], None]) -> type:
    """``lm_class`` (lm-eval's ``HFLM``) as rank ``rank`` of ``world_size`` in the trial's process group.

    lm-eval takes its ranks from ``accelerate`` when it loads a model itself; a model passed in counts
    as one process. This class names the trial's ranks instead and gathers with ``torch.distributed``,
    and heartbeats at each model call (a batch of requests, or a generation)."""

    class RankedLM(lm_class):
        @property
        def rank(self) -> int:
            return rank

        @property
        def world_size(self) -> int:
            return world_size

        def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
            if world_size == 1:
                return tensor
            parts = [torch.empty_like(tensor) for _ in range(world_size)]
            torch.distributed.all_gather(parts, tensor)
            return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

        def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
            if world_size == 1:
                return [obj]
            gathered = [None] * world_size if rank == dst else None
            torch.distributed.gather_object(obj, gathered, dst=dst)
            return gathered

        def barrier(self) -> None:
            if world_size > 1:
                torch.distributed.barrier()

        def _model_call(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            heartbeat()
            return super()._model_call(*args, **kwargs)

        def _model_generate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            heartbeat()
            return super()._model_generate(*args, **kwargs)

    return RankedLM


class TaskScorer:
    """Runs a trial's lm-eval tasks on its model; build it once, on every rank (``rank`` of ``world_size``)."""

    def __init__(self, cfg: TasksConfig, tokenizer_dir: str, *, trust_remote_code: bool = False,
                 rank: int = 0, world_size: int = 1) -> None:
        from lm_eval.tasks import TaskManager

        from hpcsweep.model.folder_tokenizer import load_folder_tokenizer

        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.tokenizer = load_folder_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
        # Only the user's folder is indexed: lm-eval's hundreds of built-in tasks are never read.
        task_manager = TaskManager(include_path=str(Path(str(cfg.include_path)).expanduser()), include_defaults=False)
        # Loaded once (their data read once); each scoring builds its requests anew.
        self.tasks = task_manager.load(list(cfg.names))
        for task in self.tasks["tasks"].values():
            if task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)

    def score(self, model: torch.nn.Module, heartbeat: Callable[[], None] | None = None) -> dict[str, dict[str, float]] | None:
        """Every task's scores on ``model`` (unwrapped: no DDP), ``{NAME: {METRIC: value}}`` on rank 0,
        None on the other ranks; a collective of every rank. ``heartbeat`` is called at model calls,
        every ``HEARTBEAT_EVERY_S`` at most."""
        from lm_eval.evaluator import evaluate
        from lm_eval.models.huggingface import HFLM

        lm_class = ranked_lm(HFLM, rank=self.rank, world_size=self.world_size, heartbeat=Heartbeat(heartbeat))
        with training_state_kept(model), torch.no_grad(), _quiet_lm_eval():
            for task in self.tasks["tasks"].values():
                task.set_fewshot_seed(seed=FEWSHOT_SEED)
            # A peft model evaluates through its base, which holds the adapters in place.
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            lm = lm_class(pretrained=base, tokenizer=self.tokenizer, batch_size=self.cfg.batch_size)
            # Standard errors are never reported (scores_from_results): no bootstrap.
            results = evaluate(lm=lm, task_dict=self.tasks, limit=self.cfg.limit, bootstrap_iters=0, log_samples=False)
        return None if results is None else scores_from_results(results["results"])


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """lm-eval's info lines and its warning that a model passed in is one process, silenced within."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_task_scorer(
    cfg: TasksConfig, tokenizer_dir: str | None, *, rank: int, world_size: int, trust_remote_code: bool,
) -> TaskScorer | None:
    """The scorer of a trial with tasks, on every rank; None without tasks. Its tokenizer loads with
    ``trust_remote_code`` (``model.trust_remote_code``)."""
    if not cfg.names:
        return None
    if tokenizer_dir is None:
        raise ValueError(f"tasks.names={cfg.names} is not allowed: task scores need a tokenizer (model.path or data.tokenizer)")
    return TaskScorer(cfg, tokenizer_dir, trust_remote_code=trust_remote_code, rank=rank, world_size=world_size)
