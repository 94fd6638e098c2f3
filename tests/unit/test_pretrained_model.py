"""A pretrained folder loads as from_pretrained loads it, a config-only one builds at a seeded random init, and a
full fine-tuning trial starts from the saved weights: its first loss is a direct forward's (#22)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hpcsweep.config import DataConfig, ModelConfig
from hpcsweep.model.folder import model_identity, read_model_folder
from hpcsweep.train.data import corpora
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.model import build_model, flops_per_token, hf_config, load_dtype

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]


def direct(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, attn_implementation="eager")


def test_single_file_and_sharded_folders_load_the_saved_weights(model_folders):
    saved = weights_sha256(direct(model_folders["single"]).state_dict())
    for folder in model_folders.values():
        model = build_model(ModelConfig(path=str(folder)), seed=5)
        assert type(model).__name__ == "DeepseekV3ForCausalLM"
        assert model.config._attn_implementation == "eager"
        assert weights_sha256(model.state_dict()) == saved  # the seed builds nothing: the weights are the folder's


def test_a_config_only_folder_builds_at_a_random_init_the_seed_repeats(model_folders, tmp_path):
    folder = tmp_path / "config-only"
    shutil.copytree(model_folders["single"], folder)
    (folder / "model.safetensors").unlink()
    cfg = ModelConfig(path=str(folder), random_init=True)
    a, b, other = build_model(cfg, seed=3), build_model(cfg, seed=3), build_model(cfg, seed=4)
    assert weights_sha256(a.state_dict()) == weights_sha256(b.state_dict()) != weights_sha256(other.state_dict())
    assert weights_sha256(a.state_dict()) != weights_sha256(direct(model_folders["single"]).state_dict())
    assert a.config.vocab_size == 384


def test_master_weights_are_fp32_and_a_frozen_base_takes_the_compute_dtype(model_folders):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [load_dtype(p, frozen_base=False, device=cuda) for p in ("fp32", "bf16", "fp16")] == [torch.float32] * 3
    assert [load_dtype(p, frozen_base=True, device=cuda) for p in ("fp32", "bf16", "fp16")] == [
        torch.float32, torch.bfloat16, torch.float16]
    assert load_dtype("fp16", frozen_base=True, device=cpu) == torch.float32
    model = build_model(ModelConfig(path=str(model_folders["sharded"])), 0, dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    # transformers keeps DeepSeek's router in fp32 (``_keep_in_fp32_modules_strict``): routing decisions are
    # sensitive to rounding. Everything else is held in bf16.
    assert {name for name, dtype in dtypes.items() if dtype != torch.bfloat16} == {"model.layers.1.mlp.gate.weight"}


def test_flops_of_a_loaded_folder_match_the_same_architecture_built_in(model_folders):
    model = build_model(ModelConfig(path=str(model_folders["single"])), 0)
    same = ModelConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
        max_position_embeddings=256, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16,
    )
    assert flops_per_token(model.config, 64) == flops_per_token(hf_config(same), 64) > 0


def run_hpcsweep(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return subprocess.run([sys.executable, "-m", "hpcsweep", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_full_fine_tuning_trial_starts_from_the_saved_weights_and_refuses_a_changed_folder(model_folders, tmp_path):
    from tests.model_folders import write_text_corpus

    folder = tmp_path / "model"
    shutil.copytree(model_folders["single"], folder)
    corpus = write_text_corpus(tmp_path / "corpus", jsonl=False)
    token_file = tmp_path / "tokens.bin"
    subprocess.run([sys.executable, str(REPO / "scripts" / "prepare-data"), "--out", str(token_file), "--tokenizer",
                    str(folder / "tokenizer.json"), *sorted(map(str, corpus.glob("*.txt")))], check=True, timeout=120)
    trial_dir = tmp_path / "trial"
    command = [
        "model=pretrained", f"model.path={folder}", "data=file", f"data.path={token_file}", "data.seq_len=32",
        "data.batch_size=4", "trainer.max_steps=1", "trainer.log_every=1", "trainer.eval_batches=1",
        f"hydra.run.dir={trial_dir}",
    ]
    ran = run_hpcsweep(command, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    metrics = json.loads((trial_dir / "metrics.json").read_text())
    assert metrics["status"] == "completed"

    data_cfg = DataConfig(kind="file", path=str(token_file), seq_len=32, batch_size=4)
    corpus_tokens = corpora.load_corpus(data_cfg, 384)
    inputs, targets = corpora.get_batch(corpus_tokens, data_cfg, split="train", step=0, rank=0, micro_step=0,
                                        world_size=1, grad_accum=1)
    with torch.no_grad():
        logits = direct(folder)(input_ids=inputs).logits
    expected = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).item()
    assert metrics["train_loss"] == pytest.approx(expected, abs=1e-6)
    environment = json.loads((trial_dir / "environment.json").read_text())
    assert environment["model"] == model_identity(read_model_folder(str(folder)))

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "initializer_range": 0.5}))
    refused = run_hpcsweep(command, tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (f"model.path={folder} changed since the trial trained from it: config.json initializer_range=0.02 "
            "(now 0.5)") in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    forced = run_hpcsweep([*command, "resume.force=true"], tmp_path)
    assert forced.returncode == 0, forced.stdout + forced.stderr
