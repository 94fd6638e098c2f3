"""GPU choices are pure functions of the device (name, compute capability) and the config.

No GPU is needed: devices are literal ``DeviceFacts``, as ``torch.cuda`` reports them on each part.
"""

from __future__ import annotations

import pytest
import torch

from hpcsweep.config import ModelConfig, TrainerConfig, trial_config_from_dict
from hpcsweep.train import gpu_choices
from hpcsweep.train.gpu_choices import DeviceFacts, GpuChoices
from hpcsweep.train.trackers.metrics import peak_flops
from hpcsweep.train.model import build_model
from hpcsweep.train.worker import EXIT_FAILED, run_trial

from .trial_dirs import make_trial_dir, read_metrics

CPU = DeviceFacts("cpu")
A100 = DeviceFacts("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
H100 = DeviceFacts("cuda", "NVIDIA H100 80GB HBM3", (9, 0))
H200 = DeviceFacts("cuda", "NVIDIA H200", (9, 0))
V100 = DeviceFacts("cuda", "Tesla V100-SXM2-32GB", (7, 0))
T4 = DeviceFacts("cuda", "Tesla T4", (7, 5))
ALLOCATED = {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.mark.parametrize(
    ("setting", "facts", "expected"),
    [
        ("auto", CPU, "fp32"),
        ("auto", A100, "bf16"),
        ("auto", H100, "bf16"),
        ("auto", H200, "bf16"),
        ("auto", V100, "fp32"),  # no bf16 tensor cores: fp32 unless asked
        ("auto", T4, "fp32"),
        ("fp16", V100, "fp16"),
        ("fp32", H100, "fp32"),
        ("bf16", CPU, "bf16"),  # CPU autocast supports bf16
    ],
)
def test_precision(setting, facts, expected):
    assert gpu_choices.resolve_precision(setting, facts) == expected


def test_bf16_on_a_gpu_without_bf16_names_the_key_the_gpu_and_the_way_out():
    with pytest.raises(ValueError, match=r"trainer.precision='bf16' is not allowed on Tesla V100-SXM2-32GB "
                                         r"\(compute capability 7.0\).*use fp16, fp32 or auto"):
        gpu_choices.resolve_precision("bf16", V100)


@pytest.mark.parametrize(
    ("setting", "facts", "expected"),
    [(True, A100, True), (True, H200, True), (False, H100, False), (True, CPU, False), (True, V100, False)],
)
def test_tf32_only_where_it_exists(setting, facts, expected):
    assert gpu_choices.resolve_tf32(setting, facts) is expected


@pytest.mark.parametrize(
    ("setting", "facts", "expected"),
    [("auto", CPU, True), ("auto", H100, False), (True, H100, True), (False, CPU, False)],
)
def test_determinism_is_a_choice_with_a_per_device_default(setting, facts, expected):
    assert gpu_choices.resolve_deterministic(setting, facts) is expected


@pytest.mark.parametrize(
    ("setting", "facts", "precision", "deterministic", "flash", "expected"),
    [
        ("auto", CPU, "fp32", True, False, "eager"),
        ("auto", CPU, "bf16", False, True, "eager"),
        ("auto", H100, "bf16", False, False, "sdpa"),
        ("auto", H100, "bf16", False, True, "flash_attention_2"),
        ("auto", H100, "bf16", True, True, "sdpa"),  # flash-attn's backward is not deterministic by default
        ("auto", V100, "fp32", False, True, "sdpa"),  # flash-attn runs in bf16/fp16 only
        ("eager", H100, "bf16", False, True, "eager"),
        ("sdpa", CPU, "fp32", True, False, "sdpa"),
        ("flash_attention_2", A100, "bf16", False, True, "flash_attention_2"),
    ],
)
def test_attention(setting, facts, precision, deterministic, flash, expected):
    chosen = gpu_choices.resolve_attention(
        setting, facts, precision=precision, deterministic=deterministic, flash_available=flash
    )
    assert chosen == expected


@pytest.mark.parametrize(
    ("facts", "precision", "flash", "problem"),
    [
        (CPU, "fp32", True, "it needs a CUDA device"),
        (H100, "bf16", False, "the flash_attn package is not installed"),
        (H100, "fp32", True, "it runs in bf16 or fp16, not fp32"),
    ],
)
def test_flash_attention_asked_for_where_it_cannot_run(facts, precision, flash, problem):
    with pytest.raises(ValueError, match=f"model.attn_implementation='flash_attention_2' is not allowed here: {problem}"):
        gpu_choices.resolve_attention(
            "flash_attention_2", facts, precision=precision, deterministic=False, flash_available=flash
        )


def test_the_defaults_on_each_device():
    trainer, model = TrainerConfig(), ModelConfig()
    assert gpu_choices.choose(trainer, model, CPU, flash_available=False) == GpuChoices("fp32", False, True, "eager")
    assert gpu_choices.choose(trainer, model, A100, flash_available=False) == GpuChoices("bf16", True, False, "sdpa")
    assert gpu_choices.choose(trainer, model, H100, flash_available=True) == GpuChoices(
        "bf16", True, False, "flash_attention_2"
    )
    exact = TrainerConfig(deterministic=True, tf32=False)
    assert gpu_choices.choose(exact, model, H200, flash_available=True) == GpuChoices("bf16", False, True, "sdpa")


def test_the_config_accepts_the_new_keys_and_names_the_allowed_values():
    cfg = trial_config_from_dict({"trainer": {"deterministic": True, "tf32": False, "precision": "auto"},
                                  "model": {"attn_implementation": "sdpa"}})
    assert (cfg.trainer.deterministic, cfg.trainer.tf32, cfg.model.attn_implementation) == (True, False, "sdpa")
    with pytest.raises(ValueError, match="trainer.deterministic='yes' is not allowed: true or false or one of 'auto'"):
        trial_config_from_dict({"trainer": {"deterministic": "yes"}})


def test_mfu_peak_follows_the_resolved_precision_and_tf32():
    # Each device's peak in what the defaults resolve to there (bf16), and in fp32 with TF32 on or off.
    for facts, bf16, tf32, fp32 in ((A100, 312e12, 156e12, 19.5e12), (H100, 989e12, 494.5e12, 67e12),
                                    (H200, 989e12, 494.5e12, 67e12)):
        choices = gpu_choices.choose(TrainerConfig(), ModelConfig(), facts, flash_available=False)
        assert peak_flops(facts.name, choices.precision, choices.tf32) == bf16
        assert peak_flops(facts.name, "fp32", True) == tf32
        assert peak_flops(facts.name, "fp32", False) == fp32
    assert peak_flops(V100.name, "fp32", False) is None  # unknown: MFU null, not a wrong number
    assert peak_flops(CPU.name, "fp32", False) is None


def test_ddp_searches_for_unused_parameters_only_where_needed():
    names = [name for name, _ in build_model(ModelConfig(), seed=0).named_parameters()]
    # transformers 5 holds a layer's experts in one tensor: every parameter gets a gradient.
    assert gpu_choices.find_unused_parameters(names) is False
    # One module per expert (transformers 4): an expert no token chose has no gradient.
    per_expert = ["model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.gate.weight"]
    assert gpu_choices.find_unused_parameters(per_expert) is True


@pytest.mark.parametrize(
    ("deterministic", "grad_comm", "find_unused", "expected"),
    [
        (True, "none", False, True),  # exact resume
        (False, "none", False, False),  # DDP's own layout, following the backward, overlaps best
        (False, "powersgd", False, True),  # its state is per bucket: no unused-parameter search for it (issue 31)
        (False, "bf16", False, False),  # a stateless hook
        (True, "powersgd", True, False),  # the search never rebuilds buckets: nothing to fix
    ],
)
def test_buckets_are_fixed_for_an_exact_resume_and_for_powersgd_unless_ddp_never_rebuilds_them(
        deterministic, grad_comm, find_unused, expected):
    chosen = gpu_choices.fixed_buckets(deterministic=deterministic, grad_comm=grad_comm, find_unused=find_unused)
    assert chosen is expected


@pytest.mark.parametrize(
    ("deterministic", "device_type", "env", "expected"),
    [
        (True, "cuda", {}, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
        (True, "cuda", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, {}),  # the user's own value stays
        (False, "cuda", {}, {}),
        (True, "cpu", {}, {}),
    ],
)
def test_cublas_workspace_for_deterministic_cuda(deterministic, device_type, env, expected):
    assert gpu_choices.cuda_env(deterministic, device_type, env) == expected


def test_backend_flags_are_set_both_ways():
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        gpu_choices.apply_backend_settings(GpuChoices("bf16", True, True, "sdpa"), "cuda")
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        gpu_choices.apply_backend_settings(GpuChoices("bf16", False, False, "sdpa"), "cuda")
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.use_deterministic_algorithms(saved[0])
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = saved[1:]


# ----- GPUs allocated but no CUDA visible ------------------------------------------------------


def refusal(env, *, cuda_available=False, torch_cuda_version=None, device_pref="auto"):
    return gpu_choices.gpu_allocation_error(
        env, cuda_available=cuda_available, torch_cuda_version=torch_cuda_version, device_pref=device_pref
    )


def test_a_cpu_build_of_torch_on_a_gpu_allocation_is_refused_with_the_fix():
    message = refusal(ALLOCATED)
    assert message.startswith("this task was given GPUs (SLURM_GPUS_ON_NODE=8), but CUDA is not available")
    assert "is a CPU-only build (torch.version.cuda is None): install a CUDA build of torch" in message
    assert "hydra.launcher.gpus_per_node=0" in message and "trainer.device=cpu" in message


def test_a_driver_problem_is_told_apart_from_a_cpu_build():
    message = refusal({"CUDA_VISIBLE_DEVICES": "0"}, torch_cuda_version="12.4")
    assert message.startswith("this task was given GPUs (CUDA_VISIBLE_DEVICES=0)")
    assert "built for CUDA 12.4 but finds no usable GPU: the NVIDIA driver is missing or older" in message
    assert "`nvidia-smi`" in message and "CPU-only" not in message


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": "-1"},
        {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "0"},
        {**ALLOCATED, "HPCSWEEP_DUMMY_GPUS": "1"},  # the local test cluster's GRES without hardware
    ],
)
def test_no_refusal_without_gpus_to_use(env):
    assert refusal(env) is None


def test_no_refusal_when_cuda_works_or_cpu_is_asked_for():
    assert refusal(ALLOCATED, cuda_available=True) is None
    assert refusal(ALLOCATED, device_pref="cpu") is None


def test_trainer_device_cuda_without_cuda_is_refused_even_on_dummy_gpus():
    message = refusal({"HPCSWEEP_DUMMY_GPUS": "1"}, device_pref="cuda", torch_cuda_version="12.4")
    assert message.startswith("trainer.device='cuda' asks for a GPU, but CUDA is not available")


def test_a_worker_given_gpus_it_cannot_use_fails_at_once_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a node with a CPU wheel
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.delenv("HPCSWEEP_DUMMY_GPUS", raising=False)
    for name, value in ALLOCATED.items():
        monkeypatch.setenv(name, value)
    trial = make_trial_dir(tmp_path / "trial", {"trainer.max_steps": 2})
    assert run_trial(trial) == EXIT_FAILED
    metrics = read_metrics(trial)
    assert metrics["status"] == "failed"
    assert "torch.version.cuda is None" in metrics["error"][0]
    assert not (trial / "checkpoints").exists()  # refused before anything was built


@pytest.mark.parametrize(
    ("setting", "facts", "flash", "own_code", "expected"),
    [
        ("auto", H100, True, False, "flash_attention_2"),  # variable-length sequences: no mask at all
        ("auto", H100, False, False, "sdpa"),  # a boolean mask
        ("auto", CPU, False, False, "eager"),
        ("auto", H100, True, True, "eager"),  # a folder's own code: its flash path reads only a padding mask
        ("eager", H100, True, True, "eager"),
    ],
)
def test_packed_rows_choose_a_kernel_that_keeps_samples_apart(setting, facts, flash, own_code, expected):
    chosen = gpu_choices.resolve_attention(setting, facts, precision="bf16", deterministic=False,
                                           flash_available=flash, packing=True, own_code=own_code)
    assert chosen == expected


def test_flash_attention_with_packing_on_a_folders_own_code_is_refused():
    with pytest.raises(ValueError, match=r"model.attn_implementation='flash_attention_2' is not allowed with "
                                         r"data.packing=true on a folder with its own model code"):
        gpu_choices.resolve_attention("flash_attention_2", H100, precision="bf16", deterministic=False,
                                      flash_available=True, packing=True, own_code=True)
    assert gpu_choices.resolve_attention("flash_attention_2", H100, precision="bf16", deterministic=False,
                                         flash_available=True, packing=False, own_code=True) == "flash_attention_2"
