"""Synthetic sweep dirs (sweep.json, metrics.json, config.yaml, event files) for report/status tests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.files.sweep_record import (
    ArrayRecord,
    SweepRecord,
    TrialRecord,
    write_sweep_record,
)

CONFIG = {"model": {"lr": 3e-3}, "data": {"batch_size": 4, "seq_len": 32}, "trainer": {"grad_accum": 1, "max_steps": 8}}


def metrics(status: str, step: int = 8, best: float | None = 2.0, **extra: Any) -> dict[str, Any]:
    """A metrics.json as the trainer writes it."""
    return {
        "status": status, "step": step, "max_steps": 8, "train_loss": best, "val_loss": best,
        "best_val_loss": best, "tokens_per_s": 1000.0, "restarts": 0, "world_size": 2, "nodes": ["node1"],
        "started_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T01:00:00+00:00",
        "weights_sha256": None, "error": None, **extra,
    }


def trained_config(overrides: Sequence[str]) -> dict[str, Any]:
    """``CONFIG`` with the trial's overrides applied: the config.yaml a trial trained with writes."""
    import copy

    config = copy.deepcopy(CONFIG)
    for override in overrides:
        key, sep, text = override.lstrip("+").partition("=")
        if not sep or key.startswith(("hydra.", "resume.")):
            continue
        value = yaml.safe_load(text)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return config


def make_sweep(
    sweep_dir: Path,
    trials: Sequence[tuple[Sequence[str], Mapping[str, Any] | None]],
    launcher: str = "local",
    array_id: str = "41",
) -> SweepRecord:
    """A sweep dir with one trial per ``(overrides, metrics or None)``."""
    records = []
    for num, (overrides, trial_metrics) in enumerate(trials):
        trial_dir = sweep_dir / str(num)
        (trial_dir / ".hydra").mkdir(parents=True)
        (trial_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
        (trial_dir / "config.yaml").write_text(yaml.safe_dump(trained_config(overrides)))
        if trial_metrics is not None:
            (trial_dir / "metrics.json").write_text(json.dumps(trial_metrics))
        job_id = f"{array_id}_{num}" if launcher == "slurm" else None
        records.append(TrialRecord(num, list(overrides), str(trial_dir), job_id, "2026-01-01T00:00:00+00:00"))
    arrays = [ArrayRecord(array_id, [r.num for r in records])] if launcher == "slurm" else []
    record = SweepRecord(str(sweep_dir), launcher, "2026-01-01T00:00:00+00:00", records, arrays)
    write_sweep_record(record)
    return record
