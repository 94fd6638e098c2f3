"""``data=chat`` on the real cluster: a LoRA sweep of a pretrained folder on conversations; the
preparation job renders them through the chat template into the cache, and the trials train on
packed rows of whole samples."""

from __future__ import annotations

import numpy as np

from tests.chat_fixtures import NAMED_TEMPLATE, random_conversations, write_chat_corpus
from tests.model_folders import make_model_folder

from .conftest import SMALL_TRIAL, read_json, run_hpcsweep, sacct_states, wait_for, wait_until_ended


def test_a_lora_chat_sweep_prepares_its_samples_in_a_job_and_trains_on_packed_rows(tmp_path, slurm_env):
    folder = make_model_folder(tmp_path / "small-deepseek")
    template = tmp_path / "qwen3.jinja"
    template.write_text(NAMED_TEMPLATE)
    write_chat_corpus(tmp_path / "sft" / "a.jsonl", random_conversations(48, words=(2, 10)))
    chat = [o for o in SMALL_TRIAL if not o.startswith("data.seq_len")] + [
        "model=pretrained", f"model.path={folder}", "model.peft=lora", "model.lora.r=4",
        "data=chat", f"data.files={tmp_path}/sft/*.jsonl", f"data.chat_template={template}", "data.seq_len=128"]
    result = run_hpcsweep(["-m", *chat, "model.lr=1e-3,3e-3"], tmp_path, slurm_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (sweep_file,) = tmp_path.glob("multirun/*/*/sweep.json")
    record = read_json(sweep_file)
    (array,) = record["arrays"]
    assert wait_until_ended(slurm_env, record["token_preparation"]["job_id"], timeout=300) == "COMPLETED"
    states = wait_for(lambda: (s := sacct_states(slurm_env, array["array_job_id"])) and len(s) == 2 and all(
        v.split()[0] in ("COMPLETED", "FAILED", "CANCELLED") for v in s.values()) and s, timeout=600,
        what="both trials to end")
    assert set(states.values()) == {"COMPLETED"}, states

    # The job wrote one chat entry: tokens, mask, offsets (48 samples), and a header that says so.
    (entry,) = (tmp_path / "multirun" / "token-cache").iterdir()
    assert record["token_preparation"]["entries"] == [str(entry)]
    header = read_json(entry / "tokens.json")
    assert header["kind"] == "chat" and header["samples"] == 48 and header["train_on"] == "assistant"
    offsets = np.fromfile(entry / "offsets.bin", dtype=np.int64)
    mask = np.fromfile(entry / "mask.bin", dtype=np.uint8)
    assert len(offsets) == 49 and offsets[-1] == header["num_tokens"] == len(mask) and 0 < mask.mean() < 1
    for trial in record["trials"]:
        metrics = read_json(tmp_path / trial["trial_dir"] / "metrics.json")
        assert metrics["status"] == "completed" and metrics["step"] == 8, metrics
        assert 0.5 < metrics["fill_rate"] <= 1.0 and np.isfinite(metrics["val_loss"]), metrics
