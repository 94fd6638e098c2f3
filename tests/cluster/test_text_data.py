"""``data=text`` on the real cluster: one preparation job tokenizes the corpus, the trial array waits
on it (``afterok``), and a failed preparation cancels the array and ``status`` says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

from .conftest import SMALL_TRIAL, read_json, run_hpcsweep, sacct_states, slurm, wait_for, wait_until_ended

SHORT = [o for o in SMALL_TRIAL if not o.startswith(("trainer.max_steps", "trainer.eval_every", "trainer.ckpt_every"))]
TEXT_TRIAL = [*SHORT, "trainer.max_steps=2", "trainer.eval_every=2", "trainer.ckpt_every=2", "model.vocab_size=384",
              "data.seq_len=16"]


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("text-model") / "model", weights=False)


def text_sweep(cwd, env, corpus, tokenizer):
    """Submit a 2-trial ``data=text`` sweep; return its sweep dir, sweep.json and the array's job id."""
    result = run_hpcsweep(["-m", "data=text", f"data.files=[{corpus}/*.txt,{corpus}/*.jsonl]",
                           f"data.tokenizer={tokenizer}", "model.lr=1e-3,2e-3", *TEXT_TRIAL], cwd, env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    (sweep_file,) = cwd.glob("multirun/*/*/sweep.json")
    record = read_json(sweep_file)
    (array,) = record["arrays"]
    return sweep_file.parent, record, array["array_job_id"]


def accounting(env, job_id):
    """``JobID -> {Reason, Eligible, Start, End, NodeList, Elapsed}`` of a job or an array's tasks, from sacct."""
    names = ("Reason", "Eligible", "Start", "End", "NodeList", "Elapsed")
    out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "-j", job_id, "--format=JobID," + ",".join(names))
    return {f[0]: dict(zip(names, f[1:])) for f in (line.split("|") for line in out.splitlines() if line)}


def test_one_preparation_job_tokenizes_the_corpus_and_the_array_starts_after_it(tmp_path, slurm_env, tokenizer_folder):
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(count=16, words_per_document=80))
    sweep_dir, record, array_id = text_sweep(tmp_path, slurm_env, corpus, tokenizer_folder)
    preparation = record["token_preparation"]
    prep_id = preparation["job_id"]
    # The array waits on the preparation (which takes seconds: it imports transformers first).
    shown = slurm(slurm_env, "scontrol", "show", "job", "--oneliner", array_id)
    assert f"Dependency=afterok:{prep_id}(unfulfilled)" in shown, shown
    assert "JobName=hpcsweep-tokenize " in slurm(slurm_env, "scontrol", "show", "job", "--oneliner", prep_id)

    assert wait_until_ended(slurm_env, prep_id, timeout=300) == "COMPLETED"
    # It ran the submitted code, as the trials do: the sweep's snapshot, not the installed hpcsweep.
    log = Path(preparation["log"]).read_text()
    assert f"hpcsweep imported from {sweep_dir / '.code' / 'hpcsweep.zip' / 'hpcsweep'}" in log, log[-3000:]
    states = wait_for(lambda: (s := sacct_states(slurm_env, array_id)) and len(s) == 2 and all(
        v.split()[0] in ("COMPLETED", "FAILED", "CANCELLED") for v in s.values()) and s, timeout=400,
        what="both trials to end")
    assert set(states.values()) == {"COMPLETED"}, states
    # Accounting keeps it too: each task waited for its Dependency, eligible and started once the job ended.
    prep_end = accounting(slurm_env, prep_id)[prep_id]["End"]
    tasks = accounting(slurm_env, array_id)
    assert sorted(tasks) == [f"{array_id}_0", f"{array_id}_1"], tasks
    for task in tasks.values():
        assert task["Reason"] == "Dependency" and task["Eligible"] >= prep_end and task["Start"] >= prep_end, (prep_end, tasks)

    # One entry in the default cache beside the sweep dirs; both trials trained on it.
    (entry,) = (tmp_path / "multirun" / "token-cache").iterdir()
    assert preparation["entries"] == [str(entry)]
    for trial in record["trials"]:
        assert read_json(tmp_path / trial["trial_dir"] / "metrics.json")["status"] == "completed"
    status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], env=slurm_env,
                            capture_output=True, text=True, timeout=120)
    assert f"token preparation: job {prep_id} COMPLETED: the corpus is tokenized" in status.stdout, status.stdout


def test_a_failed_preparation_cancels_the_array_status_says_why_and_a_retry_prepares_again(tmp_path, slurm_env, tokenizer_folder):
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(count=6, words_per_document=40))
    # A .txt document that is not UTF-8: the login node reads .jsonl lines (a bad one is refused before submit),
    # not whole .txt files, so only the preparation job finds this.
    (corpus / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    sweep_dir, record, array_id = text_sweep(tmp_path, slurm_env, corpus, tokenizer_folder)
    prep_id = record["token_preparation"]["job_id"]
    assert wait_until_ended(slurm_env, prep_id, timeout=300) == "FAILED"
    # Slurm cancels the array, never started (kill-on-invalid-dep), as soon as its dependency fails.
    wait_for(lambda: (s := sacct_states(slurm_env, array_id)) and all(v.split()[0] == "CANCELLED" for v in s.values()),
             timeout=120, what="Slurm to cancel the array")
    # Never started: no task was given a node or ran a step. (Start is no witness: a pending job that is
    # cancelled gets Start=End on some of slurmctld's paths.)
    tasks = accounting(slurm_env, array_id)
    assert tasks and all(task["NodeList"] == "None assigned" and task["Elapsed"] == "00:00:00"
                         for task in tasks.values()), tasks
    steps = slurm(slurm_env, "sacct", "--noheader", "--parsable2", "-j", array_id, "--format=JobID").split()
    assert not [step for step in steps if "." in step], steps
    assert not (tmp_path / "multirun" / "token-cache").exists() or not any(
        p for p in (tmp_path / "multirun" / "token-cache").iterdir() if not p.name.startswith("."))

    status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], env=slurm_env,
                            capture_output=True, text=True, timeout=120)
    log = record["token_preparation"]["log"]
    (line,) = [line for line in status.stdout.splitlines() if line.startswith("token preparation:")]
    assert line.startswith(f"token preparation: job {prep_id} FAILED (exit 1:0): the trials were cancelled"), line
    assert f"log: {log}: token preparation failed: {corpus / 'latin1.txt'} is not UTF-8 text (" in line, line

    # The user mends the corpus; a retry tokenizes it again before the cancelled trials run.
    (corpus / "latin1.txt").write_text("caf\u00e9 au lait", encoding="utf-8")
    retried = subprocess.run([sys.executable, "-m", "hpcsweep.retry", str(sweep_dir)], cwd=tmp_path, env=slurm_env,
                             capture_output=True, text=True, timeout=180)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    record = read_json(sweep_dir / "sweep.json")
    again = record["token_preparation"]["job_id"]
    assert again != prep_id
    # The new job logs beside the failed one, which keeps its reason.
    assert Path(record["token_preparation"]["log"]).name == f"prepare-{again}.log"
    assert Path(log).name == f"prepare-{prep_id}.log" and "is not UTF-8 text" in Path(log).read_text()
    assert wait_until_ended(slurm_env, again, timeout=300) == "COMPLETED"
    for trial in record["trials"]:
        assert wait_until_ended(slurm_env, trial["job_id"], timeout=300) == "COMPLETED"
        assert read_json(tmp_path / trial["trial_dir"] / "metrics.json")["status"] == "completed"
