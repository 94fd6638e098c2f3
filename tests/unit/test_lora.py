"""LoRA through peft: which modules get adapters, only they train and are checkpointed, exact resume."""

from pathlib import Path

import pytest
import torch

from hpcsweep.config import trial_config_from_dict
from hpcsweep.model import lora_targets
from hpcsweep.train import lora, model, optim
from hpcsweep.train import worker as train
from hpcsweep.train.checkpoint.manager import TRAINER_FILE, WEIGHTS_DIR, load_plain_file
from hpcsweep.train.checkpoint.store import read_metadata
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.checkpoint.trained_state import trained_state_dict

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

SMALL = {
    "data.batch_size": 4, "data.seq_len": 32, "data.synthetic_tokens": 50_000, "trainer.device": "cpu",
    "trainer.max_steps": 8, "trainer.warmup_steps": 2, "trainer.eval_every": 4, "trainer.eval_batches": 1,
    "trainer.log_every": 2, "trainer.ckpt_every": 0,
    # A vocabulary of a real tokenizer's order: the frozen embedding and head outweigh the adapters, as in
    # any real model; r=2 keeps the tiny layers' adapters small beside them.
    "model.vocab_size": 2048, "model.lora.r": 2,
}
LORA = {**SMALL, "model.peft": "lora"}


def lora_model(arch="deepseek_v3", seed=0, **lora_settings):
    cfg = trial_config_from_dict({"model": {"arch": arch, "peft": "lora", "lora": {"r": 2, **lora_settings}}})
    return lora.apply_lora(model.build_model(cfg.model, seed), cfg.model, seed=seed), cfg


def adapted(net):
    """``{module path: adapted parameter names}`` of a peft model, base_layer wrappers folded in."""
    found = {}
    for name in lora.trainable_parameter_names(net):
        path = name.removeprefix("base_model.model.").split(".lora_")[0].replace(".base_layer", "")
        found.setdefault(path, set()).add(name.split(".lora_")[1].split(".")[0])
    return found


def test_deepseek_adapters_cover_attention_every_mlp_and_the_fused_routed_experts():
    net, _ = lora_model()
    paths = adapted(net)
    attention = {f"model.layers.{i}.self_attn.{m}" for i in (0, 1) for m in ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")}
    mlps = {f"model.layers.{mlp}.{m}" for mlp in ("0.mlp", "1.mlp.shared_experts") for m in ("gate_proj", "up_proj", "down_proj")}
    assert set(paths) == attention | mlps | {"model.layers.1.mlp.experts"}
    assert all(kinds == {"A", "B"} for kinds in paths.values())
    # The dense and shared MLP linears are named by parameter, so that peft does not move them onto the experts.
    config = net.peft_config["default"]
    assert config.target_parameters == {"gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                        *lora_targets.EXPERT_PARAMETERS}
    experts = dict(net.named_parameters())
    a_gate_up = experts["base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.default.weight"]
    assert a_gate_up.shape[0] == 2 * 4  # r x n_routed_experts: one rank-r adapter per expert
    # Every parameter but the adapters is frozen.
    assert all(("lora_" in name) == p.requires_grad for name, p in net.named_parameters())


def test_llama_adapters_cover_every_attention_and_mlp_linear():
    net, _ = lora_model("llama")
    names = {path.rsplit(".", 1)[1] for path in adapted(net)}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert lora_targets.target_modules("mistral", trial_config_from_dict({}).model.lora.target_modules) == lora_targets.ALL_LINEAR


def test_adapters_are_drawn_from_the_seed_and_only_they_reach_the_optimizer():
    first, cfg = lora_model(seed=3)
    again, _ = lora_model(seed=3)
    other, _ = lora_model(seed=4)
    assert weights_sha256(trained_state_dict(first)) == weights_sha256(trained_state_dict(again))
    assert weights_sha256(trained_state_dict(first)) != weights_sha256(trained_state_dict(other))
    optimizer = optim.build_optimizer(first, cfg.model, cfg.trainer)
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in first.parameters() if p.requires_grad}


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients():
    batch = torch.randint(0, 256, (2, 16))
    grads = []
    for checkpointing in (False, True):
        net, _ = lora_model(seed=1)
        with torch.no_grad():  # B starts at zero; move it so that A's gradient is not zero either
            for name, p in net.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.05)
        if checkpointing:
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        net.train()
        net(input_ids=batch).logits.float().square().mean().backward()
        grads.append({n: p.grad for n, p in net.named_parameters() if p.requires_grad})
    plain, checkpointed = grads
    assert all(g is not None and g.abs().sum() > 0 for g in checkpointed.values())
    assert all(torch.allclose(plain[n], checkpointed[n], atol=1e-7) for n in plain)


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    """A LoRA trial straight through, the same stopped at step 4 and resumed, and a full fine-tuning."""
    root = tmp_path_factory.mktemp("lora")
    mp = pytest.MonkeyPatch()
    # Dropout on the base's attention: the resumed run depends on the restored RNG state.
    settings = {**LORA, "model.dropout": 0.1, "trainer.grad_accum": 2}
    straight = make_trial_dir(root / "straight", settings)
    assert train.run_trial(straight) == 0
    resumed = make_trial_dir(root / "resumed", settings)
    mp.setenv("HPCSWEEP_FAULT", "stop,step=4,rank=0")
    assert train.run_trial(resumed) == train.EXIT_STOPPED
    mp.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(resumed) == 0
    full = make_trial_dir(root / "full", {**SMALL, "model.dropout": 0.1, "trainer.grad_accum": 2})
    assert train.run_trial(full) == 0
    mp.undo()
    return straight, resumed, full


def final_checkpoint(trial: Path) -> Path:
    return max((trial / "checkpoints").glob("step*.pt"))


def test_a_stopped_and_resumed_lora_trial_ends_with_the_same_adapters(trials):
    straight, resumed, _ = trials
    done, reference = read_metrics(resumed), read_metrics(straight)
    assert (done["status"], done["step"], done["restarts"]) == ("completed", 8, 1)
    assert done["weights_sha256"] == reference["weights_sha256"]
    assert "resumed from step00000004" in (resumed / "train.log").read_text()


def test_a_lora_checkpoint_holds_the_adapters_and_the_base_identity_not_the_base(trials):
    straight, _, full = trials
    checkpoint = final_checkpoint(straight)
    saved = set(read_metadata(checkpoint / WEIGHTS_DIR).state_dict_metadata)
    net, _ = lora_model()
    frozen = {f"model.{n}" for n, p in net.named_parameters() if not p.requires_grad}
    adapters = {f"model.{n}" for n in lora.trainable_parameter_names(net)}
    assert adapters <= saved and not saved & frozen
    assert all("lora_" in key or key.endswith("e_score_correction_bias") for key in saved)  # + the router's buffer
    assert load_plain_file(checkpoint / TRAINER_FILE)["base_model"] == {}
    # What metrics.json hashes is what trains: the adapters (and that buffer).
    assert read_metrics(straight)["weights_sha256"] != read_metrics(full)["weights_sha256"]

    def size(path):
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

    ratio = size(checkpoint) / size(final_checkpoint(full))
    assert ratio < 0.05, f"a LoRA checkpoint is {ratio:.1%} of a full one"


def test_lora_mfu_counts_the_frozen_base_forward_and_backward_without_weight_gradients():
    base = model.hf_config(trial_config_from_dict({}).model)
    assert lora.training_flops_per_token(base, "none", 64) == model.flops_per_token(base, 64)
    six_n = model.flops_per_token(base, 0)  # 6 x active parameters: no attention term at length 0
    assert lora.training_flops_per_token(base, "lora", 0) == pytest.approx(4 / 6 * six_n)
    assert lora.training_flops_per_token(base, "lora", 64) == pytest.approx(model.flops_per_token(base, 64) - six_n / 3)
