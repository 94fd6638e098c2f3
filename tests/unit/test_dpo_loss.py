"""DPO's losses equal their formulas as TRL defines them, the reference takes no gradient, and each answer's
log-probability from a packed row equals the answer's alone (``hpcsweep.train.preference``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hpcsweep.config import DPO_LOSSES, ObjectiveConfig
from hpcsweep.train.preference.answer_logps import answer_logps
from hpcsweep.train.preference.dpo_loss import METRICS, dpo_loss

PAIRS = 64


def dpo(beta: float = 0.1, loss: str = "sigmoid", **settings: float) -> ObjectiveConfig:
    return ObjectiveConfig(kind="dpo", beta=beta, loss=loss, **settings)


def pairs(seed: int = 0, requires_grad: bool = False) -> dict[str, torch.Tensor]:
    """Random summed log-probabilities (fp64) of ``PAIRS`` pairs, and their answers' token counts."""
    generator = torch.Generator().manual_seed(seed)

    def logps() -> torch.Tensor:
        return (-30 * torch.rand(PAIRS, generator=generator, dtype=torch.float64)).requires_grad_(requires_grad)

    return {"policy_chosen": logps(), "policy_rejected": logps(), "reference_chosen": logps(),
            "reference_rejected": logps(), "chosen_tokens": torch.randint(1, 40, (PAIRS,), generator=generator),
            "rejected_tokens": torch.randint(1, 40, (PAIRS,), generator=generator)}


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def by_formula(p: dict[str, torch.Tensor], i: int, beta: float, loss: str, smoothing: float = 0.0) -> float:
    """Pair ``i``'s loss, written out from TRL's ``_compute_loss`` one scalar at a time."""
    pi_c, pi_r = p["policy_chosen"][i].item(), p["policy_rejected"][i].item()
    ref_c, ref_r = p["reference_chosen"][i].item(), p["reference_rejected"][i].item()
    n_c, n_r = p["chosen_tokens"][i].item(), p["rejected_tokens"][i].item()
    delta = (pi_c - ref_c) - (pi_r - ref_r)
    if loss == "sigmoid":
        return -log_sigmoid(beta * delta)
    if loss == "hinge":
        return max(0.0, 1 - beta * delta)
    if loss == "ipo":
        return ((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 * beta)) ** 2
    clean = -(1 - smoothing) * log_sigmoid(beta * delta)
    flipped = -smoothing * log_sigmoid(-beta * delta)
    return (clean - flipped) / (1 - 2 * smoothing)


@pytest.mark.parametrize("loss", DPO_LOSSES)
@pytest.mark.parametrize("beta", [0.01, 0.1, 0.6])
def test_each_loss_equals_its_formula(loss, beta):
    p = pairs(seed=int(beta * 100))
    got = dpo_loss(**p, objective=dpo(beta, loss)).losses
    expected = torch.tensor([by_formula(p, i, beta, loss) for i in range(PAIRS)], dtype=torch.float64)
    assert got.shape == (PAIRS,)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert got.std() > 0  # the inputs reach every regime: not one constant value


def test_the_hinge_and_ipo_formulas_are_trls_not_their_neighbours():
    # hinge is relu(1 - beta*delta), not relu(1 - delta); ipo divides each log-ratio by its own answer's length.
    p = {"policy_chosen": torch.tensor([-10.0]), "policy_rejected": torch.tensor([-12.0]),
         "reference_chosen": torch.tensor([-11.0]), "reference_rejected": torch.tensor([-11.0]),
         "chosen_tokens": torch.tensor([4]), "rejected_tokens": torch.tensor([2])}
    assert dpo_loss(**p, objective=dpo(0.1, "hinge")).losses.item() == pytest.approx(1 - 0.1 * 2.0)
    assert dpo_loss(**p, objective=dpo(0.1, "ipo")).losses.item() == pytest.approx((1 / 4 + 1 / 2 - 5) ** 2)


def test_label_smoothing_zero_is_dpo_and_above_zero_is_robust_dpo():
    p = pairs(seed=3)
    sigmoid = dpo_loss(**p, objective=dpo(0.1, "sigmoid")).losses
    torch.testing.assert_close(dpo_loss(**p, objective=dpo(0.1, "robust", label_smoothing=0.0)).losses, sigmoid,
                               rtol=0, atol=1e-12)
    robust = dpo_loss(**p, objective=dpo(0.1, "robust", label_smoothing=0.2)).losses
    expected = torch.tensor([by_formula(p, i, 0.1, "robust", 0.2) for i in range(PAIRS)], dtype=torch.float64)
    torch.testing.assert_close(robust, expected, rtol=0, atol=1e-6)
    # The (1 - 2*eps) denominator: unbiased, so at delta = 0 robust equals DPO's log 2.
    even = {k: torch.zeros(1, dtype=torch.float64) for k in p}
    even["chosen_tokens"] = even["rejected_tokens"] = torch.ones(1)
    unbiased = dpo_loss(**even, objective=dpo(0.1, "robust", label_smoothing=0.3)).losses
    assert unbiased.item() == pytest.approx(math.log(2))
    assert not torch.allclose(robust, sigmoid)
    # With another loss a smoothing would change nothing: the config refuses it (test_objective_config).
    with pytest.raises(ValueError, match="label_smoothing=0.1 is not allowed: 0 unless objective.loss=robust"):
        dpo(0.1, "sigmoid", label_smoothing=0.1)


def test_the_next_token_objective_has_no_dpo_loss():
    with pytest.raises(ValueError, match="DPO's loss needs objective.kind='dpo'"):
        dpo_loss(**pairs(), objective=ObjectiveConfig())


def test_the_sft_weight_adds_the_chosen_answers_mean_nll():
    p = pairs(seed=5)
    base = dpo_loss(**p, objective=dpo(0.1, "ipo")).losses
    with_sft = dpo_loss(**p, objective=dpo(0.1, "ipo", sft_weight=0.5)).losses
    torch.testing.assert_close(with_sft - base, 0.5 * -p["policy_chosen"] / p["chosen_tokens"], rtol=0, atol=1e-9)


def test_the_metrics_are_trls():
    p = pairs(seed=7)
    beta = 0.3
    metrics = dpo_loss(**p, objective=dpo(beta, "ipo")).metrics
    assert tuple(metrics) == METRICS
    chosen = beta * (p["policy_chosen"] - p["reference_chosen"])
    rejected = beta * (p["policy_rejected"] - p["reference_rejected"])
    expected = {"rewards/chosen": chosen, "rewards/rejected": rejected,
                "rewards/accuracies": (chosen > rejected).double(), "rewards/margins": chosen - rejected,
                "logps/chosen": p["policy_chosen"], "logps/rejected": p["policy_rejected"]}
    for name in METRICS:
        torch.testing.assert_close(metrics[name], expected[name], rtol=0, atol=1e-12)
    assert 0 < metrics["rewards/accuracies"].mean() < 1


@pytest.mark.parametrize("loss", DPO_LOSSES)
def test_gradients_flow_to_the_policy_logps_only(loss):
    p = pairs(seed=11, requires_grad=True)
    result = dpo_loss(**p, objective=dpo(0.1, loss, label_smoothing=0.1 if loss == "robust" else 0.0, sft_weight=0.2))
    result.losses.sum().backward()
    assert p["policy_chosen"].grad.abs().sum() > 0 and p["policy_rejected"].grad.abs().sum() > 0
    assert p["reference_chosen"].grad is None and p["reference_rejected"].grad is None
    assert not any(value.requires_grad for value in result.metrics.values())


VOCAB = 50


def row_of(samples: list[tuple[int, int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One row packing ``samples`` (each ``(prompt tokens, answer tokens)``) one after another, answer ``i`` the
    ``i``-th sample's, as fp64 logits, targets, the answer mask and segment ids."""
    length = sum(p + a for p, a in samples)
    mask = torch.zeros(length, dtype=torch.bool)
    segments = torch.full((length,), -1)
    at = 0
    for index, (prompt, answer) in enumerate(samples):
        mask[at + prompt : at + prompt + answer] = True
        segments[at + prompt : at + prompt + answer] = index
        at += prompt + answer
    return {"logits": torch.randn(length, VOCAB, generator=generator, dtype=torch.float64) * 3,
            "targets": torch.randint(0, VOCAB, (length,), generator=generator), "answer_mask": mask,
            "segment_ids": segments}


def test_a_packed_row_gives_each_answer_the_logps_it_has_alone():
    # Two pairs, four samples (prompt + chosen, prompt + rejected each) in one row, then a padded tail.
    samples = [(5, 7), (5, 3), (9, 4), (9, 11)]
    generator = torch.Generator().manual_seed(0)
    packed = row_of(samples, generator)
    packed["logits"] = torch.cat([packed["logits"], torch.randn(6, VOCAB, dtype=torch.float64)])
    packed["targets"] = torch.cat([packed["targets"], torch.full((6,), -100)])
    packed["answer_mask"] = torch.cat([packed["answer_mask"], torch.zeros(6, dtype=torch.bool)])
    packed["segment_ids"] = torch.cat([packed["segment_ids"], torch.full((6,), -1)])
    logits = packed["logits"].clone().requires_grad_()
    together = answer_logps(logits.unsqueeze(0), packed["targets"].unsqueeze(0), packed["answer_mask"].unsqueeze(0),
                            packed["segment_ids"].unsqueeze(0), chunk_tokens=3)
    together.logps.sum().backward()
    at = 0
    for index, (prompt, answer) in enumerate(samples):
        span = slice(at, at + prompt + answer)
        alone_logits = packed["logits"][span].clone().requires_grad_()
        alone = answer_logps(alone_logits, packed["targets"][span], packed["answer_mask"][span],
                             torch.zeros(prompt + answer, dtype=torch.long), chunk_tokens=0)
        alone.logps.sum().backward()
        assert abs(together.logps[index].item() - alone.logps.item()) <= 1e-6
        assert together.tokens[index].item() == alone.tokens.item() == answer
        torch.testing.assert_close(logits.grad[span], alone_logits.grad, rtol=0, atol=1e-12)
        at += prompt + answer
    assert logits.grad[at:].abs().sum() == 0  # the padded tail takes no gradient


def test_answer_logps_equal_the_log_softmax_summed_over_each_answer_in_any_chunks():
    generator = torch.Generator().manual_seed(1)
    rows = [row_of([(3, 5), (2, 6), (5, 1)], generator), row_of([(1, 9), (6, 2), (2, 2)], generator)]
    batch = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
    batch["segment_ids"][1] = torch.where(batch["segment_ids"][1] >= 0, batch["segment_ids"][1] + 3, -1)
    per_token = batch["logits"].log_softmax(-1).gather(-1, batch["targets"].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    expected = torch.stack([per_token[(batch["segment_ids"] == s) & batch["answer_mask"]].sum() for s in range(6)])
    for chunk in (0, 1, 4, 1000):
        got = answer_logps(**batch, chunk_tokens=chunk)
        torch.testing.assert_close(got.logps, expected, rtol=0, atol=1e-12)
        assert got.tokens.tolist() == [5, 6, 1, 9, 2, 2]
    fp32 = answer_logps(**{**batch, "logits": batch["logits"].float()}, chunk_tokens=4, answers=6)
    assert fp32.logps.dtype == torch.float32
    torch.testing.assert_close(fp32.logps.double(), expected, rtol=0, atol=1e-4)


def test_answer_logps_hold_one_chunk_of_fp32_work_not_the_logits_log_softmax():
    """Forward and backward on 2048 answer tokens of a 32k vocabulary (one fp32 logits tensor: 262 MB): the
    log-softmax of every token at once peaks at three tensors of the logits' size (the log-softmax saved, its
    gradient, the logits' gradient; measured 3.0), the chunked one at the logits' gradient and one 256-token
    chunk's work, its rows copied and three fp32 tensors of its size (measured 1.5)."""
    from tests.loss_memory import large_allocations_mapped, step_peak_bytes  # it imports the next-token losses

    tokens, vocab = 2048, 32_000
    logits_bytes = tokens * vocab * 4
    logits = torch.randn(tokens, vocab).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,))
    mask, segments = torch.ones(tokens, dtype=torch.bool), torch.arange(tokens) // 512

    def chunked() -> None:
        answer_logps(logits, targets, mask, segments, chunk_tokens=256, answers=4).logps.sum().backward()

    def whole() -> None:
        per_token = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        torch.zeros(4, dtype=per_token.dtype).index_add(0, segments, per_token).sum().backward()

    with large_allocations_mapped():
        peaks = {}
        for name, step in (("whole", whole), ("chunked", chunked)):
            step()  # warm
            logits.grad = None
            peaks[name] = step_peak_bytes(step)
            logits.grad = None
    assert peaks["whole"] >= 2.8 * logits_bytes, peaks
    assert peaks["chunked"] <= 1.6 * logits_bytes, peaks
