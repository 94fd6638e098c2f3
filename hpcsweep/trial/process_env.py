"""The process environment a trial's workers start with: the task's own, plus the trial's variables, for the
trial's duration only.

torchrun's agent and the in-process fast path start their workers from ``os.environ``, so a trial's
variables (its NCCL preset, ``OMP_NUM_THREADS``) must be there while it runs. Several trials run one after
another in one process (``hydra.launcher.trials_per_task``), so each must find the environment as the task
started, never the last trial's: ``environment_overlay`` puts every variable back as it was, set or unset.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping


@contextlib.contextmanager
def environment_overlay(
    variables: Mapping[str, str], environ: MutableMapping[str, str] | None = None
) -> Iterator[None]:
    """``variables`` set in ``environ`` (``os.environ``) inside the block; afterwards ``environ`` is exactly as
    before, also without what the trial set itself inside it (an in-process worker exports CUDA's variables)."""
    environ = os.environ if environ is None else environ
    before = dict(environ)
    environ.update(variables)
    try:
        yield
    finally:
        for name in [name for name in environ if name not in before]:
            del environ[name]
        for name, value in before.items():
            if environ.get(name) != value:
                environ[name] = value
