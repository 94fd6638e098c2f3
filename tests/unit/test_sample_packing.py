"""Packing keeps samples apart: a packed row's loss and gradients are its samples' run alone.

The row comes from ``SampleRows`` (the trainer's rows), the model from ``build_model`` (the trainer's
models), called as ``Trainer._loss`` calls it; each sample alone is an unpacked, unpadded forward.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcsweep.config import ModelConfig
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.train.data.batch import Batch
from hpcsweep.train.data.packing import SampleRows, pack_rows
from hpcsweep.train.distributed import WorldInfo
from hpcsweep.train.model import build_model
from hpcsweep.train.trainer import Trainer

VOCAB = 96
SEQ_LEN = 40
LENGTHS = [11, 17, 9]
"""Three samples that fill 10 + 16 + 8 = 34 of a 40-position row; the rest is padding."""


def three_samples(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tokens and a loss mask (a prompt without loss, then an answer with) of three samples, their starts and lengths."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=sum(LENGTHS)).astype(np.uint16)
    mask = np.zeros(sum(LENGTHS), dtype=np.uint8)
    starts = np.cumsum([0, *LENGTHS[:-1]])
    for start, n in zip(starts, LENGTHS):
        mask[start + n // 2 : start + n] = 1
    return tokens, mask, starts.astype(np.int64), np.array(LENGTHS, dtype=np.int64)


def model_of(arch: str, attn: str) -> torch.nn.Module:
    cfg = ModelConfig(arch=arch, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2 if arch == "llama" else 4, moe_intermediate_size=16, kv_lora_rank=16,
                      qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=64)
    model = build_model(cfg, seed=3, attn_implementation=attn)
    model.train()
    return model


def loss_of(model: torch.nn.Module, inputs, targets, position_ids=None) -> torch.Tensor:
    logits = model(input_ids=inputs, position_ids=position_ids).logits
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_packed_row_of_three_samples_has_their_loss_and_gradients_run_alone(arch, attn):
    tokens, mask, starts, lengths = three_samples()
    rows = SampleRows(tokens, mask, starts, lengths, seq_len=SEQ_LEN, packing=True, seed=0, split=0, pad_id=0)
    assert rows.epoch_size(0) == 1
    row = rows.batch(0, 1)
    assert sorted(rows.row_samples(0).tolist()) == [0, 1, 2] and row.used == sum(LENGTHS) - 3
    model = model_of(arch, attn)

    packed = loss_of(model, torch.from_numpy(row.inputs), torch.from_numpy(row.targets),
                     torch.from_numpy(row.position_ids))
    packed.backward()
    packed_grads = gradients(model)

    counts = [int(mask[s + 1 : s + n].sum()) for s, n in zip(starts, lengths)]
    combined = torch.zeros(())
    for start, n, count in zip(starts, lengths, counts):
        ids = torch.from_numpy(tokens[start : start + n].astype(np.int64))[None]
        takes = torch.from_numpy(mask[start + 1 : start + n].astype(bool))
        targets = torch.where(takes, ids[0, 1:], IGNORE_INDEX)[None]
        alone = loss_of(model, ids[:, :-1], targets)  # no position ids: 0 .. n-2, no packing
        (alone * count / sum(counts)).backward()
        combined += alone.detach() * count / sum(counts)
    alone_grads = gradients(model)

    torch.testing.assert_close(packed.detach(), combined, rtol=0, atol=1e-5)
    assert packed_grads.keys() == alone_grads.keys() and len(packed_grads) == len(list(model.parameters()))
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, alone_grads[name], rtol=0, atol=1e-5, msg=name)


def test_without_position_ids_the_samples_of_a_row_would_see_each_other():
    """The check above can fail: the same row without its position ids is one long sequence."""
    tokens, mask, starts, lengths = three_samples()
    row = SampleRows(tokens, mask, starts, lengths, seq_len=SEQ_LEN, packing=True, seed=0, split=0, pad_id=0).batch(0, 1)
    model = model_of("llama", "sdpa")
    with torch.no_grad():
        apart = loss_of(model, torch.from_numpy(row.inputs), torch.from_numpy(row.targets),
                        torch.from_numpy(row.position_ids))
        together = loss_of(model, torch.from_numpy(row.inputs), torch.from_numpy(row.targets))
    assert abs(apart.item() - together.item()) > 1e-4


def test_unpacked_rows_are_one_sample_each_padded_and_padding_takes_no_loss():
    tokens, mask, starts, lengths = three_samples()
    rows = SampleRows(tokens, mask, starts, lengths, seq_len=SEQ_LEN, packing=False, seed=0, split=0, pad_id=0)
    assert rows.epoch_size(0) == 3
    batch = rows.batch(0, 3)
    for r in range(3):
        (sample,) = rows.row_samples(r).tolist()
        n = int(lengths[sample])
        start = int(starts[sample])
        assert batch.inputs[r, : n - 1].tolist() == tokens[start : start + n - 1].tolist()
        assert (batch.targets[r, n - 1 :] == IGNORE_INDEX).all()
        assert (batch.targets[r, : n - 1] != IGNORE_INDEX).sum() == mask[start + 1 : start + n].sum()
        assert batch.position_ids[r, : n - 1].tolist() == list(range(n - 1))
    assert batch.used == sum(LENGTHS) - 3
    assert rows.fill_rate() == pytest.approx((sum(LENGTHS) - 3) / (3 * SEQ_LEN))


def test_rows_never_overflow_and_each_epoch_holds_every_sample_once():
    rng = np.random.default_rng(1)
    positions = np.minimum(rng.lognormal(3.0, 1.0, size=500).astype(np.int64) + 1, 128)
    rows = pack_rows(positions, 128)
    assert sorted(s for row in rows for s in row) == list(range(500))
    assert all(positions[row].sum() <= 128 for row in rows)
    # Skewed lengths pack well: padding one sample a row would fill far less.
    assert positions.sum() / (len(rows) * 128) > 0.9 > 2 * positions.sum() / (500 * 128)


def test_a_step_weighs_its_micro_batches_by_their_loss_tokens():
    """``Trainer.loss_divisors``: the step's loss is the mean over all its targets, not of the micro-batches' means."""
    def batch(count: int) -> Batch:
        return Batch(torch.zeros(1), torch.zeros(1), None, count)

    trainer = SimpleNamespace(world=WorldInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                                              backend=None),
                              corpus=object())
    divisors = Trainer.loss_divisors(trainer, [batch(10), batch(30)])
    means = [2.0, 4.0]
    assert sum(m / d for m, d in zip(means, divisors)) == pytest.approx((2.0 * 10 + 4.0 * 30) / 40)


# data=text with data.packing=true: documents as samples


def test_long_documents_are_cut_into_row_sized_pieces_that_take_each_target_once():
    from hpcsweep.train.data.document_rows import document_pieces

    ends = np.array([5, 6, 30, 33])  # documents of 5, 1 (no target: left out), 24 and 3 tokens
    starts, lengths = document_pieces(ends, seq_len=10)
    assert starts.tolist() == [0, 6, 16, 26, 30] and lengths.tolist() == [5, 11, 11, 4, 3]
    targets = sorted(t for s, n in zip(starts, lengths) for t in range(s + 1, s + n))
    assert targets == [t for t in range(33) if t not in (0, 5, 6, 30)]


def test_a_packed_text_corpus_reads_its_documents_apart(tmp_path):
    from hpcsweep.config import DataConfig
    from hpcsweep.files.token_cache import text_corpus
    from hpcsweep.train.data.corpora import get_rows, load_corpus
    from hpcsweep.prepare.text_tokens import load_tokenizer, write_entry
    from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

    folder = make_model_folder(tmp_path / "model", weights=False)
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(count=24, words_per_document=10))
    files = [str(corpus / "*.txt"), str(corpus / "*.jsonl")]
    write_entry(text_corpus(files, str(folder), str(tmp_path / "cache"), "data.tokenizer"), workers=1)
    cfg = DataConfig(kind="text", files=files, tokenizer=str(folder), cache_dir=str(tmp_path / "cache"), seq_len=48,
                     batch_size=2, packing=True, val_fraction=0.2)
    packed = load_corpus(cfg, 384, str(folder))
    eos = load_tokenizer(str(folder)).eos_token_id
    batch = get_rows(packed, cfg, split="train", step=0, rank=0, micro_step=0, world_size=1, grad_accum=1)
    assert batch.loss_tokens == int((batch.targets != IGNORE_INDEX).sum()) > 0
    # Each run of positions from 0 is one document (or a piece of one): no EOS among its inputs, so no
    # token attends across a document boundary; a run that ends a document has EOS as its last target.
    positions, inputs, targets = batch.position_ids.numpy(), batch.inputs.numpy(), batch.targets.numpy()
    documents = 0
    for row in range(2):
        bounds = [*np.flatnonzero(positions[row] == 0), cfg.seq_len]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if (targets[row, lo:hi] == IGNORE_INDEX).all():
                continue  # the row's padding
            assert eos not in inputs[row, lo:hi].tolist()
            documents += targets[row, hi - 1] == eos
    assert documents >= 4  # rows of 48 hold several documents of about 15 tokens
    assert 0.8 < packed.fill_rate() <= 1.0
