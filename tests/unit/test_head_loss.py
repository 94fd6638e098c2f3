"""The loss taken at the LM head (``hpcsweep.train.head_loss``): the logits of one chunk at a time, the
same loss and gradients as the whole batch's fp32 logits, and the choice of what computes it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpcsweep.model.head import logits_are_the_heads
from hpcsweep.train.head_loss import (
    LOGITS,
    HeadLoss,
    attach,
    choose_kernel,
    linear_cross_entropy,
    linear_loss_and_accuracy,
)
from hpcsweep.train.loss import IGNORE_INDEX, chunked_cross_entropy
from hpcsweep.train.trackers.metrics import accuracy_counts

from ..loss_memory import tiny_lm


def case(seed: int = 0, tokens: tuple[int, int] = (2, 37), hidden: int = 16, vocab: int = 300, bias: bool = True):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(*tokens, hidden, generator=generator).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=generator).requires_grad_()
    b = torch.randn(vocab, generator=generator).requires_grad_() if bias else None
    targets = torch.randint(0, vocab, tokens, generator=generator)
    targets[0, :5] = IGNORE_INDEX  # a chat sample's prompt
    return h, weight, b, targets


def loss_and_grads(loss: torch.Tensor, inputs) -> list[torch.Tensor]:
    return [loss.detach(), *torch.autograd.grad(loss, [x for x in inputs if x is not None])]


@pytest.mark.parametrize("chunk_tokens", [0, 1, 7, 32, 74, 1000])
def test_fp32_loss_and_gradients_equal_the_whole_batchs_logits(chunk_tokens):
    h, weight, bias, targets = case()
    expected = loss_and_grads(F.cross_entropy(F.linear(h, weight, bias).flatten(0, 1), targets.flatten()),
                              (h, weight, bias))
    have = loss_and_grads(linear_cross_entropy(h, weight, bias, targets, chunk_tokens), (h, weight, bias))
    for want, got in zip(expected, have):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_under_bf16_autocast_the_chunks_run_the_heads_own_bf16_matmul():
    h, weight, _, targets = case(bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(h, weight)
        assert logits.dtype == torch.bfloat16
        expected = loss_and_grads(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()), (h, weight))
        have = loss_and_grads(linear_cross_entropy(h, weight, None, targets, 16), (h, weight))
    torch.testing.assert_close(have[0], expected[0], rtol=1e-6, atol=1e-6)  # the same bf16 logits, summed in fp32
    torch.testing.assert_close(have[1], expected[1], rtol=0, atol=0)  # each token's hidden gradient: one chunk's
    torch.testing.assert_close(have[2], expected[2], rtol=1.6e-2, atol=1.6e-2 * expected[2].abs().max().item())


def test_no_target_taken_is_nan_with_zero_gradient_as_in_f_cross_entropy():
    h, weight, bias, targets = case()
    targets[:] = IGNORE_INDEX
    loss = linear_cross_entropy(h, weight, bias, targets, 8)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(F.linear(h, weight, bias).flatten(0, 1), targets.flatten()))
    grads = torch.autograd.grad(loss, (h, weight))
    assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_shapes_that_disagree_are_refused():
    h, weight, bias, targets = case()
    with pytest.raises(ValueError, match=r"hidden states \(2, 37, 16\) and targets \(2, 36\) differ"):
        linear_cross_entropy(h, weight, bias, targets[:, 1:], 8)


def test_the_head_takes_the_loss_only_while_asked_and_stays_the_models_own_module():
    model = tiny_lm(1000, layers=2)
    keys = list(model.state_dict())
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 1000, (2, 33), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    params = list(model.parameters())
    expected = loss_and_grads(F.cross_entropy(model(input_ids=inputs).logits.float().flatten(0, 1),
                                              targets.flatten()), params)
    head = HeadLoss(model.lm_head, "torch", 10)
    with head.taking(targets) as taken:
        output = model(input_ids=inputs)
    assert output.logits.shape == (1, 1, 1) and taken.loss is not None
    for want, got in zip(expected, loss_and_grads(taken.loss, params)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert model(input_ids=inputs).logits.shape == (2, 32, 1000)  # evaluation, task scores, generation
    assert list(model.state_dict()) == keys and type(model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("chunk_tokens", [0, 1, 7, 74, 1000])
def test_validation_loss_and_accuracy_at_the_head_equal_the_whole_batchs_logits(chunk_tokens):
    h, weight, bias, targets = case()
    logits = F.linear(h, weight, bias).detach()
    targets[1, 3:9] = logits[1, 3:9].argmax(-1)  # some tokens predicted right
    loss, counts = linear_loss_and_accuracy(h, weight, bias, targets, chunk_tokens)
    torch.testing.assert_close(loss, chunked_cross_entropy(logits, targets, 0), rtol=1e-6, atol=1e-6)
    assert counts.tolist() == accuracy_counts(logits, targets).tolist() and counts[0] >= 1
    assert not loss.requires_grad  # evaluation: no graph, nothing kept for backward


def test_the_head_scores_validation_without_the_whole_batchs_logits():
    model = tiny_lm(1000, layers=2).eval()
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 1000, (2, 33), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    targets[0, :4] = IGNORE_INDEX
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    head = HeadLoss(model.lm_head, "liger", 10)  # a fused training kernel: validation takes the chunks anyway
    with torch.no_grad(), head.scoring(targets) as scored:
        output = model(input_ids=inputs)
    assert output.logits.shape == (1, 1, 1)
    torch.testing.assert_close(scored.loss, chunked_cross_entropy(logits, targets, 0), rtol=1e-6, atol=1e-6)
    assert scored.accuracy_counts.tolist() == accuracy_counts(logits, targets).tolist()
    assert model(input_ids=inputs).logits.shape == (2, 32, 1000)  # outside: the plain head again


@pytest.mark.parametrize(("setting", "device", "plain", "installed", "chosen"), [
    ("auto", "cpu", True, frozenset({"liger", "cut_cross_entropy"}), "torch"),
    ("auto", "cuda", True, frozenset(), "torch"),
    ("auto", "cuda", True, frozenset({"liger", "cut_cross_entropy"}), "liger"),
    ("auto", "cuda", True, frozenset({"cut_cross_entropy"}), "cut_cross_entropy"),
    ("auto", "cuda", False, frozenset({"liger"}), LOGITS),
    ("torch", "cuda", True, frozenset({"liger"}), "torch"),
    ("torch", "cpu", False, frozenset(), LOGITS),
    ("liger", "cuda", True, frozenset({"liger"}), "liger"),
    ("cut_cross_entropy", "cuda", True, frozenset({"cut_cross_entropy"}), "cut_cross_entropy"),
])
def test_the_kernel_is_a_function_of_setting_device_model_and_packages(setting, device, plain, installed, chosen):
    assert choose_kernel(setting, device, plain, installed) == chosen


@pytest.mark.parametrize(("setting", "device", "plain", "installed", "message"), [
    ("liger", "cpu", True, frozenset({"liger"}), r"trainer\.loss_kernel=liger is not allowed here: it needs a CUDA "
                                                  r"device \(this trial runs on cpu\); trainer\.loss_kernel=auto"),
    ("cut_cross_entropy", "cuda", True, frozenset({"liger"}),
     r"needs the cut_cross_entropy package \(pip install cut-cross-entropy\)"),
    ("liger", "cuda", False, frozenset({"liger"}), r"needs a model whose logits are its LM head's output"),
    ("fused", "cuda", True, frozenset(), r"trainer\.loss_kernel='fused' is not allowed: one of auto, torch, liger"),
])
def test_a_kernel_that_cannot_run_is_refused_naming_the_key(setting, device, plain, installed, message):
    with pytest.raises(ValueError, match=message):
        choose_kernel(setting, device, plain, installed)


def test_the_key_is_validated_on_the_login_node():
    from hpcsweep.config import TrainerConfig, trial_config_from_dict

    assert TrainerConfig().loss_kernel == "auto"
    with pytest.raises(ValueError, match=r"trainer\.loss_kernel.*one of 'auto', 'torch', 'liger', 'cut_cross_entropy'"):
        trial_config_from_dict({"trainer": {"loss_kernel": "fused"}})


def test_a_model_that_changes_its_logits_after_the_head_keeps_the_loss_on_the_logits():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    assert not logits_are_the_heads("gemma2") and not logits_are_the_heads("llama", {"logit_scale": 0.5})
    assert logits_are_the_heads("deepseek_v3", {"logit_scale": None}) and logits_are_the_heads("deepseek")
    config = Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, final_logit_softcapping=30.0)
    assert attach(Gemma2ForCausalLM(config), "auto", 8, "cpu", frozenset()) is None
    assert isinstance(attach(tiny_lm(64), "auto", 8, "cpu", frozenset()), HeadLoss)


def test_a_lora_adapter_on_the_head_keeps_the_loss_on_the_logits():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_lm(64), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert attach(model, "auto", 8, "cpu", frozenset()) is None
    plain = get_peft_model(tiny_lm(64), LoraConfig(r=2, target_modules=["q_proj"]))
    assert isinstance(attach(plain, "auto", 8, "cpu", frozenset()), HeadLoss)
