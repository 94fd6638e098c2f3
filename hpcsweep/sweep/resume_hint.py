"""What the command prints when it stops a trial with a checkpoint: one line naming how to resume."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence

RUN_DIR_KEY = "hydra.run.dir"
SWEEP_DIR_KEY = "hydra.sweep.dir"


def shown_dir(directory: str, cwd: str) -> str:
    """``directory`` relative to ``cwd`` when it lies under it (as Hydra's defaults are), else absolute."""
    absolute = os.path.abspath(os.path.join(cwd, directory))
    relative = os.path.relpath(absolute, cwd)
    return absolute if relative == ".." or relative.startswith(f"..{os.sep}") else relative


def resume_command(argv: Sequence[str], dir_key: str, directory: str) -> str:
    """The command line that resumes: the same arguments, with ``dir_key=directory`` pinned.

    ``argv`` is the command's arguments after ``python -m hpcsweep``; an earlier ``dir_key=``
    among them is replaced.
    """
    kept = [arg for arg in argv if not arg.startswith(f"{dir_key}=")]
    return shlex.join(["python", "-m", "hpcsweep", *kept, f"{dir_key}={directory}"])


def this_trial() -> str:
    """How the running trial is named in a stop message: ``trial #N`` in a sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_config = HydraConfig.get()
    return f"trial #{hydra_config.job.num}" if hydra_config.mode == RunMode.MULTIRUN else "the trial"


def stopped_line(what: str) -> str:
    """``what`` and the command that resumes this run or sweep, as the one line the command prints.

    Inside a Slurm job the command line is the job's, not the user's: no resume command then.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from hpcsweep.slurm.env import slurm_job_env

    if slurm_job_env(os.environ) is not None:
        return what
    hydra_config = HydraConfig.get()
    if hydra_config.mode == RunMode.MULTIRUN:
        key, directory = SWEEP_DIR_KEY, str(hydra_config.sweep.dir)
    else:
        key, directory = RUN_DIR_KEY, str(hydra_config.run.dir)
    command = resume_command(sys.argv[1:], key, shown_dir(directory, os.getcwd()))
    return f"{what}; resume with: {command}"
