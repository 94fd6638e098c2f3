"""Why Slurm's commands may not answer in this shell: no Slurm configuration to be found.

A shell without the cluster's environment (no ``SLURM_CONF``, no ``/etc/slurm/slurm.conf``) makes every
Slurm command look the controller up in DNS and fail with ``resolve_ctls_from_dns_srv: res_nsearch
error: Unknown host``, which names neither the variable nor the fix. ``status``, ``report`` and ``retry``
add this line where a Slurm command failed. Pure: the environment and a file test come in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

DEFAULT_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf")
"""Where a Slurm build reads its configuration when ``SLURM_CONF`` is unset (its compiled-in default)."""
FIX = ('set SLURM_CONF to the cluster\'s slurm.conf (the local test cluster: eval "$(scripts/slurm-cluster env)", '
       "which prints export SLURM_CONF=...)")


def slurm_config_hint(env: Mapping[str, str], is_file: Callable[[str], bool]) -> str | None:
    """The line that says Slurm finds no configuration here and how to give it one; None when
    ``SLURM_CONF`` names a file, or it is unset and a default one exists (then the failure is another)."""
    conf = env.get("SLURM_CONF")
    if conf:
        return None if is_file(conf) else f"Slurm's configuration was not found: SLURM_CONF={conf} is no file; {FIX}"
    if any(is_file(path) for path in DEFAULT_CONFS):
        return None
    return (f"Slurm's configuration was not found: SLURM_CONF is unset and there is no {DEFAULT_CONFS[0]}; "
            f"{FIX}")


def this_shells_hint() -> str | None:
    """:func:`slurm_config_hint` of this process's environment and file system."""
    import os

    return slurm_config_hint(os.environ, os.path.isfile)
