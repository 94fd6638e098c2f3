"""TensorBoard HParams for a sweep: each trial's swept parameters, written when the trial starts.

``tensorboard --logdir SWEEP_DIR`` shows each trial's run dir (``hpcsweep.files.tb_runs``) as a run. Each
run gets one small event file (``*.hparams``) holding the session start: this trial's values of its
override keys, so running trials are listed too. The metrics are the runs' ordinary scalar tags;
the dashboard shows each one's latest value.

No experiment summary is written. Which keys differ across trials (``HParamInfo.differs``, which
orders the dashboard's columns), their domains and the metric tags belong to the whole sweep, and no
trial knows the values of the others; when no run carries an experiment, TensorBoard builds it from
every run's session start, and gets all three right.
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
from tensorboard.plugins.hparams import metadata, plugin_data_pb2

from hpcsweep.files.trial_files import CONFIG_FILE
from hpcsweep.results.overrides import flatten_config, is_training_key, split_override

HParamValue = bool | int | float | str

HPARAMS_FILE_SUFFIX = ".hparams"
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"


def hparam_value(value: Any) -> HParamValue:
    """A value TensorBoard can show: bool, number, or string (null and lists as JSON text)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value)


def trial_hparams(overrides: Sequence[str], config: Mapping[str, Any]) -> dict[str, HParamValue]:
    """The swept parameters of a trial: its override keys, valued from the resolved config.

    The resolved value is typed (``model.lr=1e-4`` gives the float 0.0001); a key that is not a
    leaf of the config, such as a config group choice (``model=llama_small``), keeps the override's
    text. Hydra's own keys (``hydra.*``) and how the run resumed (``resume.*``) are not hyperparameters.
    """
    flat = flatten_config(config)
    hparams: dict[str, HParamValue] = {}
    for override in overrides:
        parsed = split_override(override)
        if parsed is None or not is_training_key(parsed[0]):
            continue
        key, text = parsed
        hparams[key] = hparam_value(flat.get(key, text))
    return hparams


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


def hparams_summary(hparams: Mapping[str, HParamValue], start_time_secs: float) -> summary_pb2.Summary:
    """The HParams session-start summary of one trial."""
    session_start = plugin_data_pb2.SessionStartInfo(
        start_time_secs=start_time_secs,
        hparams={name: _proto_value(v) for name, v in hparams.items()},
    )
    return summary_pb2.Summary(
        value=[
            _plugin_value(
                metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=session_start)
            ),
        ]
    )


def write_hparams(run_dir: str | Path, hparams: Mapping[str, HParamValue]) -> None:
    """Write the HParams session start into a new event file in ``run_dir``."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    now = time.time()
    writer = EventFileWriter(str(run_dir), filename_suffix=HPARAMS_FILE_SUFFIX)
    try:
        writer.add_event(event_pb2.Event(wall_time=now, summary=hparams_summary(hparams, now)))
    finally:
        writer.close()


def write_trial_hparams(trial_dir: str | Path, run_dir: str | Path) -> bool:
    """Write the HParams data of the trial in ``trial_dir`` into its TensorBoard ``run_dir``; True when written.

    Reads the overrides Hydra recorded (``.hydra/overrides.yaml``) and the resolved
    ``config.yaml``. Does nothing on a resumed trial that has its HParams already, or for a trial
    run outside Hydra (no overrides recorded). Call it on the logging rank only.
    """
    trial_dir, run_dir = Path(trial_dir), Path(run_dir)
    overrides_path = trial_dir / OVERRIDES_FILE
    if not overrides_path.exists() or any(run_dir.glob(f"*{HPARAMS_FILE_SUFFIX}")):
        return False
    overrides = yaml.safe_load(overrides_path.read_text()) or []
    config = yaml.safe_load((trial_dir / CONFIG_FILE).read_text()) or {}
    write_hparams(run_dir, trial_hparams(overrides, config))
    return True
