"""Packed samples are kept apart by hpcsweep on every kernel, whatever the folder's ``use_cache`` says.

Models here start from their config class's defaults (``use_cache=True``, as every published folder says)
with sizes shrunk; the forward is the trainer's (``sample_attention.forward_kwargs``, as ``Trainer._attention``
builds it). A packed row's logits and gradients are compared with each of its samples run alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.train.data import sample_attention
from hpcsweep.train.data.packing import SampleRows

VOCAB = 96
SEQ_LEN = 40


def shrunk_model(arch: str, attn: str, **settings) -> torch.nn.Module:
    """A causal LM of ``arch`` at its config class's defaults, sizes shrunk (seeded init)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)
    torch.manual_seed(3)
    if arch == "llama":
        config = LlamaConfig(**sizes, num_key_value_heads=2, **settings)
        model_cls = LlamaForCausalLM
    else:
        # n_group/topk_group: 8 groups need at least 8 experts each side of the cut; 8 experts are one group.
        config = DeepseekV3Config(**sizes, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=16, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1,
                                  **settings)
        model_cls = DeepseekV3ForCausalLM
    config._attn_implementation = attn
    return model_cls(config)


def corpus(count: int = 14, seed: int = 0):
    """``count`` samples of 5 to 20 tokens, a loss mask on each one's second half."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 21, size=count)
    tokens = rng.integers(1, VOCAB, size=int(lengths.sum())).astype(np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    mask = np.zeros(len(tokens), dtype=np.uint8)
    for start, n in zip(starts, lengths):
        mask[start + n // 2 : start + n] = 1
    return tokens, mask, starts, lengths.astype(np.int64)


def packed_batch(rows: int):
    tokens, mask, starts, lengths = corpus()
    source = SampleRows(tokens, mask, starts, lengths, seq_len=SEQ_LEN, packing=True, seed=0, split=0, pad_id=0)
    assert source.epoch_size(0) >= rows
    batch = source.batch(0, rows)
    samples = [source.row_samples(r).tolist() for r in range(rows)]
    assert sum(len(s) for s in samples) > rows  # rows of more than one sample: there is something to keep apart
    return batch, samples, (tokens, mask, starts, lengths)


def forward(model, inputs, position_ids, attn: str) -> torch.Tensor:
    kwargs = sample_attention.forward_kwargs(position_ids, attn, own_code=False, dtype=torch.float32,
                                             device=torch.device("cpu"))
    return model(input_ids=inputs, position_ids=position_ids, **kwargs).logits


def summed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)


def gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("training", [True, False], ids=["training", "evaluation"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["use_cache", "no_cache"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_a_packed_rows_logits_and_gradients_equal_its_samples_run_alone(arch, attn, use_cache, training, rows):
    model = shrunk_model(arch, attn, use_cache=use_cache)
    model.train(training)
    batch, samples, (tokens, mask, starts, lengths) = packed_batch(rows)
    inputs, targets = torch.from_numpy(batch.inputs), torch.from_numpy(batch.targets)
    position_ids = torch.from_numpy(batch.position_ids)

    logits = forward(model, inputs, position_ids, attn)
    summed_loss(logits, targets).backward()
    packed_grads = gradients(model)

    for r, row_samples in enumerate(samples):
        at = 0
        for sample in row_samples:
            start, n = int(starts[sample]), int(lengths[sample])
            ids = torch.from_numpy(tokens[start : start + n].astype(np.int64))[None]
            alone = model(input_ids=ids[:, :-1]).logits  # the folder's own settings, one sample: nothing to keep apart
            torch.testing.assert_close(logits[r, at : at + n - 1], alone[0], rtol=0, atol=1e-5)
            takes = torch.from_numpy(mask[start + 1 : start + n].astype(bool))
            sample_targets = torch.where(takes, ids[0, 1:], IGNORE_INDEX)
            summed_loss(alone, sample_targets[None]).backward()
            at += n - 1
    alone_grads = gradients(model)
    assert packed_grads.keys() == alone_grads.keys() and packed_grads
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, alone_grads[name], rtol=0, atol=1e-5, msg=name)


def test_transformers_own_guess_leaks_under_use_cache_so_the_check_above_can_fail():
    """Without hpcsweep's mask, a folder that says ``use_cache: true`` lets a packed row's samples see each other."""
    model = shrunk_model("llama", "sdpa", use_cache=True).eval()
    batch, _, _ = packed_batch(1)
    inputs, position_ids = torch.from_numpy(batch.inputs), torch.from_numpy(batch.position_ids)
    with torch.no_grad():
        kept_apart = forward(model, inputs, position_ids, "sdpa")
        guessed = model(input_ids=inputs, position_ids=position_ids).logits
    assert (kept_apart - guessed).abs().max() > 1e-3


def test_segments_masks_and_cumulative_lengths_of_two_rows():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    assert sample_attention.segments(position_ids).tolist() == [[1, 1, 1, 2, 2, 3], [1, 1, 1, 1, 2, 2]]
    allowed = sample_attention.sample_mask(position_ids)
    assert allowed.shape == (2, 1, 6, 6)
    assert allowed[0, 0, 4].tolist() == [False, False, False, True, True, False]
    assert allowed[1, 0, 3].tolist() == [True, True, True, True, False, False]
    cu, longest = sample_attention.cumulative_lengths(position_ids)
    assert cu.tolist() == [0, 3, 5, 6, 10, 12] and cu.dtype == torch.int32 and longest == 4


def test_each_kernel_gets_what_keeps_samples_apart_and_never_a_cache():
    position_ids = torch.tensor([[0, 1, 0, 1]])
    cpu = torch.device("cpu")
    assert sample_attention.forward_kwargs(None, "sdpa", own_code=False, dtype=torch.float32, device=cpu) == {
        "use_cache": False}
    sdpa = sample_attention.forward_kwargs(position_ids, "sdpa", own_code=False, dtype=torch.float32, device=cpu)
    assert sdpa["attention_mask"].dtype == torch.bool and sdpa["use_cache"] is False
    eager = sample_attention.forward_kwargs(position_ids, "eager", own_code=False, dtype=torch.bfloat16, device=cpu)
    assert eager["attention_mask"].dtype == torch.bfloat16
    assert eager["attention_mask"][0, 0, 2].tolist() == [torch.finfo(torch.bfloat16).min] * 2 + [0.0, torch.finfo(
        torch.bfloat16).min]
    own = sample_attention.forward_kwargs(position_ids, "eager", own_code=True, dtype=torch.float32, device=cpu)
    assert own["attention_mask"][0, 0, 3].tolist() == [0.0, 0.0, 1.0, 1.0]
    flash = sample_attention.forward_kwargs(position_ids, "flash_attention_2", own_code=False, dtype=torch.bfloat16,
                                            device=cpu)
    assert "attention_mask" not in flash and flash["cu_seq_lens_q"].tolist() == [0, 2, 4] and flash["max_length_q"] == 2


class StubFlash:
    """flash-attention's two kernels, recorded and computed with plain torch (no GPU, no ``flash_attn`` here):
    the variable-length one attends causally within each ``cu_seqlens`` span, the plain one within each row."""

    def __init__(self) -> None:
        self.varlen_calls: list[list[int]] = []
        self.plain_calls = 0

    @staticmethod
    def _attend(q, k, v, scale):  # q: tokens x heads x dim
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return out.transpose(0, 1)

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None,
               causal=True, **_):
        assert causal and torch.equal(cu_seqlens_q, cu_seqlens_k)
        self.varlen_calls.append(cu_seqlens_q.tolist())
        bounds = cu_seqlens_q.tolist()
        return torch.cat([self._attend(q[a:b], k[a:b], v[a:b], softmax_scale) for a, b in zip(bounds, bounds[1:])])

    def plain(self, q, k, v, softmax_scale=None, causal=True, **_):
        self.plain_calls += 1
        return torch.stack([self._attend(q[r], k[r], v[r], softmax_scale) for r in range(q.shape[0])])

    def imports(self, *args, **kwargs):
        def process(**kw):
            return {"softmax_scale": kw.get("softmax_scale"), "causal": kw["is_causal"],
                    "max_seqlen_q": kw.get("max_seqlen_q"), "max_seqlen_k": kw.get("max_seqlen_k")}

        return (self.plain, self.varlen, None, None, None), (process, dict)


@pytest.mark.parametrize("rows", [2, 8])
def test_flash_attention_runs_variable_length_at_every_batch_size(monkeypatch, rows):
    """transformers takes the variable-length path from position ids only at batch 1; hpcsweep's cumulative
    lengths take it at 2 and 8 rows, one span per sample (and per row's padding), and the logits are the samples'."""
    from transformers import modeling_flash_attention_utils

    stub = StubFlash()
    monkeypatch.setattr(modeling_flash_attention_utils, "lazy_import_flash_attention", stub.imports)
    model = shrunk_model("llama", "eager").eval()
    model.config._attn_implementation = "flash_attention_2"
    tokens, mask, starts, lengths = corpus(count=40, seed=1)
    source = SampleRows(tokens, mask, starts, lengths, seq_len=SEQ_LEN, packing=True, seed=0, split=0, pad_id=0)
    batch = source.batch(0, rows)
    position_ids = torch.from_numpy(batch.position_ids)
    with torch.no_grad():
        logits = forward(model, torch.from_numpy(batch.inputs), position_ids, "flash_attention_2")
    expected = [0]
    for r in range(rows):
        for sample in source.row_samples(r).tolist():
            expected.append(expected[-1] + int(lengths[sample]) - 1)
        if expected[-1] < (r + 1) * SEQ_LEN:  # the row's padding: a span of its own
            expected.append((r + 1) * SEQ_LEN)
    assert stub.plain_calls == 0
    assert stub.varlen_calls == [expected] * model.config.num_hidden_layers
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for r in range(rows):
            at = 0
            for sample in source.row_samples(r).tolist():
                start, n = int(starts[sample]), int(lengths[sample])
                ids = torch.from_numpy(tokens[start : start + n - 1].astype(np.int64))[None]
                torch.testing.assert_close(logits[r, at : at + n - 1], model(input_ids=ids).logits[0], rtol=0,
                                           atol=1e-5)
                at += n - 1
