"""``--help``, ``--cfg job`` and tab completion behave as Hydra users expect."""

from __future__ import annotations

import os
import subprocess
import sys
import time


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


def refused(args: list[str], cwd, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env={**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf", **(env or {})},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return result


def token_file(path, vocab_size: int, num_tokens: int):
    import numpy as np

    from hpcsweep.train.data.corpora import write_token_file

    write_token_file(path, np.arange(num_tokens) % vocab_size, vocab_size=vocab_size, tokenizer="toy")
    return path


def only_refusal_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of the output that is not the launcher's choice."""
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    refusals = [line for line in lines if "is not allowed" in line]
    assert len(refusals) == 1, lines
    return refusals[0]


def test_a_sweep_over_a_missing_token_file_names_the_path_typed_and_runs_nothing(tmp_path):
    result = refused(["-m", "data=file", "data.path=/no/such.bin", "model.lr=1e-4"], tmp_path)
    line = only_refusal_line(result)
    assert line.endswith("trial #0 (data=file data.path=/no/such.bin model.lr=0.0001): data.path='/no/such.bin' "
                         "is not allowed: no such token file; no trial was run"), line
    assert "such.json" not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_whose_corpus_outgrows_the_vocabulary_or_the_sequence_is_refused(tmp_path):
    token_file(tmp_path / "c173.bin", vocab_size=173, num_tokens=5000)
    line = only_refusal_line(refused(["-m", "data=file", "data.path=c173.bin", "model.vocab_size=100"], tmp_path))
    assert line.endswith("model.vocab_size=100 is not allowed: c173.bin needs at least 173 (its vocabulary); "
                         "no trial was run"), line
    line = only_refusal_line(refused(["-m", "data=file", "data.path=c173.bin", "data.seq_len=300"], tmp_path))
    assert "data.seq_len=300 is not allowed: at most 248: c173.bin holds 5000 tokens" in line, line
    line = only_refusal_line(refused(["-m", "data.seq_len=600"], tmp_path))
    assert "data.seq_len=600 is not allowed: at most model.max_position_embeddings=512" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c173.bin", "c173.json"]


def test_a_refused_single_run_is_one_plain_line_fast_and_leaves_no_folder(tmp_path):
    started = time.monotonic()
    result = refused(["model.lr=-3e-4"], tmp_path)
    new_s = time.monotonic() - started
    assert result.stdout == ""
    assert result.stderr == "model.lr=-0.0003 is not allowed: a learning rate > 0, e.g. 3e-4; the trial did not run\n"
    assert list(tmp_path.iterdir()) == []
    # The old way, measured side by side: Hydra sets up the run dir and the task function refuses.
    old = tmp_path / "old"
    old.mkdir()
    started = time.monotonic()
    old_way = subprocess.run(
        [sys.executable, "-c", "import sys; from hpcsweep.app import hydra_main; hydra_main()", "model.lr=-3e-4"],
        capture_output=True, text=True, timeout=120, cwd=old,
    )
    old_s = time.monotonic() - started
    assert old_way.returncode == 2 and list(old.glob("outputs/*/*/hpcsweep.log")), old_way.stderr
    assert new_s < 0.6 * old_s, (new_s, old_s)


def test_a_single_run_over_a_missing_token_file_is_refused_before_hydra(tmp_path):
    result = refused(["data=file", "data.path=no/such.bin"], tmp_path)
    assert result.stderr == "data.path='no/such.bin' is not allowed: no such token file; the trial did not run\n"
    assert list(tmp_path.iterdir()) == []


def test_what_only_hydra_can_answer_is_left_to_hydra(tmp_path):
    # A bad group choice gets Hydra's own list of options; --cfg job shows even a config the trial refuses.
    result = subprocess.run([sys.executable, "-m", "hpcsweep", "model=nosuch"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 1 and "Could not find 'model/nosuch'" in result.stderr
    assert "lr: -1.0" in hpcsweep("--cfg", "job", "model.lr=-1.0")


def test_a_misspelt_launcher_key_gets_the_closest_key_and_the_launcher_not_hydras_error(tmp_path):
    result = refused(["-m", "hydra.launcher.array_paralellism=8"], tmp_path)
    assert result.stderr.startswith("hydra.launcher.array_paralellism is not a key of the launcher; "
                                    "did you mean hydra.launcher.array_parallelism? (keys of the launcher: ")
    assert len(result.stderr.splitlines()) == 1 and "SlurmLauncherConf" not in result.stderr
    local = refused(["-m", "hydra/launcher=local", "hydra.launcher.local_paralelism=2"], tmp_path)
    assert local.stderr == ("hydra.launcher.local_paralelism is not a key of the local launcher; did you mean "
                            "hydra.launcher.local_parallelism? (keys of the local launcher: budget_gpu_hours, "
                            "local_parallelism, start_method)\n")
    assert list(tmp_path.iterdir()) == []
