"""Pure functions from a trial's allocation and the launcher's settings to submitit parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

from hpcsweep.slurm.partition_limits import AllocationRequest, Asked, parse_mem_mb
from hpcsweep.sweep.containers import launch_of
from hpcsweep.sweep.hooks import Allocation

# Launcher keys that are submitit's: those of hydra-submitit-launcher's ``SlurmQueueConf``, which hpcsweep's
# launcher configs extend. Every key they add is hpcsweep's own and never reaches submitit. Less the two that
# are AutoExecutor arguments, not parameters (``slurm_submit._submit_array``), and the target.
_SUBMITIT_KEYS = frozenset(f.name for f in fields(SlurmQueueConf)) - {"submitit_folder", "max_num_timeout", "_target_"}
# Launcher keys that size or place the allocation (``hooks.launcher_allocation``), or that
# ``executor_parameters`` passes on itself.
_SIZE_KEYS = {
    "nodes", "tasks_per_node", "gpus_per_node", "placement", "placement_max_wait_min", "mem",
    "additional_parameters", "exclude",
}
# Launcher keys submitit names without the "slurm_" prefix.
_BASE_KEYS = {"timeout_min", "cpus_per_task", "name", "stderr_to_stdout", "mem_gb"}


def check_option_values(params: Mapping[str, Any]) -> None:
    """Reject launcher values that could break out of an ``#SBATCH`` line.

    submitit quotes every value, but a newline would still start a new line of the batch script.
    """
    def walk(key: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                if any(ord(ch) < 32 for ch in str(sub_key)):
                    raise ValueError(f"{key}: option name {sub_key!r} contains a control character")
                walk(f"{key}.{sub_key}", sub_value)
        elif isinstance(value, (list, tuple)) and key != "hydra.launcher.setup":
            for index, item in enumerate(value):
                walk(f"{key}[{index}]", item)
        elif isinstance(value, str) and any(ord(ch) < 32 for ch in value):
            raise ValueError(
                f"{key}={value!r} is not allowed: Slurm option values must not contain newlines "
                "or other control characters"
            )

    for name, value in params.items():
        walk(f"hydra.launcher.{name}", value)


# Slurm keeps --signal's delay in 16 bits.
MAX_SIGNAL_DELAY_S = 65535


def check_time_limit(params: Mapping[str, Any]) -> None:
    """Reject a time limit, warning delay, requeue cap or retry cap that would loop or never warn.

    A warning at or before the job's start would stop every run before it trained a step, and
    the trial would requeue until its cap.
    """
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    timeout_min, delay, cap = params.get("timeout_min"), params.get("signal_delay_s"), params.get("max_num_timeout")
    if not whole(timeout_min) or timeout_min < 1:
        raise ValueError(f"hydra.launcher.timeout_min={timeout_min!r} is not allowed: a whole number of minutes >= 1")
    longest_delay = min(timeout_min * 60 - 1, MAX_SIGNAL_DELAY_S)
    if not whole(delay) or not 1 <= delay <= longest_delay:
        raise ValueError(
            f"hydra.launcher.signal_delay_s={delay!r} is not allowed: whole seconds from 1 to "
            f"{longest_delay} (below timeout_min={timeout_min} minutes)"
        )
    if not whole(cap) or cap < 0:
        raise ValueError(f"hydra.launcher.max_num_timeout={cap!r} is not allowed: a whole number >= 0")
    retries = params.get("max_retries", 0)
    if not whole(retries) or retries < 0:
        raise ValueError(f"hydra.launcher.max_retries={retries!r} is not allowed: a whole number >= 0")


def gpus_asked(allocation: Allocation, params: Mapping[str, Any]) -> int:
    """GPUs to ask for on each node: none when ``hydra.launcher.gpus_per_node`` is 0 (CPU
    partitions), else the allocation's number, else the launcher's."""
    launcher_gpus = int(params.get("gpus_per_node") or 0)
    if launcher_gpus == 0:
        return 0
    return launcher_gpus if allocation.gpus_per_node is None else allocation.gpus_per_node


def allocation_request(allocation: Allocation, params: Mapping[str, Any]) -> AllocationRequest:
    """What a job of this allocation asks the cluster for, each amount with the key that sets it.

    Raises ``ValueError`` on a ``mem`` that is no ``--mem`` value.
    """
    nodes = allocation.nodes
    cpus = params.get("cpus_per_task")
    gpus = gpus_asked(allocation, params)
    gpu_key = "hydra.launcher.gpus_per_node" if allocation.gpus_per_node is None else allocation.gpus_key
    mem = params.get("mem")
    mem_mb = None if mem is None else parse_mem_mb(str(mem))
    if mem is not None and mem_mb is None:
        raise ValueError(
            f"hydra.launcher.mem={mem!r} is not allowed: megabytes, or a whole number with a unit K, M, G or T "
            "(480G)"
        )
    return AllocationRequest(
        nodes=Asked(allocation.nodes_key, str(nodes), nodes),
        time_min=Asked("hydra.launcher.timeout_min", str(params["timeout_min"]), params["timeout_min"]),
        cpus_per_node=Asked("hydra.launcher.cpus_per_task", str(cpus), cpus) if cpus else None,
        gpus_per_node=Asked(gpu_key, str(gpus), gpus) if gpus else None,
        # --mem=0: all the memory of each node, whatever it is.
        mem_per_node=Asked("hydra.launcher.mem", str(mem), mem_mb) if mem_mb else None,
        partition=params.get("partition"),
        qos=params.get("qos"),
    )


def executor_parameters(
    allocation: Allocation, params: Mapping[str, Any], extra_sbatch: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``update_parameters`` keywords of a submitit AutoExecutor for one allocation.

    The size comes from ``allocation`` (an app's hook may set it from the trial's own config, so
    that nobody keeps two numbers in step); ``extra_sbatch`` holds the placement options. A container
    (``params`` from ``containers.with_container``) adds its ``srun`` flags and ``slurm_python``, the
    command that starts the image's Python: an AutoExecutor argument, which ``slurm_submit`` takes out.
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in _SUBMITIT_KEYS or key in _SIZE_KEYS or value is None:
            continue
        out[key if key in _BASE_KEYS else f"slurm_{key}"] = value
    out["nodes"] = allocation.nodes
    out["tasks_per_node"] = allocation.tasks_per_node
    gpus = gpus_asked(allocation, params)
    if gpus:
        out["gpus_per_node"] = gpus
    if params.get("mem"):
        out["slurm_mem"] = params["mem"]
    additional = {"requeue": True, **dict(params.get("additional_parameters") or {})}
    additional.update(extra_sbatch or {})
    excluded = _names(params.get("exclude")) | set(allocation.exclude) | _names(additional.pop("exclude", None))
    if excluded:
        out["slurm_exclude"] = ",".join(sorted(excluded))
    out["slurm_additional_parameters"] = additional
    # A worker that crashes ends the trial's every task at once, instead of leaving the other
    # nodes in a collective until NCCL's timeout. Safe for stops and retries: only the node that
    # requeues the job exits non-zero then.
    out["slurm_srun_args"] = ["--kill-on-bad-exit=1"]
    launch = launch_of(params)
    if launch is not None:
        out["slurm_srun_args"] += list(launch.srun_args)
        out["slurm_python"] = launch.python_command
    return out


def _names(csv: str | None) -> set[str]:
    return {name for name in (csv or "").split(",") if name}


def allocation_key(parameters: Mapping[str, Any]) -> tuple:
    """Trials whose executor parameters are equal can share one job array."""
    return tuple(sorted((k, repr(v)) for k, v in parameters.items()))


def chunk(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """Split ``items`` into consecutive pieces of at most ``size`` (arrays over MaxArraySize)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [items[i : i + size] for i in range(0, len(items), size)]
