"""Refuse, before submit, every trial whose memory plan does not fit the GPUs it will get, and show
the plans that fit: one line per distinct plan (``memory plan: trials #0-2: ~53 GB/GPU of 80 per A100
(LoRA r=16, DDP): fits``).

On Slurm only: the GPUs' memory comes from ``hydra.launcher.gpu_mem_gb``, ``hydra.launcher.gres``
or the partition's GRES (``hpcsweep.memory_plan.gpu_memory``). A local run is not checked: there is no queue
to wait in, and an out-of-memory trial fails within seconds (its ``metrics.json`` still holds its
plan against the real GPU, and the measured peak).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hpcsweep.memory_plan.gpu_memory import GpuMemory, gpu_memory
from hpcsweep.memory_plan import (
    MemoryPlan,
    TrainingSetup,
    fits,
    plan_line,
    plan_memory,
    refusal_line,
    resolve_parallel,
    setup_of_trial,
    shape_of_trial,
)
from hpcsweep.memory_plan.model_shape import ModelShape, shape_from_hf_config, total_parameters
from hpcsweep.sweep.allocation import gpus_asked
from hpcsweep.sweep.hooks import SweepTrial
from hpcsweep.sweep.model_records import SweepModelRecords

log = logging.getLogger(__name__)


def memory_check_enabled(params: Mapping[str, Any]) -> bool:
    """``hydra.launcher.check_memory`` (absent: true); ``ValueError`` unless true or false."""
    value = params.get("check_memory", True)
    if not isinstance(value, bool):
        raise ValueError(f"hydra.launcher.check_memory={value!r} is not allowed: true or false")
    return value


def trial_numbers(nums: Sequence[int]) -> str:
    """``trial #3`` / ``trials #0-2,5``: trial numbers, consecutive ones as a range."""
    ranges: list[list[int]] = []
    for num in sorted(nums):
        if ranges and num == ranges[-1][1] + 1:
            ranges[-1][1] = num
        else:
            ranges.append([num, num])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
    return f"trial{'s' if len(nums) > 1 else ''} #{text}"


def grouped_plan_lines(planned: Sequence[tuple[int, str]]) -> list[str]:
    """One line per distinct plan line, naming the trials that have it, in the order first met."""
    groups: dict[str, list[int]] = {}
    for num, line in planned:
        groups.setdefault(line, []).append(num)
    return [f"{trial_numbers(nums)}: {line}" for line, nums in groups.items()]


def trial_plan(
    trial: SweepTrial, params: Mapping[str, Any], gpu: GpuMemory | None, records: SweepModelRecords
) -> tuple[ModelShape, TrainingSetup, MemoryPlan] | None:
    """The shape, setup (``trainer.parallel=auto`` resolved against ``gpu``) and plan of one trial on the
    GPUs it asks for, its model folder as ``records`` holds it; None for a trial that asks for no GPU,
    or (with a warning) whose model the plan does not know."""
    config = trial.app_config[0]
    per_node = gpus_asked(trial.allocation, params)
    if per_node == 0:
        return None
    record = records.record(config.model)
    try:
        shape = shape_of_trial(config.model, record)
    except ValueError as err:  # a pretrained folder of an architecture the plan does not know
        log.warning("trial #%d: memory plan not checked: %s", trial.num, err)
        return None
    setup = setup_of_trial(config, world_size=trial.allocation.nodes * per_node, device="cuda",
                           bf16=True if gpu is None else gpu.bf16, record=record)
    if setup.parallel == "auto":
        setup = replace(setup, parallel=resolve_parallel(shape, setup, gpu))
    return shape, setup, plan_memory(shape, setup)


def tasks_refusal(trial: SweepTrial, setup: TrainingSetup) -> str | None:
    """The refusal line of a trial with tasks that ``trainer.parallel=auto`` shards with FSDP (task scores
    run on each rank's whole model; ``trainer.parallel=fsdp`` itself is refused by ``check_tasks``)."""
    names = trial.app_config[0].tasks.names
    if setup.parallel != "fsdp" or not names:
        return None
    return (f"trial #{trial.num}: tasks.names={names} is not allowed here: trainer.parallel=auto chose FSDP (the "
            "trial does not fit a GPU with DDP), and task scores run on each rank's whole model; drop tasks.names, "
            "or make the trial fit with DDP (model.peft=lora, trainer.grad_checkpointing=true)")


def reference_refusal(trial: SweepTrial, shape: ModelShape, gpu: GpuMemory) -> str | None:
    """The refusal line of a DPO trial whose reference the preparation job would compute on one ``gpu`` that its
    float32 weights do not fit (``hpcsweep.prepare.reference_logps``); None when it fits, or is computed already."""
    from hpcsweep.config import reference_folder
    from hpcsweep.model.folder import read_model_folder
    from hpcsweep.prepare.reference_logps import REFERENCE_BYTES_PER_PARAMETER, reference_path
    from hpcsweep.sweep.text_preparation import sweep_text_corpus

    config = trial.app_config[0]
    folder = reference_folder(config)
    if folder is None:
        return None
    corpus = sweep_text_corpus(config)
    if corpus.is_cached() and reference_path(corpus.entry, folder).is_file():
        return None
    if folder != config.model.path:
        shape = shape_from_hf_config(read_model_folder(folder, "objective.reference").config)
    weights = REFERENCE_BYTES_PER_PARAMETER * total_parameters(shape)
    if weights <= gpu.bytes:
        return None
    alternative = ("set objective.precompute_reference=false (the reference then runs in each trial, the model with "
                   "its LoRA adapters off)" if config.model.peft == "lora" and config.objective.reference is None
                   else "full fine-tuning DPO has no other route yet: use LoRA (model.peft=lora "
                   "objective.precompute_reference=false), or GPUs with more memory")
    return (f"trial #{trial.num}: objective.precompute_reference is not allowed here: the preparation job computes "
            f"the reference's log-probabilities with {folder} in float32 on one GPU, {weights / 2 ** 30:.1f} GB of "
            f"weights, more than the {gpu.gb:.0f} GB of one {gpu.label}; {alternative}")


def memory_refusals(
    trials: Sequence[SweepTrial], params: Mapping[str, Any], gpu: GpuMemory, records: SweepModelRecords
) -> tuple[list[str], list[str]]:
    """The refusal line of each trial that does not fit ``gpu`` (or has tasks where it needs FSDP), and one
    plan line per distinct plan.

    ``app_config`` of each trial is hpcsweep's ``(TrialConfig, ResumeConfig)``; a trial that asks
    for no GPU is not checked.
    """
    refused: list[str] = []
    planned: list[tuple[int, str]] = []
    for trial in trials:
        found = trial_plan(trial, params, gpu, records)
        if found is None:
            continue
        shape, setup, plan = found
        planned.append((trial.num, plan_line(plan, setup, gpu)))
        if not fits(plan, gpu):
            refused.append(refusal_line(trial.num, shape, setup, plan, gpu, gpus_asked(trial.allocation, params)))
        elif (line := tasks_refusal(trial, setup) or reference_refusal(trial, shape, gpu)) is not None:
            refused.append(line)
    return refused, grouped_plan_lines(planned)


def check_memory_plans(
    trials: Sequence[SweepTrial], params: Mapping[str, Any], partition_gres: Sequence[str],
    records: SweepModelRecords | None = None,
) -> None:
    """Raise ``ValueError`` with the first refusal line (and how many more) when a trial cannot fit.

    Logs each distinct plan in one line when all fit; warns, and checks nothing, when the GPUs'
    memory is unknown. Model folders are planned as ``records`` holds them (the sweep's, read once
    when its trials were checked), else read here once for all the trials.
    """
    if not memory_check_enabled(params):
        return
    gpu = gpu_memory(params, partition_gres)
    if isinstance(gpu, str):
        if any(gpus_asked(t.allocation, params) for t in trials):
            log.warning("memory plans not checked: %s; set hydra.launcher.gpu_mem_gb to the GB of one GPU", gpu)
        return
    refused, lines = memory_refusals(trials, params, gpu, SweepModelRecords() if records is None else records)
    if refused:
        more = f" ({len(refused) - 1} more of the {len(trials)} trials do not fit either)" if len(refused) > 1 else ""
        raise ValueError(refused[0] + more)
    for line in lines:
        log.info("memory plan: %s", line)
