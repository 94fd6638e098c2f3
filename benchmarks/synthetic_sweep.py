"""Synthetic sweep dirs for the report and status benchmarks: what a sweep leaves on disk, written fast.

Each trial dir holds what the trainer and Hydra write and what ``status`` and ``report`` read:
``metrics.json``, ``config.yaml``, ``.hydra/overrides.yaml``, and a TensorBoard run with one event
file of scalars (every tag at every step) and one HParams file. Event files are framed with the
reader's own vectorized checksums, so a 1,000-trial sweep is written in seconds; the benchmarks
check what they read against TensorBoard's reader, so a framing mistake here could not go unseen.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml
from tensorboard.compat.proto import event_pb2, summary_pb2

from hpcsweep.files.sweep_record import ArrayRecord, SweepRecord, TrialRecord, write_sweep_record
from hpcsweep.files.tb_runs import run_name
from hpcsweep.results.hparams import hparams_summary
from hpcsweep.results.tfrecord import masked_crc32c_many

TAGS = ("train/loss", "val/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu")
"""The trainer's tags (``hpcsweep.train.trackers.metrics.TAGS``, not imported: it needs torch)."""
START_TIME = 1.7e9
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def frame(payloads: Sequence[bytes]) -> bytes:
    """TFRecord framing of serialized events: length, its masked CRC, the data, its masked CRC."""
    headers = [_LENGTH.pack(len(p)) for p in payloads]
    header_buf = np.frombuffer(b"".join(headers), dtype=np.uint8)
    header_crcs = masked_crc32c_many(header_buf, np.arange(len(headers)) * 8, np.full(len(headers), 8)).tolist()
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    data_buf = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    data_crcs = masked_crc32c_many(data_buf, np.cumsum(lengths) - lengths, lengths).tolist()
    return b"".join(
        b"".join((header, _CRC.pack(hcrc), payload, _CRC.pack(dcrc)))
        for header, hcrc, payload, dcrc in zip(headers, header_crcs, payloads, data_crcs)
    )


def scalar_event_file(values: np.ndarray) -> bytes:
    """An event file as ``SummaryWriter.add_scalar`` writes it: the file version, then ``values[step, tag]``."""
    payloads = [event_pb2.Event(wall_time=START_TIME, file_version="brain.Event:2").SerializeToString()]
    for step in range(values.shape[0]):
        for col, tag in enumerate(TAGS):
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=values[step, col])])
            event = event_pb2.Event(wall_time=START_TIME + step, step=step, summary=summary)
            payloads.append(event.SerializeToString())
    return frame(payloads)


def hparams_event_file(hparams: dict[str, float]) -> bytes:
    """The HParams session start the trainer writes into each run."""
    event = event_pb2.Event(wall_time=START_TIME, summary=hparams_summary(hparams, START_TIME))
    return frame([event_pb2.Event(wall_time=START_TIME, file_version="brain.Event:2").SerializeToString(),
                  event.SerializeToString()])


def trial_metrics(status: str, step: int, max_steps: int, values: np.ndarray) -> dict:
    """metrics.json of a trial in ``status`` at ``step``."""
    metrics = {
        "status": status, "step": step, "max_steps": max_steps, "restarts": 0, "world_size": 1,
        "nodes": ["node1"], "started_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:10:00+00:00",
        "weights_sha256": None, "error": None,
        "train_loss": None, "val_loss": None, "best_val_loss": None, "tokens_per_s": None,
    }
    if step:
        metrics.update(train_loss=float(values[step - 1, 0]), val_loss=float(values[step - 1, 1]),
                       best_val_loss=float(values[:step, 1].min()), tokens_per_s=float(values[step - 1, 4]) * 1e4)
    if status == "failed":
        metrics["error"] = ["Traceback (most recent call last):", "RuntimeError: NCCL timeout"]
    return metrics


def write_trial(trial_dir: Path, overrides: list[str], config_text: str, status: str, step: int,
                max_steps: int, rng: np.random.Generator, layout: str = "run") -> None:
    """One trial dir; ``status`` "pending" leaves only what Hydra writes before the trial starts.

    ``layout`` "run" puts events in ``tb/<run name>`` as the trainer does now, "tb" directly in ``tb/``.
    """
    (trial_dir / ".hydra").mkdir(parents=True)
    (trial_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (trial_dir / "config.yaml").write_text(config_text)
    if status == "pending":
        return
    values = rng.random((max_steps, len(TAGS)), dtype=np.float32)
    run_dir = trial_dir / "tb" / run_name(",".join(overrides)) if layout == "run" else trial_dir / "tb"
    run_dir.mkdir(parents=True)
    (run_dir / "events.out.tfevents.1700000000.node1.1.0").write_bytes(scalar_event_file(values[:step]))
    if layout == "run":
        lr = float(overrides[0].split("=", 1)[1])
        (run_dir / "events.out.tfevents.1700000000.node1.1.0.hparams").write_bytes(hparams_event_file({"model.lr": lr}))
    (trial_dir / "metrics.json").write_text(json.dumps(trial_metrics(status, step, max_steps, values)))


def write_sweep(sweep_dir: Path, statuses: Sequence[str], steps: int, config_text: str, launcher: str = "local",
                array_id: str = "4242", layout: str = "run") -> SweepRecord:
    """A sweep of one trial per status, sweep.json included; running trials are halfway."""
    rng = np.random.default_rng(0)
    records = []
    for num, status in enumerate(statuses):
        lr = f"{1e-5 * (num + 1):.6g}"
        overrides = [f"model.lr={lr}"]
        step = {"pending": 0, "running": steps // 2}.get(status, steps)
        write_trial(sweep_dir / str(num), overrides, config_text.replace("lr: 0.0003", f"lr: {lr}"), status, step,
                    steps, rng, layout)
        job_id = f"{array_id}_{num}" if launcher == "slurm" else None
        records.append(TrialRecord(num, overrides, str(sweep_dir / str(num)), job_id, "2026-01-01T00:00:00+00:00"))
    arrays = [ArrayRecord(array_id, [r.num for r in records])] if launcher == "slurm" else []
    record = SweepRecord(str(sweep_dir), launcher, "2026-01-01T00:00:00+00:00", records, arrays)
    write_sweep_record(record)
    return record
