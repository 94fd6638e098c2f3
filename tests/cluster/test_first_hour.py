"""The fine-tuning path's first hour on the real local cluster (issue 31): mistakes refused before anything is
queued (sacct unchanged), a corpus too small for data.seq_len that only its exact count finds cancels the
trials with the reason in status, report and metrics.json and a non-zero status exit, and a completed
two-node train.sbatch job's log holds no stack trace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import (
    REPO,
    SMALL_TRIAL,
    all_job_ids,
    read_json,
    run_hpcsweep,
    slurm,
    submitted_from,
    wait_until_ended,
)
from .test_refused_requests import assert_refused, queued_job_ids


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """A model folder, its tokenizer saved again without EOS, and two corpora: one of 701 bytes, one of
    about 3 kB of words (past the bytes' bound for data.seq_len=64, short of its exact count)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

    root = tmp_path_factory.mktemp("first-hour")
    folder = make_model_folder(root / "tiny-deepseek")
    fast = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    PreTrainedTokenizerFast(tokenizer_object=fast.backend_tokenizer, bos_token="<|bos|>").save_pretrained(
        root / "no-eos")
    tiny = root / "tiny-corpus"
    tiny.mkdir()
    (tiny / "a.txt").write_text("x" * 699)
    words = write_text_corpus(root / "corpus", corpus_documents(count=4, words_per_document=120), jsonl=False)
    return {"folder": folder, "no_eos": root / "no-eos", "tiny": tiny, "words": words}


def refused_before_submit(tmp_path, slurm_env, command, message):
    before, queued = all_job_ids(slurm_env), queued_job_ids(slurm_env)
    result = run_hpcsweep(["-m", *command], tmp_path, slurm_env, timeout=180)
    assert_refused(result, message)
    assert "launcher: slurm" in result.stdout + result.stderr
    assert not submitted_from(slurm_env, tmp_path, before)  # sacct unchanged: nothing was submitted
    assert queued_job_ids(slurm_env) <= queued
    assert not (tmp_path / "multirun").exists()


def test_a_model_folder_without_data_is_refused_before_submit(tmp_path, slurm_env, user_files):
    folder = user_files["folder"]
    refused_before_submit(tmp_path, slurm_env, ["model=pretrained", f"model.path={folder}", "model.lr=1e-4,3e-4"],
                          f"data=synthetic (the default) is not allowed with model.path={folder}: its pretrained "
                          "weights would fine-tune on random tokens; give it your text (data=text")


def test_a_tokenizer_without_eos_is_refused_before_submit(tmp_path, slurm_env, user_files):
    command = ["model=pretrained", f"model.path={user_files['folder']}", "data=text",
               f"data.files={user_files['words']}/*", f"data.tokenizer={user_files['no_eos']}"]
    refused_before_submit(tmp_path, slurm_env, command,
                          f"data.tokenizer={user_files['no_eos']} is not allowed for data=text: its tokenizer has no "
                          "EOS token to end each document with")


def test_a_corpus_whose_bytes_cannot_fill_seq_len_is_refused_before_submit(tmp_path, slurm_env, user_files):
    command = ["model=pretrained", f"model.path={user_files['folder']}", "data=text",
               f"data.files={user_files['tiny']}/*", "data.seq_len=64"]
    refused_before_submit(tmp_path, slurm_env, command,
                          "data.seq_len=64 is not allowed: data.files=")
    refused_before_submit(tmp_path, slurm_env, command, "699 bytes in 1 files make at most 701 tokens")


def test_a_malformed_chat_line_is_refused_before_submit_and_a_good_corpus_is_counted(tmp_path, slurm_env, user_files):
    """Issue 41: the preparation job found a bad line after 15 minutes in the queue; the login node finds it now."""
    from tests.chat_fixtures import NAMED_TEMPLATE, random_conversations, write_chat_corpus

    template = tmp_path / "chatml.jinja"
    template.write_text(NAMED_TEMPLATE)
    path = write_chat_corpus(tmp_path / "badchat" / "chat_bad.jsonl", random_conversations(8))
    lines = path.read_text().splitlines()
    lines[5] = lines[5].replace('", "', '" "', 1)  # line 6: a comma lost between two fields
    path.write_text("\n".join(lines) + "\n")
    command = ["model=pretrained", f"model.path={user_files['folder']}", "data=chat", f"data.files={tmp_path}/badchat/*.jsonl",
               f"data.chat_template={template}", "model.lr=1e-4,3e-4"]
    refused_before_submit(tmp_path, slurm_env, command,
                          f"data.files='{tmp_path}/badchat/*.jsonl' is not allowed: {path}:6 is not a JSON object "
                          "(Expecting ',' delimiter)")
    # Mended, the sweep is submitted and says what the corpus holds (its samples, counted here, not in a job).
    path.write_text("\n".join(lines[:5] + lines[6:]) + "\n")
    result = run_hpcsweep(["-m", *command, *SMALL_TRIAL], tmp_path, slurm_env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"data.files='{tmp_path}/badchat/*.jsonl': 1 files, " in result.stdout + result.stderr
    assert ": 7 chat samples, about " in result.stdout + result.stderr
    assert "on 8 CPUs (data.prepare_cpus)" in result.stdout + result.stderr
    record = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    # Only the words were under test: the jobs are not run, to keep the cluster free for the other tests.
    slurm(slurm_env, "scancel", record["token_preparation"]["job_id"],
          *(array["array_job_id"] for array in record["arrays"]))


def test_a_corpus_only_the_exact_count_finds_too_small_cancels_the_trials_and_says_why(tmp_path, slurm_env,
                                                                                      user_files):
    command = ["-m", "model=pretrained", f"model.path={user_files['folder']}", "data=text",
               f"data.files={user_files['words']}/*", "model.lr=1e-4,3e-4", *SMALL_TRIAL, "data.seq_len=64"]
    result = run_hpcsweep(command, tmp_path, slurm_env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = next(tmp_path.glob("multirun/*/*/sweep.json")).parent
    record = read_json(sweep_dir / "sweep.json")
    assert wait_until_ended(slurm_env, record["token_preparation"]["job_id"]) == "FAILED"
    # Slurm cancels the still pending array (sacct: 9_[0-1%2] CANCELLED); --follow ends once both trials have ended.
    status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir), "--follow", "--interval", "1"],
                            env=slurm_env, capture_output=True, text=True, timeout=300)
    assert status.returncode == 4, status.stdout + status.stderr  # cancelled: not 0
    assert "2 trials, 2 cancelled" in status.stdout
    whys = [line.strip() for line in status.stdout.splitlines() if line.strip().startswith("why: ")]
    assert len(whys) == 2 and all("never started: token preparation: data.seq_len=64 is not allowed: at most " in w
                                  for w in whys), status.stdout
    errors = [read_json(sweep_dir / str(num) / "metrics.json")["error"] for num in (0, 1)]
    assert errors[0] == errors[1] and "\n" not in errors[0] and errors[0] in whys[0]
    report = subprocess.run([sys.executable, "-m", "hpcsweep.report", str(sweep_dir)], env=slurm_env,
                            capture_output=True, text=True, timeout=120)
    assert f"#0 cancelled: {errors[0]}" in report.stdout and "no error recorded" not in report.stdout
    # The same command again is refused up front, exactly, now that the cache entry exists.
    before = all_job_ids(slurm_env)
    again = run_hpcsweep(command, tmp_path, slurm_env, timeout=180)
    assert_refused(again, "data.seq_len=64 is not allowed: at most ")
    assert not submitted_from(slurm_env, tmp_path, before)  # sacct unchanged: nothing was submitted
    assert len(list(tmp_path.glob("multirun/*/*/sweep.json"))) == 1  # no second sweep


def test_a_completed_two_node_train_sbatch_job_logs_no_stack_trace(tmp_path, slurm_env):
    (tmp_path / "slurm" / "logs").mkdir(parents=True)
    env = {**slurm_env, "HPCSWEEP_PYTHON": sys.executable}
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=2", "--time=10",
         str(REPO / "slurm" / "train.sbatch"), "model.lr=3e-4", "trainer.nproc_per_node=2",
         *[o for o in SMALL_TRIAL if not o.startswith("hydra.")], "trainer.max_steps=4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    state = wait_until_ended(slurm_env, job_id)
    log = (tmp_path / "slurm" / "logs" / f"hpcsweep-train-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert json.loads((tmp_path / "outputs" / f"sbatch-{job_id}" / "metrics.json").read_text())["world_size"] == 4
    for trace in ("recvBytes", "failed to shutdown the rendezvous", "RendezvousConnectionError", "Traceback"):
        assert trace not in log, log[-3000:]
    assert log.count("find_unused_parameters=True was specified") <= 1  # rank 0's, not one per rank
