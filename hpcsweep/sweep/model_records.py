"""The model folders of one sweep, each read once on the login node for every check that needs it.

A sweep's trials mostly load one folder (``model.path``). ``SweepModelRecords`` reads a folder into its
``ModelRecord`` (``config.json``, the weight files, the weights' fingerprint: ``hpcsweep.model.record``)
on the first trial that needs it, and hands that record to every login-node check after: the
pretrained-model check of each trial (``hpcsweep.sweep.prepare``), the memory plan at submit
(``hpcsweep.sweep.memory_check``, ``plan_preview``), the resume check, and the identities ``sweep.json``
records (``HpcsweepTrials.sweep_facts``). A sweep of N trials over one folder reads its ``config.json``
once and fingerprints its weights once, not N times in each check.

It lives as long as one sweep's checks: another sweep, even in the same process (a test, a second
``python -m hpcsweep -m`` through the local launcher), gets a new one and reads the folder again, since
it may have changed in between. The nodes read the folder once more at each attempt
(``hpcsweep.trial.attempt``): the record checked here is never trusted there.
"""

from __future__ import annotations

from typing import Any

from hpcsweep.model.record import ModelRecord, read_model_record


class SweepModelRecords:
    """``{model.path: ModelRecord}`` for one sweep's checks, each folder read when first asked for."""

    def __init__(self) -> None:
        self._records: dict[str, ModelRecord] = {}

    def record(self, model: Any) -> ModelRecord | None:
        """The record of the folder a trial's ``model`` group names (``model.path`` as typed); None for
        the built-in model. ``ValueError`` naming ``model.path`` when the folder cannot be read
        (``read_model_record``); a folder that could not be read is tried again when next asked for."""
        path = model.path
        if path is None:
            return None
        if path not in self._records:
            self._records[path] = read_model_record(path)
        return self._records[path]

    def identity(self, trial: Any) -> dict[str, Any] | None:
        """The identity of the folder a ``TrialConfig`` trains from (``ModelRecord.identity``), as the
        resume check compares it and ``sweep.json`` records it; None for the built-in model."""
        record = self.record(trial.model)
        return None if record is None else record.identity
