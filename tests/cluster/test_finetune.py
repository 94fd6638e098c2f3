"""Issue 22's acceptance, end to end on the real local cluster, with only files the test makes: a
DeepseekV3 saved by ``save_pretrained`` with a tokenizer trained by ``tokenizers``, and a folder of text.

A 2-trial LoRA sweep of it tokenizes the text once, in one preparation job that the array waits on;
one trial is stopped by ``scancel --signal=USR2``, requeued, and ends with the adapters of an
uninterrupted run; its checkpoints hold the adapters alone; ``export --best`` writes a peft adapter and
``--merge`` a full model, which load in a fresh process with the trial's final logits.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

from .conftest import STOPPABLE_TRIAL, read_json, run_hpcsweep, slurm, usr2_at_step, wait_until_ended
from .test_preemption import reference, wait_until_final  # noqa: F401  (reference: a fixture)

FRESH_LOAD = """
import json, sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
adapter, merged, out = sys.argv[1:]
torch.set_num_threads(1)
batch = torch.arange(48).remainder(300).reshape(2, 24)
def logits(model):
    with torch.no_grad():
        return model.eval()(input_ids=batch).logits
base = AutoModelForCausalLM.from_pretrained(json.load(open(adapter + "/adapter_config.json"))["base_model_name_or_path"],
                                            local_files_only=True)
torch.save({"adapter": logits(PeftModel.from_pretrained(base, adapter, local_files_only=True)),
            "merged": logits(AutoModelForCausalLM.from_pretrained(merged, local_files_only=True)),
            "batch": batch}, out)
"""


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """What a user brings: a pretrained model folder and a folder of .txt and .jsonl files."""
    root = tmp_path_factory.mktemp("finetune")
    # Wide enough (1.3M parameters) that rank-4 adapters are a few per cent of it, as on a real base.
    folder = make_model_folder(root / "small-deepseek", hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                               kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32)
    return folder, write_text_corpus(root / "corpus", corpus_documents(32, 80))


def accounting(env, job_id):
    """``JobID -> (JobName, Start, End)`` of a job or an array's tasks, from sacct."""
    out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "-j", job_id, "--format=JobID,JobName,Start,End")
    return {f[0]: tuple(f[1:]) for f in (line.split("|") for line in out.splitlines() if line)}


def test_a_lora_sweep_of_a_pretrained_folder_on_its_text_resumes_exactly_and_exports(tmp_path, slurm_env, reference,
                                                                                    user_files):
    folder, corpus = user_files
    # One intra-op thread in the trial and the reference alike: a LoRA weight gradient (rank-4 rows)
    # is one matmul whose reduction torch splits over its threads, so 1 and 2 threads differ in the last
    # bit. A task's threads follow the CPUs it is given, which on this one-machine cluster vary by node.
    slurm_env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    finetune = [*STOPPABLE_TRIAL, "model=pretrained", f"model.path={folder}", "model.peft=lora", "model.lora.r=4",
                "data=text", f"data.files={corpus}/*"]
    result = run_hpcsweep(["-m", *finetune, "model.lr=1e-3,3e-3"], tmp_path, slurm_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = next(tmp_path.glob("multirun/*/*/sweep.json")).parent
    record = read_json(sweep_dir / "sweep.json")
    (array,) = record["arrays"]
    prep_id, array_id = record["token_preparation"]["job_id"], array["array_job_id"]
    assert record["app"]["models"][str(folder)]["fingerprint_sha256"]
    # The same trial uninterrupted, here without Slurm; its own cache, so the sweep's job is the only tokenizer.
    uninterrupted = reference(1, *finetune, "model.lr=3e-3", f"data.cache_dir={tmp_path / 'reference-cache'}",
                              env=slurm_env)

    stopped = next(t for t in record["trials"] if t["num"] == 1)
    trial_dir = tmp_path / stopped["trial_dir"]
    usr2_at_step(slurm_env, stopped["job_id"], trial_dir, 3, timeout=600)
    metrics = wait_until_final(slurm_env, stopped["job_id"], trial_dir, timeout=600)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["restarts"] >= 1 and metrics["last_stop_reason"] == "time_limit"
    assert metrics["weights_sha256"] == uninterrupted.weights_sha256()
    assert wait_until_ended(slurm_env, f"{array_id}_0", timeout=600) == "COMPLETED"

    # One preparation job tokenized the text; both tasks started only once it had ended.
    prep = accounting(slurm_env, prep_id)[prep_id]
    assert prep[0] == "hpcsweep-tokenize", prep
    tasks = accounting(slurm_env, array_id)
    assert {f"{array_id}_0", f"{array_id}_1"} <= set(tasks), tasks
    assert all(start >= prep[2] for _, start, _ in tasks.values()), (prep, tasks)
    assert len(list((tmp_path / "multirun" / "token-cache").iterdir())) == 1

    # Checkpoints hold what trains (the adapters, and the router's bias buffer), never the base: under 6% (the
    # adapters cover attention, the dense and shared MLPs and every routed expert: 5.2% of this small base).
    from hpcsweep.train.checkpoint.store import read_metadata

    full_weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    for checkpoint in (trial_dir / "checkpoints").glob("step*.pt"):
        saved = read_metadata(checkpoint / "model").state_dict_metadata
        assert saved and all("lora_" in key or key.endswith("e_score_correction_bias") for key in saved), checkpoint
        size = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
        # A full checkpoint holds the weights and two AdamW moments: three times the folder's fp32 weights.
        assert size < 0.06 * 3 * full_weights, (checkpoint, size, full_weights)

    best = min(record["trials"], key=lambda t: read_json(tmp_path / t["trial_dir"] / "metrics.json")["best_val_loss"])
    env = {k: v for k, v in slurm_env.items() if k != "PYTHONPATH"}
    for args in (["--out", "adapter"], ["--merge", "--out", "merged"]):
        done = subprocess.run([sys.executable, "-m", "hpcsweep.export", str(sweep_dir), "--best", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"exported trial #{best['num']} (step00000020-" in done.stdout + done.stderr
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(folder)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "merged").iterdir()}

    done = subprocess.run([sys.executable, "-c", FRESH_LOAD, "adapter", "merged", "logits.pt"], cwd=tmp_path,
                          env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import torch

    from hpcsweep.export.weights import load_trial_model, trial_config
    from hpcsweep.train.trackers.metrics import weights_sha256
    from hpcsweep.train.checkpoint.trained_state import trained_state_dict

    fresh = torch.load(tmp_path / "logits.pt")
    best_dir = tmp_path / best["trial_dir"]
    net = load_trial_model(trial_config(best_dir), max((best_dir / "checkpoints").glob("step*.pt")))
    assert weights_sha256(trained_state_dict(net)) == read_json(best_dir / "metrics.json")["weights_sha256"]
    with torch.no_grad():
        final = net.eval()(input_ids=fresh["batch"]).logits
    assert (fresh["adapter"] - final).abs().max() < 1e-5
    assert (fresh["merged"] - final).abs().max() < 1e-5
