"""Only sample tokens route the balance: a batch of padded rows, or of packed rows, gives the expert counts,
the aux loss and the V3 bias update of its samples run alone (``moe_balance.routed_tokens``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcsweep.config import ModelConfig, MoeConfig
from hpcsweep.train.moe import load_balance
from hpcsweep.train.data import sample_attention
from hpcsweep.train.data.batch import Batch
from hpcsweep.train.distributed import WorldInfo
from hpcsweep.train.data.packing import SampleRows
from hpcsweep.train.moe.routed_tokens import routed_tokens

from ..moe_models import skew_router, tiny_moe

torch.set_num_threads(1)

ONE = WorldInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend=None)
PAD = 63
"""The tokenizer's pad id: routed like any token unless the balance is told it is padding."""


def samples(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 12, size=6)
    tokens = rng.integers(1, 60, size=int(lengths.sum())).astype(np.uint16)
    return tokens, np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64), lengths.astype(np.int64)


def rows_batch(packing: bool, seq_len: int = 24) -> tuple[Batch, list[list[int]]]:
    tokens, starts, lengths = samples()
    source = SampleRows(tokens, None, starts, lengths, seq_len=seq_len, packing=packing, seed=0, split=0, pad_id=PAD)
    rows = source.epoch_size(0)
    arrays = source.batch(0, rows)
    batch = Batch(torch.from_numpy(arrays.inputs), torch.from_numpy(arrays.targets),
                  torch.from_numpy(arrays.position_ids), 0, torch.from_numpy(arrays.real))
    order = [sample for r in range(rows) for sample in source.row_samples(r).tolist()]
    return batch, order


def alone_inputs(order: list[int]) -> list[torch.Tensor]:
    tokens, starts, lengths = samples()
    return [torch.from_numpy(tokens[starts[s] : starts[s] + lengths[s] - 1].astype(np.int64))[None] for s in order]


def balance_of(kind: str, seq_aux: bool = True):
    model = tiny_moe(kind, **({"seq_aux": seq_aux} if kind == "v2" else {}))
    if kind in ("v2", "v3"):  # a skewed router: its counts and bias moves are not uniform by chance
        skew_router(model, kind)
    model.train()
    moe = MoeConfig(aux_loss_coef=0.01, bias_update_rate=0.001)
    return model, load_balance.attach(model, ModelConfig(moe=moe))


def run_rows(model, balance, batch: Batch) -> torch.Tensor:
    kwargs = sample_attention.forward_kwargs(batch.position_ids, "eager", own_code=False, dtype=torch.float32,
                                             device=torch.device("cpu"))
    model(input_ids=batch.inputs, position_ids=batch.position_ids, **kwargs)
    return balance.take_aux_loss(routed_tokens(batch, torch.device("cpu")))


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("kind", ["v2", "v3"])
def test_deepseek_rows_count_and_balance_as_their_samples_alone(kind, packing):
    model, balance = balance_of(kind)
    batch, order = rows_batch(packing)
    assert not bool(batch.real.all())  # padding is there to be left out
    rows_aux = run_rows(model, balance, batch)
    rows_counts = balance.step_counts.clone()
    balance.after_optimizer_step(ONE)
    rows_bias = None if balance.routers[0].bias is None else balance.routers[0].bias.clone()

    model, balance = balance_of(kind)
    alone_aux = []
    for inputs in alone_inputs(order):
        model(input_ids=inputs, use_cache=False)
        alone_aux.append(balance.take_aux_loss())
    torch.testing.assert_close(rows_counts, balance.step_counts)
    assert int(rows_counts[0].sum()) == 2 * int(batch.real.sum())  # top-2 of each sample token, none of padding
    # seq_aux: each sample is one sequence, its loss the mean of theirs.
    torch.testing.assert_close(rows_aux, torch.stack(alone_aux).mean(), rtol=1e-5, atol=1e-7)
    balance.after_optimizer_step(ONE)
    if rows_bias is not None:
        torch.testing.assert_close(rows_bias, balance.routers[0].bias)
        assert not torch.equal(rows_bias, torch.zeros_like(rows_bias))  # the update moved it


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_switch_rows_take_the_loss_of_their_samples_tokens_alone(kind):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    model, balance = balance_of(kind)
    batch, order = rows_batch(packing=False)
    rows_aux = run_rows(model, balance, batch)
    logits = []
    for inputs in alone_inputs(order):
        model(input_ids=inputs, use_cache=False)
        logits.append(torch.stack([r.logits for r in balance.routers]))
        balance.take_aux_loss()
    together = torch.cat(logits, dim=1)  # every sample's tokens, no padding, layer by layer
    expected = load_balancing_loss_func(tuple(together), balance.routers[0].experts, balance.routers[0].top_k)
    torch.testing.assert_close(rows_aux, 0.01 * expected, rtol=1e-5, atol=1e-8)
