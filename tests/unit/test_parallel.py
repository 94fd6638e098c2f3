"""DDP or FSDP, and the gradient-communication options: the pure decisions and the refused combinations.

Devices are literal ``DeviceFacts``, as in test_gpu_choices.py; the trainings are in
test_trainer_parallel.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from hpcsweep.config import ModelConfig, TrainerConfig, trial_config_from_dict
from hpcsweep.train import grad_comm, parallel
from hpcsweep.train.gpu_choices import DeviceFacts
from hpcsweep.train.model import build_model

CPU = DeviceFacts("cpu")
H100 = DeviceFacts("cuda", "NVIDIA H100 80GB HBM3", (9, 0))
A100 = DeviceFacts("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
V100 = DeviceFacts("cuda", "Tesla V100-SXM2-32GB", (7, 0))


@pytest.mark.parametrize(
    ("settings", "ddp_fits", "expected"),
    [
        ({}, True, "ddp"),
        ({}, False, "fsdp"),
        ({"parallel": "ddp"}, False, "ddp"),
        ({"parallel": "fsdp"}, True, "fsdp"),
        ({"grad_comm": "powersgd"}, False, "ddp"),  # a DDP-only option keeps auto on DDP
        ({"sync_every": 4}, False, "ddp"),
    ],
)
def test_auto_is_ddp_when_it_fits_or_a_ddp_option_is_asked(settings, ddp_fits, expected):
    assert parallel.resolve_parallel(TrainerConfig(**settings), ddp_fits=ddp_fits) == expected


def test_auto_is_ddp_until_the_memory_plan_says_otherwise():
    assert parallel.resolve_parallel(TrainerConfig()) == "ddp"


@pytest.mark.parametrize(
    ("facts", "precision", "param_dtype", "reduce_dtype"),
    [
        (H100, "bf16", torch.bfloat16, torch.float32),
        (A100, "bf16", torch.bfloat16, torch.float32),
        (H100, "fp32", None, None),
        (V100, "fp16", None, None),  # fp16 stays autocast over fp32 parameters, with its GradScaler
        (CPU, "fp32", None, None),
        (CPU, "bf16", None, None),  # CPU: fp32 throughout, the bits exact resume is proved with
    ],
)
def test_fsdp_mixed_precision_is_bf16_parameters_and_fp32_reduction_on_a_bf16_gpu_only(
    facts, precision, param_dtype, reduce_dtype
):
    policy = parallel.mixed_precision_policy(facts, precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (param_dtype, reduce_dtype)


@pytest.mark.parametrize("arch", ["deepseek_v3", "llama"])
def test_each_decoder_layer_is_an_fsdp_unit(arch):
    cfg = ModelConfig(arch=arch)
    with torch.device("meta"):
        model = build_model(cfg, seed=0)
    layers = parallel.decoder_layers(model)
    assert layers == list(model.model.layers) and len(layers) == cfg.num_layers


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"parallel": "fsdp", "grad_comm": "bf16"},
         "trainer.grad_comm='bf16' is not allowed: only 'none' with trainer.parallel='fsdp' (grad_comm is a DDP "
         "communication hook; FSDP reduce-scatters in fp32): set trainer.parallel=ddp or trainer.grad_comm=none"),
        ({"parallel": "fsdp", "sync_every": 4},
         "trainer.sync_every=4 is not allowed: only 1 with trainer.parallel='fsdp' (local SGD averages whole DDP "
         "replicas): set trainer.parallel=ddp or trainer.sync_every=1"),
        ({"grad_comm": "powersgd", "sync_every": 4},
         "trainer.sync_every=4 is not allowed: only 1 with trainer.grad_comm='powersgd' (local SGD replaces the "
         "all-reduce that grad_comm compresses): set one of trainer.sync_every=1 or trainer.grad_comm=none"),
        ({"grad_comm": "powersgd", "comm_warmup_steps": 1},
         "trainer.comm_warmup_steps=1 is not allowed: an integer >= 2 with trainer.grad_comm='powersgd'"),
        ({"sync_every": 0}, "trainer.sync_every=0 is not allowed: an integer >= 1 (1: every step)"),
        ({"powersgd_rank": 0}, "trainer.powersgd_rank=0 is not allowed: an integer >= 1"),
        ({"parallel": "zero3"}, "trainer.parallel='zero3' is not allowed: one of 'auto', 'ddp', 'fsdp'"),
        ({"grad_comm": "int8"}, "trainer.grad_comm='int8' is not allowed: one of 'none', 'bf16', 'fp16', 'powersgd'"),
    ],
)
def test_combinations_that_do_not_exist_are_refused_naming_both_keys(trainer, message):
    with pytest.raises(ValueError) as err:
        trial_config_from_dict({"trainer": trainer})
    assert str(err.value) == message


def test_the_options_that_exist_validate():
    for trainer in ({"parallel": "fsdp", "fsdp_reshard_after_forward": False}, {"grad_comm": "fp16"},
                    {"grad_comm": "powersgd", "powersgd_rank": 2, "comm_warmup_steps": 2},
                    {"sync_every": 8, "comm_warmup_steps": 0}):
        cfg = trial_config_from_dict({"trainer": trainer}).trainer
        assert all(getattr(cfg, k) == v for k, v in trainer.items())


def test_one_rank_has_no_gradient_communication_to_hook():
    model = torch.nn.Linear(2, 2)
    assert grad_comm.register_grad_comm(model, TrainerConfig(grad_comm="powersgd")) is None
    assert grad_comm.register_grad_comm(model, TrainerConfig(sync_every=4)) is None


def test_powersgd_state_round_trips_through_checkpoint_bytes():
    state = PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=3, random_seed=7)
    state.rng.randint(1_000_000_000)  # the RNG has moved on, as after a few steps
    state.error_dict = {0: torch.randn(6), 1: torch.randn(4)}
    state.p_memory_dict = {0: torch.randn(3, 2)}
    state.q_memory_dict = {0: torch.randn(2, 2)}
    state.iter, state.total_numel_before_compression = 5, 123
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    data = grad_comm.GradComm(state, device=torch.device("cpu")).state_bytes(model, optimizer)

    fresh = PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=3, random_seed=7)
    grad_comm.GradComm(fresh, device=torch.device("cpu")).load_state_bytes(data, model, optimizer)
    for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
        saved, loaded = getattr(state, name), getattr(fresh, name)
        assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert (fresh.iter, fresh.total_numel_before_compression) == (5, 123)
    assert fresh.rng.randint(1_000_000_000) == state.rng.randint(1_000_000_000)
    assert isinstance(fresh.rng, np.random.RandomState)


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank (the model averager needs a default group)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_local_sgd_state_holds_this_ranks_own_model_and_optimizer(one_rank_group):
    def trained(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        return model, optimizer

    own_model, own_optimizer = trained(1)
    state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2)
    state.iter = 7
    averager = PeriodicModelAverager(period=4, warmup_steps=2)
    averager.step = 7
    data = grad_comm.GradComm(state, averager).state_bytes(own_model, own_optimizer)

    # What the checkpoint's model and optimizer gave this rank: another rank's copy.
    model, optimizer = trained(2)
    fresh_state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2)
    fresh_averager = PeriodicModelAverager(period=4, warmup_steps=2)
    grad_comm.GradComm(fresh_state, fresh_averager).load_state_bytes(data, model, optimizer)
    assert (fresh_state.iter, fresh_averager.step) == (7, 7)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), own_model.parameters()))
    moments = [optimizer.state[p]["exp_avg_sq"] for p in model.parameters()]
    assert all(torch.equal(a, own_optimizer.state[p]["exp_avg_sq"]) for a, p in zip(moments, own_model.parameters()))


def test_an_fsdp_step_whose_head_takes_the_loss_is_quiet_and_trains(one_rank_group):
    """FSDP2 warns that the root returned a view (the head's stand-in for the logits): a false alarm
    (parallel.quiet_root_view_warning), silenced for the root alone."""
    import warnings

    from hpcsweep.train import head_loss
    from hpcsweep.train.distributed import WorldInfo

    model = build_model(ModelConfig(arch="llama"), seed=0)
    taking = head_loss.attach(model, "torch", 0, "cpu")
    assert taking is not None
    inputs = torch.randint(0, model.config.vocab_size, (2, 8))
    world = WorldInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = parallel.wrap_model(model, world, "fsdp", TrainerConfig(parallel="fsdp"), facts=CPU,
                                  precision="fp32", find_unused_parameters=False)
        with taking.taking(inputs) as taken:
            net(input_ids=inputs)
        taken.loss.backward()
        # A decoder layer's view is not silenced: only the root's stand-in is known to be harmless.
        warnings.warn(f"FSDP2-wrapped module ({type(model.model.layers[0]).__name__}) returned a view tensor.")
    assert [str(w.message) for w in caught] == [
        f"FSDP2-wrapped module ({type(model.model.layers[0]).__name__}) returned a view tensor."]
    assert model.lm_head.weight.grad is not None and model.model.layers[0].mlp.up_proj.weight.grad is not None
