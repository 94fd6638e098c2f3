"""Router balance in real trials of the built-in (MoE) DeepSeek-V3: metrics.json's ``router`` for a full
and a LoRA trial, TensorBoard's ``moe/*``, the moved bias in the checkpoint, and the deterministic
setting handed back when the trainer ends."""

from __future__ import annotations

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpcsweep.export.weights import load_trial_model, trial_config
from hpcsweep.train.moe import load_balance
from hpcsweep.train import worker as train

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

SMALL = {
    "data.batch_size": 4,
    "data.seq_len": 32,
    "data.synthetic_tokens": 20_000,
    "trainer.device": "cpu",
    "trainer.max_steps": 4,
    "trainer.warmup_steps": 1,
    "trainer.eval_every": 4,
    "trainer.eval_batches": 1,
    "trainer.log_every": 2,
    "trainer.ckpt_every": 0,
}


def bias_of(net: torch.nn.Module) -> torch.Tensor:
    return next(b for name, b in net.named_buffers() if name.endswith("layers.1.mlp.gate.e_score_correction_bias"))


@pytest.mark.parametrize("peft", ["none", "lora"])
def test_a_trials_metrics_carry_the_router_statistics(tmp_path, peft):
    trial = make_trial_dir(tmp_path / peft, {**SMALL, "model.peft": peft, "model.lora.r": 4})
    torch.use_deterministic_algorithms(False)
    assert train.run_trial(trial) == 0
    # trainer.deterministic=auto turned it on for the CPU trial; the ended trainer handed it back.
    assert not torch.are_deterministic_algorithms_enabled()
    router = read_metrics(trial)["router"]
    # The built-in model: 2 layers, the first dense; 4 experts, top-2; 2 steps of 4 x 32 tokens per window.
    assert list(router["layers"]) == ["1"]
    assert router["layers"]["1"]["tokens"] == 2 * 4 * 32 * 2
    # V3's bias update is off under LoRA; the aux loss stands in for it by default.
    lora_coef = load_balance.LORA_BIAS_ROUTER_AUX_LOSS_COEF if peft == "lora" else 0.0
    assert (router["experts"], router["top_k"], router["aux_loss_coef"]) == (4, 2, lora_coef)
    assert 1.0 <= router["max_mean_load"] <= 2.0 and 0.0 <= router["idle_fraction"] <= 1.0
    assert router["aux_loss"] > 0
    events = EventAccumulator(str(trial / "tb"))
    events.Reload()
    assert {"moe/max_mean_load", "moe/idle_fraction", "moe/aux_loss", "moe/layer1/max_mean_load"} <= set(
        events.Tags()["scalars"])
    net = load_trial_model(trial_config(trial), max((trial / "checkpoints").glob("step*.pt")))
    if peft == "none":
        # The bias moved 4 times by +-0.001 per expert (or stayed where the load was the mean), and the
        # checkpoint holds it.
        assert router["bias_update_rate"] == 0.001
        moved = bias_of(net)
        assert moved.abs().max() > 0 and ((moved / 0.001).round() - moved / 0.001).abs().max() < 1e-3
    else:
        # Under LoRA the base's bias stays as it was built.
        assert router["bias_update_rate"] == 0.0
        assert torch.equal(bias_of(net), torch.zeros(4))
