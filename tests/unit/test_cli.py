"""``--help``, ``--cfg job`` and tab completion behave as Hydra users expect."""

from __future__ import annotations

import os
import subprocess
import sys


def hpcsweep(*args: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_help_lists_the_config_groups_and_the_sweep_usage():
    text = hpcsweep("--help")
    assert "python -m hpcsweep -m [overrides]" in text
    assert "model: deepseek_125m, deepseek_1b, deepseek_tiny, llama_small" in text
    assert "nccl: a100_ib, a100_roce, auto, ethernet, h100_ib, none" in text


def test_cfg_job_prints_the_composed_config_with_overrides():
    text = hpcsweep("--cfg", "job", "model=llama_small", "model.lr=0.0007")
    assert "arch: llama" in text and "lr: 0.0007" in text
    assert "hydra:" not in text


def test_bash_completion_offers_groups_and_keys():
    assert "model=llama_small" in hpcsweep("-sc", "query=bash", COMP_LINE="hpcsweep model=").split()
    assert "model.lr=" in hpcsweep("-sc", "query=bash", COMP_LINE="hpcsweep model.l").split()
