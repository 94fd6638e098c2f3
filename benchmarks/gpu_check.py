"""Prove hpcsweep's GPU defaults on one real GPU, in at most 10 minutes.

    python benchmarks/gpu_check.py [--workdir DIR] [--json FILE]    one CUDA GPU (A100, H100, H200)
    python benchmarks/gpu_check.py --smoke                           tiny, on CPU, in seconds (CI)

It prints, for a ~125M and a ~1B DeepSeek-style model (configs/model/deepseek_125m.yaml and
deepseek_1b.yaml) trained with the defaults (``trainer.precision=auto``, so bf16):
  - tokens/s and MFU over the last logged window (steady state, after warm-up);
  - the time to save and to resume a checkpoint of the trained state (model, AdamW, RNG);
and for the ~125M model:
  - an exact stop and resume with ``trainer.deterministic=true``: a trial stopped halfway and
    resumed must end with the same weights SHA-256 as the same trial run straight through;
  - the same trial on the fast path (``trainer.deterministic=false``) and its tokens/s ratio;
and for the ~1B model, an FSDP trial (``trainer.parallel=fsdp``, sharded over the one GPU: bf16
parameters, fp32 reduction) and its tokens/s against the DDP trial's;
and a LoRA fine-tuning (``model.peft=lora``) of a ~1B DeepSeek-style folder saved with
``save_pretrained`` (``tests/model_folders.make_model_folder``, deepseek_1b's shape): tokens/s, MFU
counted over the frozen base's forward and backward (``hpcsweep.train.lora.training_flops_per_token``)
and peak GPU memory (its routed experts train through the expert LoRA); then full fine-tuning of the same
MoE folder, its tokens/s and peak beside LoRA's, and both trials' router statistics. Its trial builds the
folder's architecture from the folder's config.json.
It also checks the step-time breakdown (``hpcsweep.train.observe.step_timer``): the fast trial's last window
adds up to 100 % with its peak memory from the CUDA allocator, and on a GPU a ~125M trial reading its
data ``SLOW_DATA_MS`` slow (``data.read_delay_ms``) shows, through CUDA events read once per window,
the GPU waiting on data for most of its step (skipped on CPU, where the host clock times it: the unit
tests prove that path).
Telemetry: the large trial's metrics.json must hold NVML samples of its GPU (``telemetry.source``
``nvml``, utilisation not null), and real ``pynvml`` samples the GPU during a matmul loop, through the
trainer's own sampler and thread: the check prints them and the cost of one sample, and FAILs if the
utilisation is null. On CPU (``--smoke``) the trial's telemetry must come from the CPU sampler, with
the reason, and the matmul case is skipped, saying why.
Packed rows (``benchmarks/gpu_check_packing.py``): 8 rows of packed samples on each attention kernel the
device has (eager, SDPA, and flash-attention 2 where ``flash_attn`` is installed, run variable-length with
hpcsweep's cumulative lengths) give each sample the logits it has alone.
Last, the ~125M model with ``trainer.profile_steps=[2,3]`` and ``profile_memory``: a Perfetto trace of
exactly those steps holding CUDA kernels, and a CUDA allocator snapshot.

Every trial's memory plan (``memory_plan.tensors_bytes``) is printed against its measured peak
(``torch.cuda.max_memory_allocated``) and must lie within ``MEMORY_BAND`` of it.

Each part prints its lines as soon as it is done (progress on stderr); a part that fails prints
``FAIL <part>: <why>`` and the others still run, so one run on a borrowed GPU shows all it can.

It measures the product, not a copy: every trial is a trial dir with a ``config.yaml`` trained by
``hpcsweep.train.worker.run_trial``, as a 1-process trial runs in production (the runner calls it
in-process); the stop is the test hook the preemption tests use; checkpoint times come from
``Trainer.resume()`` and ``Trainer.save()`` on the trained trial dir. Anything unexpected (a failed
trial, a wrong precision or kernel choice, MFU missing or above 1, unequal hashes, over budget)
prints a line starting with ``FAIL``, and the check exits 1.

The deterministic trials run first: ``CUBLAS_WORKSPACE_CONFIG``, which the worker exports for
them, counts only before the process's first cuBLAS call. The later fast-path trials keep it
(``:4096:8`` is PyTorch's own default on Hopper).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peft
import torch
import transformers
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict  # noqa: E402
from hpcsweep.telemetry.cpu_sampler import ProcessTreeSampler  # noqa: E402
from hpcsweep.telemetry.node_sampler import NodeSampler  # noqa: E402
from hpcsweep.telemetry.sampler_thread import SamplerThread  # noqa: E402
from hpcsweep.telemetry.trial_telemetry import load_pynvml, open_gpus, torch_cuda_uuids  # noqa: E402
from hpcsweep.train import model as model_lib  # noqa: E402
from hpcsweep.train.distributed import destroy_distributed, init_distributed  # noqa: E402
from hpcsweep.train.trainer import Trainer  # noqa: E402
from hpcsweep.train.fault import STOP_REASON  # noqa: E402
from hpcsweep.train.observe.step_timer import PHASES as STEP_PHASES  # noqa: E402
from hpcsweep.train.worker import EXIT_OK, EXIT_STOPPED, run_trial  # noqa: E402
from tests.model_folders import TINY_DEEPSEEK, make_model_folder  # noqa: E402
from benchmarks.gpu_check_loss import loss_check, loss_line  # noqa: E402
from benchmarks.gpu_check_packing import packing_check, packing_lines  # noqa: E402

BUDGET_S = 600
"""The whole check, on one GPU: 10 minutes."""


LOSS_SIZES = {"tokens": 8192, "hidden": 2048, "vocab": 129_280, "chunk_tokens": None}
"""The loss check on a GPU: DeepSeek-V3's vocabulary, one 8k-token micro-batch (4.2 GB of fp32 logits), in
the chunks ``trainer.loss_chunk_tokens=null`` gives CUDA (512 here) and in 256-token ones."""
SMOKE_LOSS_SIZES = {"tokens": 96, "hidden": 16, "vocab": 500, "chunk_tokens": 32}


class CheckFailed(RuntimeError):
    """Something the check did not expect; the message says what."""


@dataclass(frozen=True)
class Size:
    """One model size and the batch it trains with."""

    label: str
    model: dict[str, Any]
    data: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """What to run: on a GPU, or tiny on CPU (``--smoke``)."""

    device: str
    small: Size
    large: Size
    max_steps: int
    log_every: int
    stop_at: int
    expect_precision: str
    expect_attention: tuple[str, ...]
    expect_mfu: bool
    lora_base: Size
    """The model folder a LoRA fine-tuning trains over."""
    telemetry_every_s: float
    """``trainer.telemetry_every_s`` of every trial: short, so that even the short trials have samples."""
    trainer: dict[str, Any] = field(default_factory=dict)


def model_group(name: str, **changes: Any) -> dict[str, Any]:
    """A model config group from configs/model, with ``changes``."""
    # A preset holds what differs from ModelConfig's defaults; deepseek_tiny is those defaults, an empty file.
    return {**(yaml.safe_load((REPO / "configs" / "model" / f"{name}.yaml").read_text()) or {}), **changes}


GPU_PLAN = Plan(
    device="cuda",
    small=Size("~125M", model_group("deepseek_125m"), {"seq_len": 2048, "batch_size": 8}),
    large=Size("~1B", model_group("deepseek_1b"), {"seq_len": 2048, "batch_size": 8}),
    max_steps=20,
    log_every=10,
    stop_at=10,
    expect_precision="bf16",
    expect_attention=("sdpa", "flash_attention_2"),
    expect_mfu=True,
    lora_base=Size("~1B", model_group("deepseek_1b"), {"seq_len": 2048, "batch_size": 8}),
    telemetry_every_s=0.2,
)
SMOKE_PLAN = Plan(
    device="cpu",
    small=Size("tiny", model_group("deepseek_tiny", hidden_size=64),
               {"seq_len": 32, "batch_size": 4, "synthetic_tokens": 20_000}),
    large=Size("tiny-x2", model_group("deepseek_tiny", num_layers=3),
               {"seq_len": 32, "batch_size": 4, "synthetic_tokens": 20_000}),
    max_steps=6,
    log_every=3,
    stop_at=3,
    expect_precision="fp32",
    expect_attention=("eager",),
    expect_mfu=False,
    lora_base=Size("tiny", model_group("deepseek_tiny"), {"seq_len": 32, "batch_size": 4, "synthetic_tokens": 20_000}),
    telemetry_every_s=0.05,
)


def write_trial(path: Path, plan: Plan, size: Size, deterministic: bool) -> Path:
    """A trial dir holding the validated ``config.yaml`` of ``size`` under ``plan``."""
    cfg = trial_config_from_dict({
        "model": size.model,
        "data": size.data,
        "trainer": {
            "device": plan.device,
            "deterministic": deterministic,
            "max_steps": plan.max_steps,
            "warmup_steps": 2,
            "log_every": plan.log_every,
            # Evaluate and save only at the end: the last logged window is training steps alone.
            "eval_every": plan.max_steps,
            "eval_batches": 1,
            "ckpt_every": 0,
            "keep_top_k": 0,
            "telemetry_every_s": plan.telemetry_every_s,
        },
    })
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(cfg), sort_keys=False))
    return path


TRAINED: dict[str, dict[str, Any]] = {}
"""Each trial dir's metrics.json as its last training left it, by the dir's name: the memory part
compares these (a later ``checkpoint_times`` opens a Trainer on the dir, which rewrites metrics.json)."""


def train(trial_dir: Path, *, stop_at: int | None = None) -> dict[str, Any]:
    """``run_trial`` on ``trial_dir`` (optionally stopped after ``stop_at`` steps); its metrics.json."""
    if stop_at is not None:
        # A stop request after that step, as a stop signal makes one (once per trial dir).
        os.environ["HPCSWEEP_FAULT"] = f"stop,step={stop_at},rank=0"
    try:
        code = run_trial(trial_dir)
    finally:
        os.environ.pop("HPCSWEEP_FAULT", None)
    metrics = json.loads((trial_dir / "metrics.json").read_text())
    TRAINED[trial_dir.name] = metrics
    expected = EXIT_OK if stop_at is None else EXIT_STOPPED
    if code != expected:
        raise CheckFailed(f"{trial_dir.name}: run_trial exited {code}, not {expected}: {metrics.get('error')}")
    return metrics


def check_run(name: str, metrics: dict[str, Any], plan: Plan, deterministic: bool) -> None:
    """The trial completed, with the choices the plan expects and a plausible MFU."""
    expected = {"status": "completed", "step": plan.max_steps, "precision": plan.expect_precision,
                "deterministic": deterministic}
    wrong = {k: metrics.get(k) for k, v in expected.items() if metrics.get(k) != v}
    if wrong:
        raise CheckFailed(f"{name}: expected {expected}, metrics.json has {wrong}")
    if metrics.get("attn_implementation") not in plan.expect_attention:
        raise CheckFailed(f"{name}: attention {metrics.get('attn_implementation')!r}, expected one of "
                          f"{plan.expect_attention}")
    if not metrics.get("tokens_per_s", 0) > 0:
        raise CheckFailed(f"{name}: no throughput in metrics.json: {metrics.get('tokens_per_s')!r}")
    mfu = metrics.get("mfu")
    if plan.expect_mfu and not (mfu is not None and 0 < mfu < 1):
        raise CheckFailed(f"{name}: MFU {mfu!r} on {metrics.get('device_name')!r}: expected 0 < MFU < 1 "
                          "(None: the device is missing from hpcsweep/train/trackers/metrics.py GPU_PEAKS)")
    if not plan.expect_mfu and mfu is not None:
        raise CheckFailed(f"{name}: MFU {mfu!r} on CPU, where there is no peak to divide by")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_gpu_memory(plan: Plan) -> None:
    """Give the last trial's cached GPU memory back before a bigger model needs it."""
    gc.collect()
    if plan.device == "cuda":
        torch.cuda.empty_cache()


def checkpoint_times(trial_dir: Path) -> dict[str, float]:
    """Seconds for ``Trainer.resume()`` and ``Trainer.save()`` of a trained trial's state, and its size."""
    cfg = trial_config_from_dict(yaml.safe_load((trial_dir / "config.yaml").read_text()))
    world = init_distributed(cfg.trainer.device, cfg.nccl.pg_timeout_s)
    trainer = Trainer(cfg, world, trial_dir)
    try:
        start = time.perf_counter()
        if not trainer.resume():
            raise CheckFailed(f"{trial_dir.name}: no checkpoint to resume from")
        synchronize(world.device)
        resume_s = time.perf_counter() - start
        start = time.perf_counter()
        # The same step and status: it replaces the final checkpoint. Timed until it is durable on disk.
        trainer.save("completed", wait=True)
        synchronize(world.device)
        save_s = time.perf_counter() - start
    finally:
        trainer.close()
        destroy_distributed(world)
    size = sum(p.stat().st_size for p in (trial_dir / "checkpoints").rglob("*") if p.is_file())
    return {"resume_s": resume_s, "save_s": save_s, "checkpoint_gb": size / 1e9}


def parameters(size: Size) -> int:
    cfg = trial_config_from_dict({"model": size.model}).model
    with torch.device("meta"):
        return sum(p.numel() for p in model_lib.build_model(cfg, seed=0).parameters())


MEMORY_BAND = (1.0, 1.5)
"""On a GPU the plan's tensors (``memory_plan.tensors_bytes``) must lie within these multiples of the
measured ``torch.cuda.max_memory_allocated``: never below it, at most 1.5x above."""


def memory_plan_checks(plan: Plan, trials: list[tuple[Size, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The memory plan against the measured peak of each trial; on CPU informational (the resident
    set also holds the interpreter and every library), on a GPU within ``MEMORY_BAND``."""
    rows = []
    for size, metrics in trials:
        estimate, peak = metrics.get("memory_plan") or {}, metrics.get("memory_peak") or {}
        if not estimate.get("tensors_bytes") or not peak.get("bytes"):
            raise CheckFailed(f"{size.label}: metrics.json lacks memory_plan or memory_peak: {estimate!r}, {peak!r}")
        ratio = estimate["tensors_bytes"] / peak["bytes"]
        if plan.device == "cuda" and not MEMORY_BAND[0] <= ratio <= MEMORY_BAND[1]:
            raise CheckFailed(f"{size.label}: memory plan {estimate['tensors_bytes'] / 2**30:.2f} GB is x{ratio:.2f} "
                              f"the measured peak {peak['bytes'] / 2**30:.2f} GB ({peak['source']}); allowed "
                              f"x{MEMORY_BAND[0]}..x{MEMORY_BAND[1]}: fix hpcsweep/memory_plan/plan.py")
        rows.append({"size": size.label, "plan_bytes": estimate["tensors_bytes"], "total_bytes": estimate["total_bytes"],
                     "peak_bytes": peak["bytes"], "peak_source": peak["source"], "ratio": ratio,
                     "compared": plan.device == "cuda", "parts": estimate["bytes"]})
    return rows


def trial_metrics(trial_dir: Path) -> dict[str, Any]:
    """A trial's metrics.json, as it ended."""
    return json.loads((trial_dir / "metrics.json").read_text())


def memory_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One printed line per trial: the plan's tensors against the measured peak."""
    return [
        f"memory {row['size']:>8}: plan {row['plan_bytes'] / 2**30:.2f} GB of tensors "
        f"({row['total_bytes'] / 2**30:.2f} GB with overhead) vs measured {row['peak_bytes'] / 2**30:.2f} GB "
        f"({row['peak_source']}): x{row['ratio']:.2f}"
        + (f" OK (allowed x{MEMORY_BAND[0]}..x{MEMORY_BAND[1]})" if row["compared"] else
           " (CPU: the resident set counts the whole process; not compared)")
        for row in rows
    ]


def fsdp_check(plan: Plan, workdir: Path, ddp_metrics: dict[str, Any]) -> dict[str, Any]:
    """The large model as an FSDP trial on the one device; its speed against the DDP trial's."""
    trial = write_trial(workdir / "large-fsdp", plan, plan.large, deterministic=False)
    config = yaml.safe_load((trial / "config.yaml").read_text())
    config["trainer"]["parallel"] = "fsdp"
    (trial / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(trial_config_from_dict(config)), sort_keys=False))
    release_gpu_memory(plan)
    metrics = train(trial)
    drop_checkpoints(trial)
    check_run("large, FSDP", metrics, plan, False)
    if metrics.get("parallel") != "fsdp":
        raise CheckFailed(f"large, FSDP: metrics.json says parallel={metrics.get('parallel')!r}, not 'fsdp'")
    return {"size": plan.large.label, "tokens_per_s": metrics["tokens_per_s"], "mfu": metrics.get("mfu"),
            "ratio_to_ddp": metrics["tokens_per_s"] / ddp_metrics["tokens_per_s"]}


def fsdp_line(fsdp: dict[str, Any]) -> str:
    mfu = "n/a" if fsdp["mfu"] is None else f"{fsdp['mfu']:.1%}"
    return (f"FSDP ({fsdp['size']}, trainer.parallel=fsdp over one rank): {fsdp['tokens_per_s']:.0f} tokens/s, "
            f"MFU {mfu}, x{fsdp['ratio_to_ddp']:.2f} the DDP trial's tokens/s")


MATMUL_S = 3.0
"""How long the matmul loop runs while NVML samples the GPU."""
MATMUL_SAMPLE_S = 0.25
"""Its sampling interval: a dozen samples; NVML's utilisation counts over its last 1/6 to 1 s."""
SAMPLE_COST_ROUNDS = 50


def trial_telemetry_check(plan: Plan, name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The trial's ``telemetry``: NVML with a utilisation for every GPU on a GPU, the CPU sampler on CPU."""
    telemetry = metrics.get("telemetry")
    if not telemetry:
        raise CheckFailed(f"{name}: metrics.json has no telemetry")
    if plan.device == "cuda":
        if telemetry["source"] != "nvml" or not telemetry["gpus"]:
            raise CheckFailed(f"{name}: telemetry source {telemetry['source']!r} with {len(telemetry['gpus'])} GPUs, "
                              f"not NVML: {telemetry['reason']}")
        null = [(gpu["index"], gpu["reasons"].get("util_pct"), gpu["lost"]) for gpu in telemetry["gpus"]
                if gpu["util_pct"] is None]
        if null:
            raise CheckFailed(f"{name}: GPU utilisation is null in metrics.json's telemetry (index, reason, lost): {null}")
    elif telemetry["source"] != "cpu" or not telemetry["reason"]:
        raise CheckFailed(f"{name}: on CPU telemetry must come from the CPU sampler with its reason: {telemetry}")
    return telemetry


def nvml_matmul_check(plan: Plan) -> dict[str, Any]:
    """Real pynvml sampling GPU 0 through the trainer's sampler and thread during a matmul loop; the cost
    of one sample. FAILs if NVML does not start or the utilisation is null or 0 under the loop."""
    if plan.device != "cuda":
        return {"skipped": "no GPU (--smoke): NVML is proved by a run on a GPU"}
    gpus, reason = open_gpus(load_pynvml, torch_cuda_uuids(1))
    if gpus is None:
        raise CheckFailed(f"NVML: {reason}")
    node = NodeSampler("gpu_check", gpus, None, ProcessTreeSampler([os.getpid()]))
    thread = SamplerThread(node.sample, MATMUL_SAMPLE_S)
    try:
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        thread.start()
        start = time.perf_counter()
        while time.perf_counter() - start < MATMUL_S:
            for _ in range(10):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()
        thread.stop()
        result = node.summary()
        start = time.perf_counter()
        for _ in range(SAMPLE_COST_ROUNDS):
            node.sample()
        sample_ms = (time.perf_counter() - start) / SAMPLE_COST_ROUNDS * 1e3
    finally:
        thread.stop()
        node.close()
    if thread.error:
        raise CheckFailed(f"NVML sampling failed: {thread.error}")
    gpu = result["gpus"][0]
    if gpu["util_pct"] is None or gpu["util_pct"]["max"] == 0:
        raise CheckFailed(f"NVML utilisation {gpu['util_pct']!r} during a matmul loop ({result['samples']} samples): "
                          f"{gpu['reasons'].get('util_pct')} {gpu['lost'] or ''}")
    return {"samples": result["samples"], "gpu": gpu, "sample_ms": sample_ms}


def stats_text(stats: dict[str, float] | None, unit: str, digits: int = 0) -> str:
    if stats is None:
        return "null"
    return f"{stats['mean']:.{digits}f}{unit} (p5 {stats['p5']:.{digits}f}, max {stats['max']:.{digits}f})"


def telemetry_lines(telemetry: dict[str, Any]) -> list[str]:
    """What the trial's telemetry and the matmul loop's NVML samples say, one line each."""
    trial, matmul = telemetry["trial"], telemetry["matmul"]
    lines = [f"telemetry of the large trial: source {trial['source']}"
             + (f" ({trial['reason']})" if trial["reason"] else "") + f", {trial['samples']} samples every "
             f"{trial['interval_s']} s; CPU {stats_text(trial['cpu']['util_pct'], '%')}, "
             f"RSS {stats_text(trial['cpu']['rss_gb'], ' GB', 2)}"]
    lines += [f"  GPU{gpu['index']} {gpu['name']}: util {stats_text(gpu['util_pct'], '%')}, energy {gpu['energy_j']} J"
              for gpu in trial["gpus"]]
    if "skipped" in matmul:
        return [*lines, f"NVML samples during a matmul loop: skipped: {matmul['skipped']}"]
    gpu = matmul["gpu"]
    gpm = {key: stats_text(gpu[key], "%") if gpu[key] else f"null ({gpu['reasons'][key]})"
           for key in ("sm_active_pct", "tensor_active_pct")}
    return [*lines, f"NVML samples during a matmul loop ({matmul['samples']} samples, {gpu['name']}): util "
            f"{stats_text(gpu['util_pct'], '%')}, memory {stats_text(gpu['mem_used_gb'], ' GB', 1)} of "
            f"{gpu['mem_total_gb']:.0f} GB, power {stats_text(gpu['power_w'], ' W')}, SM clock "
            f"{stats_text(gpu['sm_clock_mhz'], ' MHz')}, SM active {gpm['sm_active_pct']}, tensor active "
            f"{gpm['tensor_active_pct']}, energy {gpu['energy_j']} J; one sample {matmul['sample_ms']:.2f} ms"]
PROFILED_STEPS = (2, 3)


def profile_check(plan: Plan, workdir: Path) -> dict[str, Any]:
    """The small model with ``trainer.profile_steps`` and ``profile_memory``: a Perfetto trace of exactly
    those steps, with CUDA kernels and a CUDA allocator snapshot on a GPU."""
    trial = write_trial(workdir / "small-profiled", plan, plan.small, deterministic=False)
    config = yaml.safe_load((trial / "config.yaml").read_text())
    config["trainer"].update(profile_steps=list(PROFILED_STEPS), profile_memory=True)
    (trial / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(trial_config_from_dict(config)), sort_keys=False))
    release_gpu_memory(plan)
    metrics = train(trial)
    drop_checkpoints(trial)
    start, end = PROFILED_STEPS
    if (metrics.get("profile") or {}).get("steps") != [start, end]:
        raise CheckFailed(f"profile: metrics.json has profile {metrics.get('profile')!r}, not steps {start}-{end}")
    trace = trial / metrics["profile"]["traces"][0]
    events = json.loads(trace.read_text())["traceEvents"]
    labels = sorted({e["name"] for e in events if e.get("ph") == "X" and e["name"].startswith("step ")})
    kernels = sum(e.get("cat") == "kernel" for e in events)
    if labels != [f"step {n}" for n in range(start, end + 1)]:
        raise CheckFailed(f"profile: the trace labels {labels}, not steps {start}-{end}")
    snapshots = metrics["profile"].get("memory_snapshots", [])
    if plan.device == "cuda":
        if not kernels:
            raise CheckFailed(f"profile: no CUDA kernel in {trace}: the profiler did not record the GPU")
        if not snapshots or "segments" not in pickle.loads((trial / snapshots[0]).read_bytes()):
            raise CheckFailed(f"profile: no CUDA memory snapshot with segments: {snapshots!r}")
    return {"steps": [start, end], "trace_mb": trace.stat().st_size / 1e6, "events": len(events), "kernels": kernels,
            "memory_snapshot_mb": (trial / snapshots[0]).stat().st_size / 1e6 if snapshots else None}


def profile_line(profile: dict[str, Any]) -> str:
    snapshot = "none (CPU)" if profile["memory_snapshot_mb"] is None else f"{profile['memory_snapshot_mb']:.1f} MB"
    return (f"profile of steps {profile['steps'][0]}-{profile['steps'][1]} (trainer.profile_steps, profile_memory): "
            f"trace {profile['trace_mb']:.1f} MB, {profile['events']} events, {profile['kernels']} CUDA kernels; "
            f"memory snapshot {snapshot} OK")


CONFIG_JSON_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
    "max_position_embeddings": "max_position_embeddings", "n_routed_experts": "n_routed_experts",
    "num_experts_per_tok": "num_experts_per_tok", "n_shared_experts": "n_shared_experts",
    "moe_intermediate_size": "moe_intermediate_size", "first_k_dense_replace": "first_k_dense_replace",
    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
    "qk_nope_head_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim",
}
"""``model.*`` key -> the config.json field of a DeepSeek-V3 folder it is read from."""


def folder_model_keys(folder: Path) -> dict[str, Any]:
    """The ``model.*`` keys that build a DeepSeek-V3 folder's architecture (its config.json)."""
    config = json.loads((folder / "config.json").read_text())
    return {key: config[name] for key, name in CONFIG_JSON_KEYS.items()}


def save_model_folder(path: Path, size: Size) -> Path:
    """``size``'s model saved with ``save_pretrained`` (and a trained tokenizer) at ``path``."""
    hf = model_lib.hf_config(trial_config_from_dict({"model": size.model}).model)
    return make_model_folder(path, **{key: getattr(hf, key) for key in TINY_DEEPSEEK})


def run_lora_check(plan: Plan, workdir: Path) -> dict[str, Any]:
    """A LoRA fine-tuning over the plan's saved folder: tokens/s, MFU over the frozen base, peak memory."""
    folder = save_model_folder(workdir / "lora-base-folder", plan.lora_base)
    size = Size(plan.lora_base.label, {**plan.lora_base.model, **folder_model_keys(folder), "peft": "lora"},
                plan.lora_base.data)
    trial = write_trial(workdir / "lora-fast", plan, size, deterministic=False)
    release_gpu_memory(plan)
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    metrics = train(trial)
    check_run("LoRA", metrics, plan, False)
    peak = torch.cuda.max_memory_allocated() / 2**30 if plan.device == "cuda" else None
    checkpoint_gb = sum(p.stat().st_size for p in (trial / "checkpoints").rglob("*") if p.is_file()) / 1e9
    drop_checkpoints(trial)
    if not metrics.get("router"):
        raise CheckFailed("LoRA over a MoE folder: metrics.json has no router statistics")
    return {"size": size.label, "parameters": parameters(size), "tokens": size.data,
            "tokens_per_s": metrics["tokens_per_s"], "mfu": metrics.get("mfu"), "peak_memory_gib": peak,
            "checkpoint_gb": checkpoint_gb, "router": metrics["router"]}


SLOW_DATA_MS = 100
"""The slow-data trial's ``data.read_delay_ms``: several times a ~125M step on one GPU."""
SLOW_DATA_SKIPPED = "CPU: it proves the CUDA events; the host clock's view is proved by tests/unit/test_step_timer.py"


def step_time_phases(window: dict[str, Any]) -> str:
    """A window's phases in words: ``data 1.0%, compute 80.2%, ...``."""
    other = 100 * window["other_s"] / window["seconds"] if window["seconds"] else 0.0
    phases = ", ".join(f"{phase} {window[f'{phase}_pct']:.1f}%" for phase in STEP_PHASES)
    return f"{phases}, other {other:.1f}%"


def step_time_check(plan: Plan, workdir: Path, fast_metrics: dict[str, Any]) -> dict[str, Any]:
    """The fast trial's ``step_time`` adds up; on a GPU a slow-data trial's events show the GPU waiting on data."""
    window = fast_metrics.get("step_time")
    if not window or not fast_metrics.get("step_time_total"):
        raise CheckFailed(f"fast path: metrics.json lacks step_time or step_time_total: {window!r}")
    total_pct = sum(window[f"{phase}_pct"] for phase in STEP_PHASES) + 100 * window["other_s"] / window["seconds"]
    source = "cuda" if plan.device == "cuda" else "rss"
    if abs(total_pct - 100) > 0.5 or window["steps"] != plan.log_every or not window["compute_s"] > 0:
        raise CheckFailed(f"fast path: step_time does not add up over its {plan.log_every} steps: {window!r}")
    if window["peak_memory_source"] != source:
        raise CheckFailed(f"fast path: step_time peak memory from {window['peak_memory_source']!r}, not {source!r}")
    if window["peak_memory_gb"] * 2**30 > fast_metrics["memory_peak"]["bytes"]:
        raise CheckFailed(f"fast path: a window's peak {window['peak_memory_gb']:.2f} GiB is above the trial's "
                          f"memory_peak {fast_metrics['memory_peak']['bytes'] / 2**30:.2f} GiB")
    if plan.device != "cuda":
        return {"fast": window, "slow_data": None, "slow_data_skipped": SLOW_DATA_SKIPPED}
    one_window = dataclasses.replace(plan, max_steps=plan.log_every)
    slow_size = Size(plan.small.label, plan.small.model, {**plan.small.data, "read_delay_ms": SLOW_DATA_MS})
    release_gpu_memory(plan)
    slow = train(write_trial(workdir / "small-slow-data", one_window, slow_size, deterministic=False))
    drop_checkpoints(workdir / "small-slow-data")
    check_run("slow data", slow, one_window, False)
    slow_window = slow.get("step_time") or {}
    waited_s = plan.log_every * SLOW_DATA_MS / 1000
    # The events of the data phase bracket the read on the GPU's stream: the GPU idles through it.
    if not (slow_window.get("data_s", 0) >= 0.9 * waited_s and slow_window.get("data_pct", 0) > 50):
        raise CheckFailed(f"slow data: {plan.log_every} reads of {SLOW_DATA_MS} ms show as "
                          f"{slow_window.get('data_s')!r} s of data wait ({slow_window.get('data_pct')!r}%), "
                          f"expected >= {0.9 * waited_s:.2f} s and > 50%")
    if not window["data_pct"] < 25:
        raise CheckFailed(f"fast path: {window['data_pct']:.1f}% of a GPU step waits on the synthetic corpus")
    return {"fast": window, "slow_data": slow_window, "slow_data_skipped": None}


def step_time_lines(step_time: dict[str, Any]) -> list[str]:
    """The printed lines of ``step_time_check``."""
    fast = step_time["fast"]
    lines = [f"step time (fast path, last window of {fast['steps']} steps, {fast['seconds']:.2f} s): "
             f"{step_time_phases(fast)}; peak memory {fast['peak_memory_gb']:.2f} GiB ({fast['peak_memory_source']}) OK"]
    slow = step_time["slow_data"]
    if slow is None:
        lines.append(f"step time, slow data (data.read_delay_ms={SLOW_DATA_MS}): SKIPPED on {step_time['slow_data_skipped']}")
    else:
        lines.append(f"step time, slow data (data.read_delay_ms={SLOW_DATA_MS}, {slow['steps']} steps): "
                     f"{slow['data_s']:.2f} s waiting on data; {step_time_phases(slow)} OK")
    return lines


def drop_checkpoints(trial_dir: Path) -> None:
    """Delete a trial's checkpoints once the check has used them: the ~1B trials' full states (weights,
    AdamW, RNG) are tens of GB each, and a GPU node's scratch disk is not."""
    shutil.rmtree(trial_dir / "checkpoints", ignore_errors=True)


class Sections:
    """The check's parts, run in order, each printing its lines as soon as it is done. A part that fails
    prints ``FAIL <part>: <why>`` and the rest still run: one GPU run must show everything it can."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.result: dict[str, Any] = {}
        self.failed: list[str] = []

    def run(self, name: str, part, lines=None) -> Any:
        print(f"[{time.perf_counter() - self.start:5.0f} s] {name}", file=sys.stderr, flush=True)
        try:
            value = part()
        except CheckFailed as err:
            return self._fail(name, str(err))
        except Exception as err:  # noqa: BLE001  (a CUDA error or a bug in one part must not hide the others)
            traceback.print_exc()
            return self._fail(name, f"{type(err).__name__}: {err}")
        self.result[name] = value
        if lines is not None:
            print("\n".join(lines(value)), flush=True)
        return value

    def _fail(self, name: str, why: str) -> None:
        self.failed.append(name)
        print(f"FAIL {name}: {why}", file=sys.stderr, flush=True)
        return None


def size_row(size: Size, trial: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """One model size's speed and checkpoint times (the trial's checkpoints are dropped afterwards)."""
    row = {"size": size.label, "parameters": parameters(size), "tokens": size.data,
           **{k: metrics.get(k) for k in ("precision", "tf32", "attn_implementation", "tokens_per_s", "mfu")},
           **checkpoint_times(trial)}
    drop_checkpoints(trial)
    return row


def size_line(row: dict[str, Any]) -> str:
    mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
    return (f"{row['size']:>8} ({row['parameters'] / 1e6:.1f}M params, batch {row['tokens']['batch_size']}x"
            f"{row['tokens']['seq_len']}, {row['precision']}, tf32={row['tf32']}, {row['attn_implementation']}): "
            f"{row['tokens_per_s']:.0f} tokens/s, MFU {mfu}; checkpoint {row['checkpoint_gb']:.2f} GB: "
            f"save {row['save_s']:.2f} s, resume {row['resume_s']:.2f} s (warm page cache)")


def exact_resume_check(plan: Plan, workdir: Path) -> dict[str, Any]:
    """The deterministic trial straight through, and the same trial stopped halfway and resumed: equal weights."""
    det = write_trial(workdir / "small-deterministic", plan, plan.small, deterministic=True)
    resumed = write_trial(workdir / "small-deterministic-resumed", plan, plan.small, deterministic=True)
    straight = train(det)
    check_run("deterministic", straight, plan, True)
    stopped = train(resumed, stop_at=plan.stop_at)
    if stopped.get("step") != plan.stop_at or stopped.get("last_stop_reason") != STOP_REASON:
        raise CheckFailed(f"stop at step {plan.stop_at}: metrics.json has step {stopped.get('step')}, "
                          f"reason {stopped.get('last_stop_reason')!r}")
    after = train(resumed)
    check_run("deterministic, resumed", after, plan, True)
    drop_checkpoints(det)
    drop_checkpoints(resumed)
    if after.get("restarts") != 1:
        raise CheckFailed(f"the resumed trial records {after.get('restarts')} restarts, not 1")
    if after["weights_sha256"] != straight["weights_sha256"]:
        raise CheckFailed(f"stop and resume is not exact: {after['weights_sha256']} after a resume at step "
                          f"{plan.stop_at}, {straight['weights_sha256']} straight through")
    return {"stop_at": plan.stop_at, "max_steps": plan.max_steps, "straight": straight["weights_sha256"],
            "resumed": after["weights_sha256"], "tokens_per_s": straight["tokens_per_s"]}


def exact_resume_lines(exact: dict[str, Any]) -> list[str]:
    return [f"exact stop and resume (deterministic=true, stop at {exact['stop_at']} of {exact['max_steps']}): "
            f"weights sha256 equal: {exact['resumed'][:16]}... OK"]


def fast_path_lines(fast: dict[str, Any]) -> list[str]:
    return [f"fast path (deterministic=false): {fast['fast_tokens_per_s']:.0f} tokens/s vs "
            f"{fast['deterministic_tokens_per_s']:.0f} deterministic: x{fast['ratio']:.2f}; "
            f"same weights as deterministic: {fast['same_weights']}"]


def lora_lines(lora: dict[str, Any]) -> list[str]:
    mfu = "n/a" if lora["mfu"] is None else f"{lora['mfu']:.1%}"
    peak = "n/a" if lora["peak_memory_gib"] is None else f"{lora['peak_memory_gib']:.1f} GiB"
    router = lora["router"] or {}
    return [f"LoRA fine-tuning of a saved {lora['size']} folder ({lora['parameters'] / 1e6:.1f}M params, batch "
            f"{lora['tokens']['batch_size']}x{lora['tokens']['seq_len']}): {lora['tokens_per_s']:.0f} tokens/s, "
            f"MFU {mfu} (over the frozen base's forward and backward), peak memory {peak}; "
            f"checkpoint {lora['checkpoint_gb'] * 1e3:.1f} MB; router max/mean load "
            f"{router.get('max_mean_load')}, idle experts {router.get('idle_fraction')}"]


def full_finetune_check(plan: Plan, workdir: Path, lora: dict[str, Any] | None) -> dict[str, Any]:
    """Full fine-tuning of the LoRA check's folder, the same batches: LoRA's speed and memory over it."""
    folder = workdir / "lora-base-folder"
    if not (folder / "config.json").is_file():
        raise CheckFailed("the LoRA check saved no model folder to fine-tune")
    size = Size(plan.lora_base.label, {**plan.lora_base.model, **folder_model_keys(folder), "peft": "none"},
                plan.lora_base.data)
    trial = write_trial(workdir / "full-finetune", plan, size, deterministic=False)
    release_gpu_memory(plan)
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    metrics = train(trial)
    check_run("full fine-tuning", metrics, plan, False)
    drop_checkpoints(trial)
    if not metrics.get("router"):
        raise CheckFailed("full fine-tuning of a MoE folder: metrics.json has no router statistics")
    peak = torch.cuda.max_memory_allocated() / 2**30 if plan.device == "cuda" else None
    return {"size": size.label, "tokens_per_s": metrics["tokens_per_s"], "mfu": metrics.get("mfu"),
            "peak_memory_gib": peak, "router": metrics["router"],
            "lora_speedup": None if lora is None else lora["tokens_per_s"] / metrics["tokens_per_s"],
            "lora_memory": None if lora is None or peak is None else lora["peak_memory_gib"] / peak}


def full_finetune_lines(full: dict[str, Any]) -> list[str]:
    mfu = "n/a" if full["mfu"] is None else f"{full['mfu']:.1%}"
    peak = "n/a" if full["peak_memory_gib"] is None else f"{full['peak_memory_gib']:.1f} GiB"
    ratios = ("" if full["lora_speedup"] is None else f"; LoRA/full tokens/s {full['lora_speedup']:.2f}"
              + ("" if full["lora_memory"] is None else f", peak memory {full['lora_memory']:.2f}"))
    return [f"full fine-tuning of the same {full['size']} folder: {full['tokens_per_s']:.0f} tokens/s, MFU {mfu}, "
            f"peak memory {peak}; router max/mean load {full['router'].get('max_mean_load')}{ratios}"]


MEMORY_RUNS = (
    ("small-deterministic", "small"), ("small-deterministic-resumed", "small"), ("small-fast", "small"),
    ("large-fast", "large"), ("large-fsdp", "large"), ("lora-fast", "lora_base"), ("full-finetune", "lora_base"),
    ("small-slow-data", "small"), ("small-profiled", "small"),
)
"""Every trial the check runs, by its dir, and the plan's size it trains: each one's plan against its peak."""


def memory_check(plan: Plan, sections: Sections) -> list[dict[str, Any]]:
    """The plan against the measured peak of every trial that completed, each row printed; the rows
    out of ``MEMORY_BAND`` on a GPU fail the part, after all are printed."""
    rows, wrong = [], []
    for name, size_key in MEMORY_RUNS:
        metrics = TRAINED.get(name)
        if metrics is None or metrics.get("status") != "completed":
            continue
        size = dataclasses.replace(getattr(plan, size_key), label=name)
        try:
            rows += memory_plan_checks(plan, [(size, metrics)])
        except CheckFailed as err:
            wrong.append(str(err))
            estimate, peak = metrics.get("memory_plan") or {}, metrics.get("memory_peak") or {}
            if estimate.get("tensors_bytes") and peak.get("bytes"):
                rows.append({"size": name, "plan_bytes": estimate["tensors_bytes"],
                             "total_bytes": estimate["total_bytes"], "peak_bytes": peak["bytes"],
                             "peak_source": peak["source"], "ratio": estimate["tensors_bytes"] / peak["bytes"],
                             "compared": False, "out_of_band": True, "parts": estimate["bytes"]})
    print("\n".join(memory_lines(rows)), flush=True)
    sections.result["memory"] = rows
    if wrong:
        raise CheckFailed("; ".join(wrong))
    return rows


def run_checks(plan: Plan, workdir: Path, start: float | None = None) -> Sections:
    """Every part of the plan, checked and printed in turn; ``Sections`` holds the numbers and what failed."""
    sections = Sections(time.perf_counter() if start is None else start)
    run = sections.run
    print(f"device {torch.cuda.get_device_name() if plan.device == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, transformers {transformers.__version__}, peft {peft.__version__}", flush=True)
    exact = run("exact_resume", lambda: exact_resume_check(plan, workdir), exact_resume_lines)

    fast = write_trial(workdir / "small-fast", plan, plan.small, deterministic=False)
    large = write_trial(workdir / "large-fast", plan, plan.large, deterministic=False)

    def train_checked(trial: Path, name: str) -> dict[str, Any]:
        release_gpu_memory(plan)
        metrics = train(trial)
        check_run(name, metrics, plan, False)
        return metrics

    fast_metrics = run("fast", lambda: train_checked(fast, "fast path"))
    if exact is not None and fast_metrics is not None:
        run("fast_path", lambda: {"deterministic_tokens_per_s": exact["tokens_per_s"],
                                  "fast_tokens_per_s": fast_metrics["tokens_per_s"],
                                  "ratio": fast_metrics["tokens_per_s"] / exact["tokens_per_s"],
                                  "same_weights": fast_metrics["weights_sha256"] == exact["straight"]},
            fast_path_lines)
    large_metrics = run("large", lambda: train_checked(large, "large"))
    rows = []
    for size, trial, metrics in ((plan.small, fast, fast_metrics), (plan.large, large, large_metrics)):
        if metrics is not None:
            row = run(f"size {size.label}", lambda: size_row(size, trial, metrics), lambda r: [size_line(r)])
            rows += [row] if row is not None else []
    sections.result["sizes"] = rows
    lora = run("lora", lambda: run_lora_check(plan, workdir), lora_lines)
    if large_metrics is not None:
        run("fsdp", lambda: fsdp_check(plan, workdir, large_metrics), lambda f: [fsdp_line(f)])
        run("telemetry", lambda: {"trial": trial_telemetry_check(plan, "large", large_metrics),
                                  "matmul": nvml_matmul_check(plan)}, telemetry_lines)
    if fast_metrics is not None:
        run("step_time", lambda: step_time_check(plan, workdir, fast_metrics), step_time_lines)
    run("profile", lambda: profile_check(plan, workdir), lambda p: [profile_line(p)])

    def loss_part() -> dict[str, Any]:
        release_gpu_memory(plan)
        loss = loss_check(torch.device(plan.device), **(LOSS_SIZES if plan.device == "cuda" else SMOKE_LOSS_SIZES))
        if loss["failed"]:
            raise CheckFailed(loss_line(loss))
        return loss

    run("loss", loss_part, lambda loss: [loss_line(loss)])

    def packing_part() -> dict[str, Any]:
        release_gpu_memory(plan)
        packing = packing_check(torch.device(plan.device))
        if packing["failed"]:
            raise CheckFailed("; ".join(packing_lines(packing)))
        return packing

    run("packing", packing_part, packing_lines)
    run("full_finetune", lambda: full_finetune_check(plan, workdir, lora), full_finetune_lines)
    run("memory", lambda: memory_check(plan, sections))
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models on CPU, in seconds (CI)")
    parser.add_argument("--workdir", type=Path, help="where the trial dirs go (default: a temporary dir)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    if plan.device == "cuda" and not torch.cuda.is_available():
        print(f"FAIL: no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda}); "
              "use --smoke on a CPU machine", file=sys.stderr)
        return 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        sections = run_checks(plan, args.workdir or Path(tmp), start)
    elapsed = time.perf_counter() - start
    print(f"total {elapsed:.0f} s (budget {BUDGET_S} s)")
    if args.json:
        args.json.write_text(json.dumps({**sections.result, "failed": sections.failed, "elapsed_s": elapsed},
                                        indent=2, default=str))
    if sections.failed:
        print(f"FAIL: {len(sections.failed)} part(s) failed: {', '.join(sections.failed)}", file=sys.stderr)
        return 1
    if not args.smoke and elapsed > BUDGET_S:
        print(f"FAIL: took {elapsed:.0f} s, over the {BUDGET_S} s budget: shrink the plan", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
