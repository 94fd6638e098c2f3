"""The chunked cross-entropy: the unchunked loss's values and gradients, without its fp32 logits.

The reference is the trainer's loss before it: ``F.cross_entropy(logits.float().flatten(0, 1), targets)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpcsweep.config import TrainerConfig
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.train.data.batch import Batch
from hpcsweep.train.loss import chunk_bounds, chunked_cross_entropy

from ..loss_memory import alternate_step_peaks, tiny_lm, fp32_cross_entropy


def lm_head_case(dtype: torch.dtype, *, batch: int = 2, seq: int = 37, hidden: int = 16, vocab: int = 101):
    """Hidden states and an LM head weight (fp32 leaves), targets with some ignored, logits made in ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(batch, seq, hidden, generator=generator).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=generator).requires_grad_()
    targets = torch.randint(0, vocab, (batch, seq), generator=generator)
    targets[0, :5] = IGNORE_INDEX
    targets[1, -3:] = IGNORE_INDEX
    return hidden_states, weight, targets, dtype


def loss_and_grads(case, loss_fn):
    """The loss of ``loss_fn(logits, targets)`` and the gradients of the hidden states and the head."""
    hidden_states, weight, targets, dtype = case
    hidden_states.grad = weight.grad = None
    logits = hidden_states.to(dtype) @ weight.to(dtype).T
    loss = loss_fn(logits, targets)
    loss.backward()
    return loss.detach(), hidden_states.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("chunk_tokens", [0, 1, 7, 16, 74, 10_000])
@pytest.mark.parametrize("overwrite", [False, True])
def test_fp32_loss_and_gradients_equal_the_fp32_cross_entropy(chunk_tokens, overwrite):
    case = lm_head_case(torch.float32)
    expected = loss_and_grads(case, fp32_cross_entropy)
    got = loss_and_grads(case, lambda lg, t: chunked_cross_entropy(lg, t, chunk_tokens, overwrite_logits=overwrite))
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("overwrite", [False, True])
def test_bf16_logits_give_the_fp32_cross_entropy_and_gradients(overwrite):
    case = lm_head_case(torch.bfloat16)
    expected = loss_and_grads(case, fp32_cross_entropy)
    got = loss_and_grads(case, lambda lg, t: chunked_cross_entropy(lg, t, 8, overwrite_logits=overwrite))
    assert got[0].dtype == torch.float32  # the loss is taken in fp32, as .float() had it
    torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=1e-6)
    # The gradient reaches the bf16 logits cast to bf16 either way: equal to bf16's rounding.
    for want, have in zip(expected[1:], got[1:]):
        torch.testing.assert_close(have, want, rtol=1.6e-2, atol=1e-5)


def test_ignored_targets_take_no_loss_and_no_gradient():
    logits = torch.randn(1, 6, 11, generator=torch.Generator().manual_seed(1)).requires_grad_()
    targets = torch.tensor([[3, IGNORE_INDEX, 4, IGNORE_INDEX, IGNORE_INDEX, 9]])
    loss = chunked_cross_entropy(logits * 1.0, targets, 2)
    loss.backward()
    taken = targets[0] != IGNORE_INDEX
    assert torch.all(logits.grad[0, ~taken] == 0)
    expected = F.cross_entropy(logits[0, taken].detach(), targets[0, taken])
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-6, atol=1e-6)


def test_no_target_taken_is_nan_with_zero_gradient_as_in_f_cross_entropy():
    logits = torch.randn(1, 4, 5).requires_grad_()
    targets = torch.full((1, 4), IGNORE_INDEX)
    loss = chunked_cross_entropy(logits * 1.0, targets, 3)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    loss.backward()
    assert torch.all(logits.grad == 0)


def test_the_gradient_takes_the_logits_place_and_a_second_backward_is_refused():
    case = lm_head_case(torch.float32)
    hidden_states, weight, targets, _ = case
    logits = hidden_states @ weight.T
    before = logits.detach().clone()
    loss = chunked_cross_entropy(logits, targets, 16, overwrite_logits=True)
    torch.testing.assert_close(logits.detach(), before, rtol=0, atol=0)  # forward leaves them alone
    loss.backward(retain_graph=True)
    expected_grad = torch.autograd.grad(fp32_cross_entropy(before.requires_grad_(), targets), before)[0]
    torch.testing.assert_close(logits.detach(), expected_grad, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_no_gradient_asked_keeps_the_logits():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    with torch.no_grad():
        loss = chunked_cross_entropy(logits, targets, 3, overwrite_logits=True)
    torch.testing.assert_close(loss, fp32_cross_entropy(logits, targets), rtol=1e-6, atol=1e-6)


def test_chunks_cover_every_token_once():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(10, 0) == [(0, 10)] == chunk_bounds(10, 10) == chunk_bounds(10, 99)
    assert chunk_bounds(0, 4) == []
    with pytest.raises(ValueError, match="chunk_tokens=-1"):
        chunk_bounds(10, -1)


def test_shapes_that_disagree_are_refused():
    with pytest.raises(ValueError, match=r"logits \(2, 5, 7\) and targets \(2, 4\)"):
        chunked_cross_entropy(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long), 3)


def test_the_chunk_key_is_validated_on_the_login_node():
    assert TrainerConfig().loss_chunk_tokens is None  # auto: hpcsweep.memory_plan.loss_chunk
    assert TrainerConfig(loss_chunk_tokens=0).loss_chunk_tokens == 0
    with pytest.raises(ValueError, match=r"trainer\.loss_chunk_tokens=-5 is not allowed: null \(auto: .*\) or an "
                                         r"integer >= 0"):
        TrainerConfig(loss_chunk_tokens=-5)


def test_the_auto_chunk_is_resolved_from_the_logits_device_and_vocabulary(monkeypatch):
    """``trainer.loss_chunk_tokens=null`` (what the trainer passes by default): on CPU, 256 tokens a chunk."""
    from hpcsweep.train import loss as loss_module

    chunkings = []
    monkeypatch.setattr(loss_module, "chunk_bounds",
                        lambda tokens, chunk: chunkings.append((tokens, chunk)) or chunk_bounds(tokens, chunk))
    hidden_states, weight, targets, _ = lm_head_case(torch.float32, batch=2, seq=300)
    logits = hidden_states @ weight.T
    chunked_cross_entropy(logits, targets, None).backward()
    assert chunkings == [(600, 256)]


def test_a_training_step_peaks_at_least_one_fp32_logits_tensor_lower():
    """One AdamW step of a 32k-vocabulary Llama at 512 tokens, CPU, the contenders alternating."""
    batch, seq_len, vocab = 1, 512, 32_000
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peaks = alternate_step_peaks(tiny_lm(vocab), batch=batch, seq_len=seq_len, rounds=2, chunk_tokens=128)
    finally:
        torch.set_num_threads(threads)
    logits_bytes = batch * seq_len * vocab * 4
    drop = max(peaks["unchunked"]["peak_bytes"]) - max(peaks["chunked"]["peak_bytes"])
    assert drop >= logits_bytes, (drop, logits_bytes, peaks)
    assert abs(peaks["unchunked"]["loss"][0] - peaks["chunked"]["loss"][0]) < 2e-2  # one AdamW step apart
    # At the head no logits tensor of the whole batch exists at all: the chunked loss's (fp32 here) is
    # gone, less the one more fp32 chunk the head's backward holds (its logits made again).
    head_drop = max(peaks["chunked"]["peak_bytes"]) - max(peaks["head"]["peak_bytes"])
    assert head_drop >= logits_bytes - 4 * 128 * vocab, (head_drop, logits_bytes, peaks)


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-6), ("bf16", 1.6e-2)])
def test_the_trainer_takes_its_loss_in_the_configured_chunks_with_the_unchunked_gradients(
        tmp_path, monkeypatch, precision, tolerance):
    """fp32, and bf16 autocast (bf16 logits, the gradient cast to bf16 where autograd cast it before)."""
    from hpcsweep.config import trial_config_from_dict
    from hpcsweep.train import head_loss as head_loss_module
    from hpcsweep.train import optim
    from hpcsweep.train.distributed import init_distributed
    from hpcsweep.train.trainer import Trainer

    from .trial_dirs import trial_config

    settings = {"data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 2_000, "trainer.device": "cpu",
                "model.dropout": 0.0, "trainer.loss_chunk_tokens": 5, "trainer.telemetry_every_s": 0,
                "trainer.precision": precision}
    tmp_path.joinpath("t").mkdir()
    trainer = Trainer(trial_config_from_dict(trial_config(settings)), init_distributed("cpu", 60, env={}),
                      tmp_path / "t")
    chunkings = []
    monkeypatch.setattr(head_loss_module, "chunk_bounds",
                        lambda tokens, chunk: chunkings.append((tokens, chunk)) or chunk_bounds(tokens, chunk))
    try:
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randint(0, trainer.model.config.vocab_size, (2, 16), generator=generator)
        targets = torch.randint(0, trainer.model.config.vocab_size, (2, 16), generator=generator)
        targets[:, :3] = IGNORE_INDEX  # a chat sample's prompt
        params = [p for p in trainer.model.parameters() if p.requires_grad]

        def loss_and_grads(compute):
            trainer.model.zero_grad(set_to_none=True)
            loss = compute()
            loss.backward()
            return [loss.detach(), *(p.grad.clone() for p in params)]

        batch = Batch(inputs, targets, None, int((targets != IGNORE_INDEX).sum()))
        chunked = loss_and_grads(lambda: trainer._loss(batch, trainer._attention(batch), trainer.net))

        def unchunked_in_the_trainers_precision():
            with optim.autocast_context(trainer.choices.precision, trainer.world.device):
                logits = trainer.net(input_ids=inputs).logits
            assert logits.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
            return fp32_cross_entropy(logits, targets)

        expected = loss_and_grads(unchunked_in_the_trainers_precision)
    finally:
        trainer.close()
    assert trainer.head_loss.kernel == "torch"  # the loss taken at the head, from the hidden states
    assert chunkings == [(32, 5)]
    torch.testing.assert_close(chunked[0], expected[0], rtol=1e-6, atol=1e-6)
    for want, have in zip(expected[1:], chunked[1:]):
        # In bf16 the head's weight gradient is a sum of one bf16 product per chunk, not one bf16
        # product: near-zero entries differ by bf16 rounding of the larger ones, hence an atol as large.
        atol = 1e-6 if precision == "fp32" else tolerance * want.abs().max().item()
        torch.testing.assert_close(have, want, rtol=tolerance, atol=atol)


def test_the_trainers_evaluation_takes_one_chunk_of_logits_at_a_time_with_the_whole_batchs_loss_and_accuracy(tmp_path):
    """An evaluation holds no more than a training step (the memory plan counts the step): the head's
    output is never the logits of a whole batch, and the loss and accuracy are those logits' own."""
    from hpcsweep.config import trial_config_from_dict
    from hpcsweep.train.distributed import init_distributed
    from hpcsweep.train.trainer import Trainer

    from .trial_dirs import trial_config

    settings = {"data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 2_000, "trainer.device": "cpu",
                "trainer.loss_chunk_tokens": 5, "trainer.telemetry_every_s": 0, "trainer.eval_batches": 2}
    tmp_path.joinpath("t").mkdir()
    trainer = Trainer(trial_config_from_dict(trial_config(settings)), init_distributed("cpu", 60, env={}),
                      tmp_path / "t")
    head_outputs = []
    hook = trainer.model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: head_outputs.append(tuple(output.shape)))
    try:
        at_the_head = trainer.evaluate(), trainer.val_accuracy
        taking, trainer.head_loss = trainer.head_loss, None  # the loss on the whole batch's logits
        on_the_logits = trainer.evaluate(), trainer.val_accuracy
    finally:
        hook.remove()
        trainer.close()
    assert taking.kernel == "torch"
    vocab = trainer.model.config.vocab_size
    assert head_outputs == [(1, 1, 1)] * 2 + [(2, 16, vocab)] * 2
    assert at_the_head[0] == pytest.approx(on_the_logits[0], rel=1e-6) and at_the_head[1] == on_the_logits[1]
