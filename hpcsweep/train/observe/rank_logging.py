"""torch's C++ warnings from rank 0 only: the same line from every rank says nothing more.

A C++ warning (``reducer.cpp``'s ``find_unused_parameters=True ... did not find any unused
parameters``, for one) is printed by each rank's c10 logger, so an N-rank trial's log repeats it N
times. c10 reads its level, ``TORCH_CPP_LOG_LEVEL``, once, as torch loads: the worker entry sets it
to ``ERROR`` on every rank but 0, before anything imports torch. Errors still come from every rank,
and a level the user set is kept. No torch here: this runs first.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

LEVEL_VARIABLE = "TORCH_CPP_LOG_LEVEL"
QUIET_LEVEL = "ERROR"


def cpp_log_level(env: Mapping[str, str]) -> str | None:
    """The c10 log level a worker with environment ``env`` should run with; None: leave it as it is."""
    if LEVEL_VARIABLE in env or env.get("RANK", "0") == "0":
        return None
    return QUIET_LEVEL


def quiet_cpp_warnings_off_rank_0(env: MutableMapping[str, str]) -> None:
    """Set ``cpp_log_level`` in ``env`` (the worker's ``os.environ``, before torch is imported)."""
    level = cpp_log_level(env)
    if level is not None:
        env[LEVEL_VARIABLE] = level
