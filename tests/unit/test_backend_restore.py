"""A trial leaves torch's process-wide flags as it found them (issue 30, item 8).

The Trainer sets ``torch.use_deterministic_algorithms`` (true on CPU by default) for its trial; a
notebook, a test run or the next trial of a local sweep in the same process must get its own setting back.
"""

from __future__ import annotations

import pytest
import torch

from hpcsweep.train import gpu_choices
from hpcsweep.train.gpu_choices import GpuChoices
from hpcsweep.train.worker import run_trial

from .trial_dirs import make_trial_dir, read_metrics

TINY_TRIAL = {
    "data.batch_size": 2, "data.seq_len": 8, "data.synthetic_tokens": 2_000, "trainer.device": "cpu",
    "trainer.max_steps": 2, "trainer.warmup_steps": 0, "trainer.eval_every": 2, "trainer.eval_batches": 1,
    "trainer.ckpt_every": 0, "trainer.telemetry_every_s": 0,
}


@pytest.fixture
def deterministic_setting():
    """Sets the process's deterministic setting for a test, and puts the one before it back."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())

    def set_to(mode: bool, warn_only: bool = False) -> None:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)

    yield set_to
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


def current() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_restore_puts_back_what_apply_found(deterministic_setting, device_type):
    deterministic_setting(True, warn_only=True)
    cuda_before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                   torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        before = gpu_choices.apply_backend_settings(GpuChoices("fp32", True, False, "eager"), device_type)
        assert current() == (False, False)
        assert before.cuda_flags == (cuda_before if device_type == "cuda" else None)
        gpu_choices.restore_backend_settings(before)
        assert current() == (True, True)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == cuda_before
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = cuda_before


@pytest.mark.parametrize(("before", "trial_setting", "trial_ran_with"), [
    ((False, False), "auto", True),  # CPU's auto is deterministic: it must not outlive the trial
    ((True, True), False, False),
])
def test_a_trial_leaves_the_deterministic_setting_as_it_found_it(tmp_path, deterministic_setting, before,
                                                                 trial_setting, trial_ran_with):
    deterministic_setting(*before)
    trial = make_trial_dir(tmp_path / "t", {**TINY_TRIAL, "trainer.deterministic": trial_setting})
    assert run_trial(trial) == 0
    assert read_metrics(trial)["deterministic"] is trial_ran_with
    assert current() == before
