"""The memory plan of each trial a sweep command would run, part by part, without running or
submitting anything (``python -m hpcsweep.plan``).

The overrides are the sweep command's own: each comma-separated list is expanded as Hydra's basic
sweeper expands it, each trial composed and validated as the sweep would, then planned on the GPUs
it asks for (``hpcsweep.sweep.memory_check.trial_plan``). The GPUs' memory comes from
``hydra.launcher.gpu_mem_gb`` or ``gres``, else from the partition's GRES when Slurm answers; when
neither says, the plan is shown without a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.memory_plan import breakdown_lines, describe
from hpcsweep.memory_plan.gpu_memory import GpuMemory, gpu_memory
from hpcsweep.slurm import commands
from hpcsweep.slurm.partition_limits import SINFO_FORMAT, chosen_partition, parse_sinfo_partitions
from hpcsweep.sweep.hooks import SweepTrial
from hpcsweep.sweep.hydra_private import basic_sweeper_class
from hpcsweep.sweep.memory_check import trial_numbers, trial_plan
from hpcsweep.sweep.model_records import SweepModelRecords
from hpcsweep.sweep.single_run import CONFIG_MODULE, CONFIG_NAME

MULTIRUN_FLAGS = ("-m", "--multirun")


def expand_overrides(overrides: Sequence[str]) -> list[list[str]]:
    """Every trial's overrides: the cartesian product of the comma-separated sweeps, as Hydra's basic
    sweeper orders them; ``ValueError`` for an override Hydra cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise ValueError(f"cannot read the overrides: {err}") from None
    return [list(trial) for batch in basic_sweeper_class().split_arguments(parsed, None) for trial in batch]


def compose_trials(
    overrides: Sequence[str], records: SweepModelRecords
) -> tuple[list[SweepTrial], dict[str, Any]]:
    """Each trial of ``overrides`` composed and validated as the sweep would, its model folder as
    ``records`` holds it, and the launcher's parameters (``hydra.launcher``); ``ValueError`` naming the
    trial whose config is refused.

    The launchers' configs must be in Hydra's ConfigStore (``hydra_plugins.hpcsweep_plugins.config``
    imported) first."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from hpcsweep.sweep.hpcsweep_hook import trial_allocation
    from hpcsweep.sweep.prepare import validate_composed

    trials, params = [], {}
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        for num, trial_overrides in enumerate(expand_overrides(overrides)):
            config = compose(config_name=CONFIG_NAME, overrides=trial_overrides, return_hydra_config=True)
            params = OmegaConf.to_container(config.hydra.launcher, resolve=False)
            try:
                trial = validate_composed(config, records)
            except ValueError as err:
                raise ValueError(f"trial #{num} ({' '.join(trial_overrides) or '(defaults)'}): {err}") from None
            trials.append(SweepTrial(num, trial_overrides, Path("."), trial_allocation(trial), (trial, None)))
    return trials, params


def partition_gres(params: Mapping[str, Any]) -> list[str] | str:
    """The GRES of the launcher's partition's nodes as ``sinfo`` reports them, or why there are none."""
    try:
        partitions = parse_sinfo_partitions(commands.sinfo_partitions(SINFO_FORMAT))
        return [shape.gres for shape in chosen_partition(params.get("partition"), partitions).nodes]
    except (commands.SlurmCommandError, OSError, ValueError) as err:
        last = (str(err).strip().splitlines() or [""])[-1]
        return f"Slurm did not say which GPUs the partition has ({last})"


def preview_lines(
    trials: Sequence[SweepTrial], params: Mapping[str, Any], gpu: GpuMemory | None, records: SweepModelRecords
) -> list[str]:
    """For each distinct plan: the trials that have it and what it assumed, then its breakdown."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for trial in trials:
        found = trial_plan(trial, params, gpu, records)
        if found is None:
            groups.setdefault(("no GPU asked (hydra.launcher.gpus_per_node=0): nothing to plan",), []).append(trial.num)
            continue
        _, setup, plan = found
        head = (f"{describe(setup)}, {setup.precision}, {setup.world_size} GPU(s), "
                f"data.batch_size={setup.batch_size} x data.seq_len={setup.seq_len}")
        groups.setdefault((head, *("  " + line for line in breakdown_lines(plan, setup, gpu))), []).append(trial.num)
    lines = []
    for (head, *body), nums in groups.items():
        lines += [f"{trial_numbers(nums)}: {head}", *body]
    return lines


def plan_preview(overrides: Sequence[str]) -> list[str]:
    """The lines ``python -m hpcsweep.plan OVERRIDES`` prints; each model folder is read once for all
    the trials (``hpcsweep.sweep.model_records``)."""
    arguments = [arg for arg in overrides if arg not in MULTIRUN_FLAGS]
    records = SweepModelRecords()
    trials, params = compose_trials(arguments, records)
    gres = partition_gres(params)
    gpu = gpu_memory(params, [] if isinstance(gres, str) else gres)
    if isinstance(gpu, str) and isinstance(gres, str):
        gpu = gres
    lines = preview_lines(trials, params, gpu if isinstance(gpu, GpuMemory) else None, records)
    if not isinstance(gpu, GpuMemory):
        lines.append(f"not compared with a GPU: {gpu}; set hydra.launcher.gpu_mem_gb to the GB of one GPU")
    return lines
