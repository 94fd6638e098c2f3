"""``python -m foreign_app.record_returns OUT.json -m ...``: the app, plus what its launcher returned.

``hydra.main`` drops what a multirun returns: the sweeper's list, one per batch, of the JobReturns
its launcher handed back. This entry point runs the same ``hydra.main`` app with the same
arguments, and keeps that list by wrapping the one Hydra method that returns it, so that a test
can check the values, overrides and working dirs a launcher gives Hydra without replacing the
sweeper or the launcher.
"""

import json
import sys
from pathlib import Path
from typing import Any

from hydra._internal.hydra import Hydra
from hydra.core.utils import JobReturn

from foreign_app.app import main as app_main


def describe(job_return: JobReturn) -> dict[str, Any]:
    """The parts of a JobReturn a test checks, as JSON."""
    hydra_cfg = job_return.hydra_cfg
    value = job_return._return_value  # the public property raises for a failed job
    return {
        "overrides": list(job_return.overrides or []),
        "working_dir": job_return.working_dir,
        "status": job_return.status.name,
        "return_value": value if isinstance(value, str) else repr(value),
        "num": None if hydra_cfg is None else hydra_cfg.hydra.job.num,
        "output_dir": None if hydra_cfg is None else hydra_cfg.hydra.runtime.output_dir,
        "task_name": job_return.task_name,
    }


def main() -> None:
    out = Path(sys.argv.pop(1)).resolve()
    multirun = Hydra.multirun

    def recording_multirun(self: Hydra, *args: Any, **kwargs: Any) -> Any:
        batches = multirun(self, *args, **kwargs)
        out.write_text(json.dumps([[describe(r) for r in batch] for batch in batches], indent=1) + "\n")
        return batches

    Hydra.multirun = recording_multirun
    app_main()


if __name__ == "__main__":
    main()
