"""A Hydra callback that records each job's JobReturn where the job ran (on a Slurm node too)."""

import json
import os
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

JOB_END_FILE = "job_end.json"


def slurm_job_label(env: Mapping[str, str]) -> str | None:
    """``ARRAYID_TASK`` inside an array task (as ``sweep.json`` names it), the job id in a plain job, else None."""
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


class RecordJobEnd(Callback):
    """Writes ``job_end.json`` into the job's output dir when the job ends."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        value = job_return._return_value  # the public property raises for a failed job
        record = {
            "num": config.hydra.job.num,
            "overrides": list(job_return.overrides or []),
            "working_dir": job_return.working_dir,
            "status": job_return.status.name,
            "return_value": value if isinstance(value, str) else repr(value),
            "slurm_job": slurm_job_label(os.environ),
        }
        Path(config.hydra.runtime.output_dir, JOB_END_FILE).write_text(json.dumps(record, indent=1) + "\n")
