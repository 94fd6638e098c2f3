"""Schedule, optimizers, precision helpers and early stopping."""

import math

import pytest
import torch

from hpcsweep.config import ModelConfig, TrainerConfig
from hpcsweep.train.optim import (
    EarlyStopping,
    autocast_context,
    build_grad_scaler,
    build_optimizer,
    build_scheduler,
    lr_at,
)

torch.set_num_threads(1)


def test_lr_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    lrs = [lr_at(s, 1.0, warmup_steps=4, max_steps=14, min_lr_ratio=0.1) for s in range(16)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[14] == lrs[15] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))


def test_scheduler_applies_the_schedule_to_model_lr():
    model = torch.nn.Linear(2, 2)
    mcfg, tcfg = ModelConfig(lr=0.5), TrainerConfig(warmup_steps=2, max_steps=10)
    optimizer = build_optimizer(model, mcfg, tcfg)
    scheduler = build_scheduler(optimizer, mcfg, tcfg)
    seen = []
    for _ in range(3):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == [0.25, 0.5, pytest.approx(0.5 * lr_at(2, 1.0, 2, 10, 0.1))]


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_optimizers_do_not_decay_one_dimensional_parameters(name, cls):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    optimizer = build_optimizer(model, ModelConfig(), TrainerConfig(optimizer=name, weight_decay=0.1))
    assert type(optimizer) is cls
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [p.dim() for p in decay["params"]] == [2] and len(no_decay["params"]) == 3


def test_precision_helpers():
    cpu = torch.device("cpu")
    assert not build_grad_scaler("fp32", cpu).is_enabled() and not build_grad_scaler("bf16", cpu).is_enabled()
    assert build_grad_scaler("fp16", cpu).is_enabled()
    with autocast_context("bf16", cpu):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast_context("fp32", cpu):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_early_stopping_counts_evaluations_without_a_real_improvement():
    stopper = EarlyStopping(patience=2, min_delta=0.1)
    assert [stopper.update(v) for v in (3.0, 2.5, 2.45, 2.5, 2.0, 1.99, 1.98)] == [
        False, False, False, True, False, False, True
    ]
    assert stopper.best == 1.98
    restored = EarlyStopping(patience=2, min_delta=0.1)
    restored.load_state_dict(stopper.state_dict())
    assert restored == stopper
    assert not any(EarlyStopping(patience=0, min_delta=0.0).update(1.0) for _ in range(5))
