"""Nothing is ever fetched from a model hub: the variables that keep huggingface_hub and transformers offline.

``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once, when it is first imported, so these must be in the
environment before anything imports transformers. ``stay_offline`` runs at the top of the two entry
modules: ``hpcsweep.app`` (the login node's command, and every Slurm array task and local trial
process, which import it to run the trial) and ``hpcsweep.train.__main__`` (every torchrun worker).
Child processes inherit them. Models come from local folders only (``local_files_only=True``).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

HUB_OFFLINE_VARIABLES = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""HF_DATASETS_OFFLINE: lm-eval's tasks read their data through the datasets package
(``hpcsweep.train.scores.task_scorer``)."""


def stay_offline(environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``HUB_OFFLINE_VARIABLES`` in ``environ`` (``os.environ``), over any value they had."""
    (os.environ if environ is None else environ).update(HUB_OFFLINE_VARIABLES)
