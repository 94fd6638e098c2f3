"""TensorBoard HParams for a sweep: each trial's swept parameters, written when the trial starts.

``tensorboard --logdir SWEEP_DIR`` shows every trial's ``tb/`` as a run. Each run gets one small
event file (``*.hparams``) holding the HParams experiment (parameter names and types, metric tags)
and the session start (this trial's values), so running trials are listed too. The metrics are
ordinary scalar tags; the dashboard shows each one's latest value.

Every trial of a sweep carries the same override keys, so the experiment any trial writes is the
sweep's; TensorBoard reads the first one it finds. No value domain is written, because one trial
does not know the values of the others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import struct_pb2
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

HParamValue = bool | int | float | str

METRIC_TAGS = ("val/loss", "train/loss", "hparams/best_val_loss", "perf/tokens_per_s")
"""The metrics the dashboard lists: scalar tags of ``hpcsweep.metrics.TAGS`` plus the best
validation loss so far, which the trainer logs as ``hparams/best_val_loss``."""
HPARAMS_FILE_SUFFIX = ".hparams"
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
CONFIG_FILE = "config.yaml"
TB_DIR = "tb"


def split_override(override: str) -> tuple[str, str] | None:
    """``+model.lr=1e-4`` -> ``("model.lr", "1e-4")``; None for a deletion (``~key``)."""
    if override.startswith("~") or "=" not in override:
        return None
    key, value = override.split("=", 1)
    return key.lstrip("+"), value


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"lr": 1e-4}}`` -> ``{"model.lr": 1e-4}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def hparam_value(value: Any) -> HParamValue:
    """A value TensorBoard can show: bool, number, or string (null and lists as JSON text)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value)


def trial_hparams(overrides: Sequence[str], config: Mapping[str, Any]) -> dict[str, HParamValue]:
    """The swept parameters of a trial: its override keys, valued from the resolved config.

    The resolved value is typed (``model.lr=1e-4`` gives the float 0.0001); a key that is not a
    leaf of the config, such as a config group choice (``model=llama_small``), keeps the override's
    text. Hydra's own keys (``hydra.*``) are not hyperparameters.
    """
    flat = flatten_config(config)
    hparams: dict[str, HParamValue] = {}
    for override in overrides:
        parsed = split_override(override)
        if parsed is None or parsed[0].startswith("hydra."):
            continue
        key, text = parsed
        hparams[key] = hparam_value(flat.get(key, text))
    return hparams


def _data_type(value: HParamValue) -> int:
    if isinstance(value, bool):
        return api_pb2.DATA_TYPE_BOOL
    if isinstance(value, (int, float)):
        return api_pb2.DATA_TYPE_FLOAT64
    return api_pb2.DATA_TYPE_STRING


def _proto_value(value: HParamValue) -> struct_pb2.Value:
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, (int, float)):
        return struct_pb2.Value(number_value=value)
    return struct_pb2.Value(string_value=value)


def _plugin_value(tag: str, data: plugin_data_pb2.HParamsPluginData) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR
    )


def hparams_summary(
    hparams: Mapping[str, HParamValue], metric_tags: Sequence[str], start_time_secs: float
) -> summary_pb2.Summary:
    """The HParams experiment and session-start summary of one trial."""
    experiment = api_pb2.Experiment(
        time_created_secs=start_time_secs,
        hparam_infos=[api_pb2.HParamInfo(name=name, type=_data_type(v)) for name, v in hparams.items()],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metric_tags],
    )
    session_start = plugin_data_pb2.SessionStartInfo(
        start_time_secs=start_time_secs,
        hparams={name: _proto_value(v) for name, v in hparams.items()},
    )
    return summary_pb2.Summary(
        value=[
            _plugin_value(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
            _plugin_value(
                metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=session_start)
            ),
        ]
    )


def write_hparams(tb_dir: str | Path, hparams: Mapping[str, HParamValue], metric_tags: Sequence[str]) -> None:
    """Write the HParams experiment and session start into a new event file in ``tb_dir``."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    now = time.time()
    writer = EventFileWriter(str(tb_dir), filename_suffix=HPARAMS_FILE_SUFFIX)
    try:
        writer.add_event(event_pb2.Event(wall_time=now, summary=hparams_summary(hparams, metric_tags, now)))
    finally:
        writer.close()


def write_trial_hparams(trial_dir: str | Path) -> bool:
    """Write the HParams data of the trial in ``trial_dir`` into its ``tb/``; True when written.

    Reads the overrides Hydra recorded (``.hydra/overrides.yaml``) and the resolved
    ``config.yaml``. Does nothing on a resumed trial that has its HParams already, or for a trial
    run outside Hydra (no overrides recorded). Call it on the logging rank only.
    """
    trial_dir = Path(trial_dir)
    tb_dir = trial_dir / TB_DIR
    overrides_path = trial_dir / OVERRIDES_FILE
    if not overrides_path.exists() or any(tb_dir.glob(f"*{HPARAMS_FILE_SUFFIX}")):
        return False
    overrides = yaml.safe_load(overrides_path.read_text()) or []
    config = yaml.safe_load((trial_dir / CONFIG_FILE).read_text()) or {}
    write_hparams(tb_dir, trial_hparams(overrides, config), METRIC_TAGS)
    return True
