"""``objective=dpo`` trains on preference pairs: rows of chosen and rejected sequences, packed apart or padded,
give each answer the log-probability it has alone; the reference is the model with every adapter off (the expert
LoRA included), equal to the folder's own model, or its log-probabilities precomputed once by the preparation; a trainer step's loss is DPO's formula on the model's
log-probabilities, with the MoE balance loss kept; a stopped DPO trial resumes exactly; and a local LoRA DPO
sweep ends with its reward accuracy in metrics.json."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from hpcsweep.config import reference_folder, trial_config_from_dict
from hpcsweep.files.token_cache import chat_rendering, text_corpus
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.prepare.text_tokens import write_entry
from hpcsweep.results.table import higher_is_better, load_sweep, sort_keys
from hpcsweep.train.data import corpora, sample_attention
from hpcsweep.train.distributed import init_distributed
from hpcsweep.train.moe.expert_lora import GroupedLoraParamWrapper
from hpcsweep.train.preference.answer_logps import answer_logps, linear_answer_logps
from tests.chat_fixtures import REAL_TEMPLATES
from tests.model_folders import WORDS, make_model_folder

from hpcsweep.train import worker as train

from .trial_dirs import make_trial_dir, read_metrics, trial_config

torch.set_num_threads(1)


def right_and_wrong_pairs(count: int, seed: int = 0) -> list[dict]:
    """Pairs whose chosen answer is systematically right: it repeats the prompt's words; the rejected one does not."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = rng.sample(WORDS, 3)
        pairs.append({"prompt": "Repeat: " + " ".join(words), "chosen": " ".join(words),
                      "rejected": " ".join(rng.sample([w for w in WORDS if w not in words], 3))})
    return pairs


@pytest.fixture(scope="module")
def dpo(tmp_path_factory):
    """A DeepseekV3 MoE folder at its config defaults with the turn markers of Qwen 3's real template, and a
    preference file tokenized into its cache entry."""
    root = tmp_path_factory.mktemp("dpo")
    folder = make_model_folder(root / "moe", chat_markers=True)
    (root / "pairs").mkdir()
    (root / "pairs" / "a.jsonl").write_text("".join(json.dumps(p) + "\n" for p in right_and_wrong_pairs(48)))
    files, cache, template = str(root / "pairs" / "*.jsonl"), str(root / "cache"), str(REAL_TEMPLATES["qwen3"])
    write_entry(text_corpus(files, str(folder), cache, "data.tokenizer", chat_rendering(template, "assistant"),
                            preference=True), workers=1)
    settings = {
        "model.path": str(folder), "model.lr": 1e-2, "model.peft": "lora", "objective.kind": "dpo",
        "data.kind": "preference", "data.files": files, "data.cache_dir": cache, "data.chat_template": template,
        "data.seq_len": 128, "data.batch_size": 2, "data.val_fraction": 0.25, "trainer.device": "cpu",
        "trainer.max_steps": 2, "trainer.warmup_steps": 1, "trainer.eval_every": 2, "trainer.eval_batches": 2,
        "trainer.log_every": 1, "trainer.ckpt_every": 0, "trainer.telemetry_every_s": 0,
        # The route that runs the reference in the trial (the model with its adapters off); tests of the default,
        # precomputed route set it back to null.
        "objective.precompute_reference": False,
        "data.packing": None,  # as data=preference resolves it: packed (trial_config starts from a synthetic trial's)
    }
    return folder, settings


def move_adapters(model):
    """Adapters that change the model (peft starts B at zero), on the experts too: seeded, the same each call."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


def summed_by_answer(logits, batch):
    """Each answer's summed log-probability written out: log_softmax (in the logits' dtype, as the trainer takes it),
    the target's entry, summed per answer in float64."""
    token_logps = torch.log_softmax(logits, dim=-1).double().gather(-1, batch.targets.clamp(min=0)[..., None])[..., 0]
    return torch.stack([token_logps[batch.answers == a].sum() for a in range(2 * batch.pairs)])


def test_packed_pairs_give_each_answer_its_log_probability_alone(dpo):
    folder, settings = dpo
    # float64 (the test compares to 1e-6): the experts as a loop, since grouped_mm has no float64 kernel.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="sdpa",
                                                 experts_implementation="eager").eval()
    logps, fills = {}, {}
    for packing in (True, False):
        cfg = trial_config_from_dict(trial_config({**settings, "data.packing": packing})).data
        corpus = corpora.load_corpus(cfg, model.config.vocab_size, str(folder))
        batch = corpora.get_rows(corpus, cfg, split="train", step=3, rank=0, micro_step=0, world_size=1,
                                 grad_accum=1)
        assert batch.pairs == 2 and batch.loss_tokens == 2
        assert (batch.targets != IGNORE_INDEX).equal(batch.answers >= 0)  # the loss is the answers' only
        kwargs = sample_attention.forward_kwargs(batch.position_ids, "sdpa", own_code=False, dtype=torch.float64,
                                                 device=torch.device("cpu"))
        with torch.no_grad():
            hidden = model.model(input_ids=batch.inputs, position_ids=batch.position_ids, **kwargs).last_hidden_state
            logits = model.lm_head(hidden)
        mask, ids = batch.answers >= 0, batch.answers
        logps[packing] = answer_logps(logits, batch.targets, mask, ids, chunk_tokens=5, answers=4).logps
        # At the head, a chunk at a time, as the trainer takes it: the same numbers.
        at_head = linear_answer_logps(hidden, model.lm_head.weight, None, batch.targets, mask, ids, chunk_tokens=3,
                                      answers=4)
        assert torch.allclose(at_head.logps, logps[packing], atol=1e-9, rtol=0)
        assert torch.allclose(summed_by_answer(logits, batch), logps[packing], atol=1e-9, rtol=0)
        # Packed: the four sequences share rows (something to keep apart); padded: one a row. Either way the rows
        # end with the fullest one, not at data.seq_len (TRL pads to the longest too).
        assert batch.inputs.shape[0] == (2 if packing else 4)
        assert batch.inputs.shape[1] == int(batch.real.sum(dim=1).max()) < 128
        fills[packing] = corpus.fill_rate()
    assert (logps[True] - logps[False]).abs().max() <= 1e-6, (logps[True], logps[False])
    assert fills[False] < fills[True] <= 1.0, fills


def test_a_trainer_step_takes_dpos_formula_on_the_models_log_probabilities(tmp_path, dpo):
    from hpcsweep.train.trainer import Trainer

    folder, settings = dpo
    settings = {**settings, "objective.beta": 0.5, "model.moe.aux_loss_coef": 0.01}
    (tmp_path / "t").mkdir()
    trainer = Trainer(trial_config_from_dict(trial_config(settings)), init_distributed("cpu", 60, env={}),
                      tmp_path / "t")
    try:
        model = trainer.model
        assert any(isinstance(m, GroupedLoraParamWrapper) for m in model.modules())  # the experts have adapters
        # Adapters that change the model (peft starts B at zero), on the experts too.
        move_adapters(model)
        batch = corpora.get_rows(trainer.corpus, trainer.cfg.data, split="train", step=0, rank=0, micro_step=0,
                                 world_size=1, grad_accum=1)
        kwargs = sample_attention.forward_kwargs(batch.position_ids, trainer.choices.attn_implementation,
                                                 own_code=False, dtype=torch.float32, device=torch.device("cpu"))
        with torch.no_grad():
            policy = summed_by_answer(model(input_ids=batch.inputs, position_ids=batch.position_ids,
                                            **kwargs).logits, batch)
            base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                        attn_implementation=trainer.choices.attn_implementation)
            base.train()  # as the reference runs within a training step
            folders = summed_by_answer(base(input_ids=batch.inputs, position_ids=batch.position_ids,
                                            **kwargs).logits, batch)
            with model.disable_adapter():
                reference = summed_by_answer(model(input_ids=batch.inputs, position_ids=batch.position_ids,
                                                   **kwargs).logits, batch)
            ours = trainer.preference.reference_logps(batch, lambda net: trainer._logits(net, batch, kwargs))
        # The reference the trainer computes is the model with every adapter off, the experts' too: the folder's
        # own model. fp32 sums of about 150 nats: 1e-4 is a few ulps per token; an adapter left on moves each
        # answer by more than 1e-3 (below).
        assert (ours.logps.double() - reference).abs().max() <= 1e-4
        assert (reference - folders).abs().max() <= 1e-4
        assert (policy - reference).abs().min() > 1e-3  # the adapters do change every answer
        delta = (policy[0::2] - reference[0::2]) - (policy[1::2] - reference[1::2])
        expected = (-F.logsigmoid(0.5 * delta)).mean()
        aux_before = trainer.balance.window_aux.clone()
        loss, _ = trainer.train_step()
        # To fp32 rounding of the summed log-probabilities (the loss variants' formulas hold to 1e-6 in
        # test_dpo_loss; here the model runs in fp32, its sums to ~1e-5).
        assert abs(loss.item() - expected.item()) <= 1e-5, (loss, expected)
        # The MoE balance loss was taken on the policy's forward, as in next-token training.
        assert trainer.balance.window_aux[1] == aux_before[1] + 1 and trainer.balance.aux_loss_coef == 0.01
        window = trainer.preference_window.take(trainer.world)
        assert set(window) == {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                               "logps/chosen", "logps/rejected"}
        assert abs(window["logps/chosen"] - policy[0::2].mean().item()) <= 1e-3
        assert abs(window["rewards/margins"] - 0.5 * delta.mean().item()) <= 1e-4
    finally:
        trainer.close()


def test_a_local_dpo_sweep_of_both_routes_reports_its_reward_accuracy(tmp_path, dpo):
    """A LoRA trial and a full fine-tuning one in one local sweep: one preparation tokenizes the pairs and computes
    the full fine-tuning trial's reference; both end with their reward accuracy, which ranks them."""
    folder, settings = dpo
    args = ["-m", "hydra/launcher=local", "model=pretrained", "objective=dpo", "data=preference",  # the default route
            f"model.path={folder}", "model.peft=lora,none", f"data.files={settings['data.files']}",
            f"data.cache_dir={tmp_path}/cache", f"data.chat_template={settings['data.chat_template']}",
            "data.seq_len=128", "data.batch_size=4", "data.val_fraction=0.25", "model.lr=1e-3",
            "objective.beta=0.5", "trainer.max_steps=4", "trainer.eval_every=4", "trainer.eval_batches=2",
            "trainer.ckpt_every=4", "trainer.log_every=2", "logging.backends=[tensorboard,wandb,mlflow]",
            "logging.wandb.mode=offline"]
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf", "WANDB_SILENT": "true"}
    result = subprocess.run([sys.executable, "-m", "hpcsweep", *args], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert sum("tokenizing 1 files with" in line for line in output.splitlines()) == 1, output[-3000:]
    assert sum(" answers under " in line for line in output.splitlines()) == 1, output[-3000:]
    (sweep_file,) = tmp_path.glob("multirun/*/*/sweep.json")
    trials = json.loads(sweep_file.read_text())["trials"]
    assert len(trials) == 2
    for trial in trials:
        metrics = json.loads((tmp_path / trial["trial_dir"] / "metrics.json").read_text())
        assert metrics["status"] == "completed", metrics
        # Both read the reference computed once: the same folder, so one file for both routes.
        log_text = (tmp_path / trial["trial_dir"] / "train.log").read_text()
        assert f"reference log-probabilities: precomputed from {folder}" in log_text, log_text[-2000:]
        assert 0.0 <= metrics["val_reward_accuracy"] <= 1.0 and "val_reward_margin" in metrics, metrics
        assert metrics["val_loss"] > 0 and metrics["val_accuracy"] is None
    # TRL's training metrics went through every tracker (TensorBoard, MLflow, W&B offline); the reward accuracy
    # ranks trials as task scores do.
    from mlflow import MlflowClient

    from .test_trackers import read_wandb_run

    dpo_scalars = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                   "logps/rejected", "val/reward_accuracy"}
    data = load_sweep(sweep_file.parent, query=lambda job_ids: {})
    for row in data.rows:
        assert row.val_reward_accuracy is not None and row.val_reward_margin is not None
        assert dpo_scalars <= set(data.scalars[row.num])
        trackers = json.loads((sweep_file.parent / str(row.num) / "metrics.json").read_text())["trackers"]
        assert trackers["mlflow"]["status"] == trackers["wandb"]["status"] == "ok", trackers
        client = MlflowClient(tracking_uri=trackers["mlflow"]["tracking_uri"])
        run = client.get_run(trackers["mlflow"]["run_id"])
        assert dpo_scalars <= set(run.data.metrics), run.data.metrics
        assert [m.step for m in client.get_metric_history(run.info.run_id, "rewards/accuracies")] == [2, 4]
        (run_file,) = (sweep_file.parent / str(row.num) / "wandb").glob("offline-run-*/run-*.wandb")
        _, history, _ = read_wandb_run(str(run_file))
        logged = {key for entry in history for key in entry}
        assert dpo_scalars <= logged, logged
        assert [e["_step"] for e in history if "rewards/margins" in e] == [2, 4]
    assert "val_reward_accuracy" in sort_keys(data.rows) and higher_is_better("val_reward_accuracy")
    # A DPO trial exports like any other: the best by reward accuracy (an adapter, or a whole model).
    from hpcsweep.export.cli import main as export_main

    assert export_main([str(sweep_file.parent), "--best", "--by", "val_reward_accuracy", "--out",
                        str(tmp_path / "export")]) == 0
    assert {"config.json", "adapter_config.json"} & {p.name for p in (tmp_path / "export").iterdir()}


def test_a_lora_dpo_trial_stopped_and_resumed_ends_with_the_same_weights(tmp_path, monkeypatch, dpo):
    """Checkpoint and resume are next-token training's: 4 steps straight equal 2, a stop, and 2 more (LoRA dropout
    on, so the restored RNG state counts; two micro-steps a step)."""
    _, settings = dpo
    settings = {**settings, "model.lora.dropout": 0.1, "trainer.grad_accum": 2, "trainer.max_steps": 4,
                "trainer.eval_every": 2, "trainer.eval_batches": 1, "trainer.log_every": 2}
    straight = make_trial_dir(tmp_path / "straight", settings)
    assert train.run_trial(straight) == 0
    resumed = make_trial_dir(tmp_path / "resumed", settings)
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=2,rank=0")
    assert train.run_trial(resumed) == train.EXIT_STOPPED
    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(resumed) == 0
    done, reference = read_metrics(resumed), read_metrics(straight)
    assert (done["status"], done["step"], done["restarts"]) == ("completed", 4, 1)
    assert done["weights_sha256"] == reference["weights_sha256"]
    assert done["val_reward_accuracy"] == reference["val_reward_accuracy"]
    assert done["val_loss"] == reference["val_loss"]
    # report --efficiency's logps/chosen guard reads the first and the latest window; the resumed run keeps the
    # first from its checkpoint.
    assert done["preference"] == reference["preference"] and set(done["preference"]) == {
        "logps_chosen_first", "logps_chosen", "rewards_accuracy"}


def test_two_ranks_train_as_one_rank_with_twice_the_pairs(tmp_path, dpo):
    """DDP over LoRA, the reference run on the unwrapped model with its adapters off: 2 ranks x 2 pairs step as
    1 rank x 4 pairs (the same global batch, the loss a mean over its pairs), validation included."""
    from .test_trainer_ddp import losses, torchrun

    _, settings = dpo
    settings = {**settings, "data.packing": True, "trainer.max_steps": 3, "trainer.eval_every": 3}
    two = make_trial_dir(tmp_path / "two-ranks", settings)
    assert torchrun(two) == 0, (two / "torchrun.err").read_text()[-3000:]
    one = make_trial_dir(tmp_path / "one-rank", {**settings, "data.batch_size": 4})
    assert train.run_trial(one) == 0
    curves = losses(two), losses(one)
    assert [s for s, _ in curves[0]] == [1, 2, 3]
    assert max(abs(a - b) for (_, a), (_, b) in zip(*curves, strict=True)) < 1e-5, curves
    for key in ("val_loss", "val_reward_accuracy", "val_reward_margin"):
        assert abs(read_metrics(two)[key] - read_metrics(one)[key]) < 1e-5, key


def test_full_fine_tuning_reads_the_reference_computed_once_by_the_preparation(tmp_path, monkeypatch, dpo, caplog):
    """``model.peft=none``: the preparation computes every answer's log-probability under the folder once, into the
    pairs' entry; a second preparation reuses it; a trainer step takes DPO's formula with those numbers, running no
    reference forward; a stopped trial resumes to the straight run's weights."""
    from hpcsweep.prepare.reference_logps import reference_path
    from hpcsweep.sweep.text_preparation import prepare_here, sweep_text_corpus
    from hpcsweep.train.trainer import Trainer

    folder, settings = dpo
    settings = {**settings, "model.peft": "none", "model.lr": 1e-3, "data.cache_dir": str(tmp_path / "cache"),
                "objective.precompute_reference": None, "objective.beta": 0.5, "trainer.max_steps": 4, "trainer.eval_every": 2, "trainer.eval_batches": 1,
                "trainer.log_every": 2}
    cfg = trial_config_from_dict(trial_config(settings))
    with caplog.at_level(logging.INFO):
        prepare_here([cfg])
        prepare_here([cfg])
    corpus = sweep_text_corpus(cfg)
    path = reference_path(corpus.entry, str(folder))
    assert sum(" answers under " in r.getMessage() for r in caplog.records) == 1  # computed once
    assert any("reusing its reference log-probabilities" in r.getMessage() for r in caplog.records)
    stored = torch.from_numpy(np.fromfile(path, dtype=np.float64))

    (tmp_path / "t").mkdir()
    trainer = Trainer(cfg, init_distributed("cpu", 60, env={}), tmp_path / "t")
    try:
        model = trainer.model
        batch = corpora.get_rows(trainer.corpus, cfg.data, split="train", step=0, rank=0, micro_step=0,
                                 world_size=1, grad_accum=1)
        kwargs = sample_attention.forward_kwargs(batch.position_ids, trainer.choices.attn_implementation,
                                                 own_code=False, dtype=torch.float32, device=torch.device("cpu"))
        with torch.no_grad():
            reference = summed_by_answer(model(input_ids=batch.inputs, position_ids=batch.position_ids,
                                               **kwargs).logits, batch)
            # The stored numbers are the folder's own (each sequence alone), those the rows carry.
            assert (batch.reference - reference).abs().max() <= 1e-4
            assert set(batch.reference.tolist()) <= set(stored.tolist())
            # A policy that has moved from the reference.
            generator = torch.Generator().manual_seed(0)
            head = model.get_output_embeddings().weight
            head.add_(torch.randn(head.shape, generator=generator) * 0.05)
            policy = summed_by_answer(model(input_ids=batch.inputs, position_ids=batch.position_ids,
                                            **kwargs).logits, batch)
        forwards = []
        hook = model.register_forward_hook(lambda *args: forwards.append(1))
        loss, _ = trainer.train_step()
        hook.remove()
        assert len(forwards) == 1  # the policy's: no reference forward
        carried = batch.reference.double()
        delta = (policy[0::2] - carried[0::2]) - (policy[1::2] - carried[1::2])
        expected = (-F.logsigmoid(0.5 * delta)).mean()
        assert abs(loss.item() - expected.item()) <= 1e-5, (loss, expected)
    finally:
        trainer.close()

    straight = make_trial_dir(tmp_path / "straight", settings)
    assert train.run_trial(straight) == 0
    resumed = make_trial_dir(tmp_path / "resumed", settings)
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=2,rank=0")
    assert train.run_trial(resumed) == train.EXIT_STOPPED
    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(resumed) == 0
    done, reference_run = read_metrics(resumed), read_metrics(straight)
    assert (done["status"], done["restarts"]) == ("completed", 1)
    assert done["weights_sha256"] == reference_run["weights_sha256"]
    assert 0.0 <= done["val_reward_accuracy"] <= 1.0


def test_a_lora_trial_reads_the_precomputed_reference_and_runs_no_reference_forward(tmp_path, dpo, caplog):
    """``objective.precompute_reference`` null (the default) with LoRA: the rows carry the folder's log-probabilities,
    equal to the model with its adapters off, and a step runs the policy's forward alone."""
    from hpcsweep.sweep.text_preparation import prepare_here
    from hpcsweep.train.trainer import Trainer

    _, settings = dpo
    cfg = trial_config_from_dict(trial_config({**settings, "objective.precompute_reference": None, "objective.beta": 0.5,
                                               "data.cache_dir": str(tmp_path / "cache")}))
    prepare_here([cfg])
    (tmp_path / "t").mkdir()
    with caplog.at_level(logging.INFO, logger="hpcsweep.train.trainer"):
        trainer = Trainer(cfg, init_distributed("cpu", 60, env={}), tmp_path / "t")
    try:
        assert "reference log-probabilities: precomputed from" in caplog.text and trainer.preference.precomputed
        model = trainer.model
        move_adapters(model)
        batch = corpora.get_rows(trainer.corpus, cfg.data, split="train", step=0, rank=0, micro_step=0,
                                 world_size=1, grad_accum=1)
        kwargs = sample_attention.forward_kwargs(batch.position_ids, trainer.choices.attn_implementation,
                                                 own_code=False, dtype=torch.float32, device=torch.device("cpu"))
        with torch.no_grad():
            policy = summed_by_answer(model(input_ids=batch.inputs, position_ids=batch.position_ids,
                                            **kwargs).logits, batch)
            with model.disable_adapter():
                adapters_off = summed_by_answer(model(input_ids=batch.inputs, position_ids=batch.position_ids,
                                                      **kwargs).logits, batch)
        # The precomputed numbers are the model with its adapters off (each sequence alone, fp32 sums).
        assert (batch.reference - adapters_off).abs().max() <= 1e-4
        forwards = []
        hook = model.get_input_embeddings().register_forward_hook(lambda *args: forwards.append(1))
        loss, _ = trainer.train_step()
        hook.remove()
        assert len(forwards) == 1  # the policy's: no reference forward
        carried = batch.reference.double()
        delta = (policy[0::2] - carried[0::2]) - (policy[1::2] - carried[1::2])
        assert abs(loss.item() - (-F.logsigmoid(0.5 * delta)).mean().item()) <= 1e-5
    finally:
        trainer.close()


def test_the_reference_route_is_refused_where_it_cannot_be(tmp_path, dpo):
    from hpcsweep.sweep.prepare import validate_composed

    folder, settings = dpo
    with pytest.raises(ValueError, match=r"^objective.precompute_reference=False is not allowed: true or null with "
                                         r"model.peft=none: a full fine-tuning trial keeps no copy"):
        trial_config_from_dict(trial_config({**settings, "model.peft": "none"}))
    with pytest.raises(ValueError, match=r"^objective.precompute_reference=True is not allowed: false or null here: "
                                         r"no folder holds the reference"):
        trial_config_from_dict(trial_config({**settings, "model.path": None, "model.vocab_size": 384,
                                             "data.tokenizer": str(folder), "objective.precompute_reference": True}))
    composed = trial_config(settings)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    for reference, refusal in [
        (str(adapter), rf"^objective.reference={adapter} is not allowed: it holds a LoRA adapter, not a model; "
                       r"export the trial merged"),
        (str(tmp_path / "none"), rf"^objective.reference={tmp_path}/none is not allowed: no such folder$"),
        (str(make_model_folder(tmp_path / "other", vocab_size=512)),
         rf"^objective.reference={tmp_path}/other is not allowed: its vocab_size=\d+ differs from the trial's model "
         r"\(\d+\); the reference scores the trial's token ids, so it needs the same tokenizer$"),
    ]:
        objective = {**composed["objective"], "reference": reference, "precompute_reference": None}
        with pytest.raises(ValueError, match=refusal):
            validate_composed({**composed, "objective": objective})
    # A folder with the trial's vocabulary is taken, and its numbers are what the trial reads.
    taken = {**composed, "objective": {**composed["objective"], "reference": str(folder), "precompute_reference": None}}
    validate_composed(taken)
    assert reference_folder(trial_config_from_dict(taken)) == str(folder)


def test_a_reference_whose_float32_weights_do_not_fit_the_gpu_is_refused_before_submit(tmp_path, dpo):
    """The preparation job loads the reference in float32 on one of the trials' GPUs: DeepSeek-MoE-16B's 16.4B
    parameters are 61 GB, which an 80 GB A100 holds and a 40 GB one does not."""
    from pathlib import Path

    from hpcsweep.memory_plan.gpu_memory import GIB, GpuMemory
    from hpcsweep.memory_plan.model_shape import shape_from_hf_config
    from hpcsweep.prepare.reference_logps import write_reference_logps
    from hpcsweep.sweep.hooks import Allocation, SweepTrial
    from hpcsweep.sweep.memory_check import reference_refusal
    from hpcsweep.sweep.text_preparation import sweep_text_corpus
    from tests.wrapped_models import MOE_16B

    folder, settings = dpo
    settings = {**settings, "objective.precompute_reference": None, "data.cache_dir": str(tmp_path / "cache")}
    small, big = GpuMemory(40 * GIB, "A100 40GB", "test"), GpuMemory(80 * GIB, "A100", "test")
    moe_16b = shape_from_hf_config(MOE_16B)

    def trial(**overrides):
        config = trial_config_from_dict(trial_config({**settings, **overrides}))
        return SweepTrial(0, [], Path("unused"), Allocation(nodes=1, gpus_per_node=1), (config, None))

    lora = reference_refusal(trial(), moe_16b, small)
    assert lora == (f"trial #0: objective.precompute_reference is not allowed here: the preparation job computes the "
                    f"reference's log-probabilities with {folder} in float32 on one GPU, 61.0 GB of weights, more than "
                    "the 40 GB of one A100 40GB; set objective.precompute_reference=false (the reference then runs in "
                    "each trial, the model with its LoRA adapters off)"), lora
    assert "full fine-tuning DPO has no other route yet" in reference_refusal(trial(**{"model.peft": "none"}),
                                                                             moe_16b, small)
    assert reference_refusal(trial(), moe_16b, big) is None
    assert reference_refusal(trial(**{"objective.precompute_reference": False}), moe_16b, small) is None
    # Computed already (by an earlier sweep, on bigger GPUs): nothing for the job to load.
    corpus = sweep_text_corpus(trial().app_config[0])
    write_entry(corpus, workers=1)
    write_reference_logps(corpus, str(folder))
    assert reference_refusal(trial(), moe_16b, small) is None


def test_the_preparation_jobs_request_names_each_reference_and_asks_for_a_gpu(tmp_path, dpo):
    from hpcsweep.files.token_cache import TokenCacheError
    from hpcsweep.prepare.reference_logps import reference_key, reference_path
    from hpcsweep.prepare.text_tokens import prepare_requested
    from hpcsweep.sweep.text_preparation import (missing_corpora, preparation_request, sbatch_options,
                                                 sweep_text_corpus)

    folder, settings = dpo
    settings = {**settings, "data.cache_dir": str(tmp_path / "cache"), "objective.precompute_reference": None}
    full = trial_config_from_dict(trial_config({**settings, "model.peft": "none"}))
    lora = trial_config_from_dict(trial_config(settings))
    adapters_off = trial_config_from_dict(trial_config({**settings, "objective.precompute_reference": False}))
    corpus = sweep_text_corpus(full)
    assert missing_corpora([full]) == [corpus]
    (lora_request,) = json.loads(preparation_request([corpus], [adapters_off]))
    assert "references" not in lora_request  # its reference is the model with its adapters off, each step
    # A LoRA trial that reads the precomputed reference shares the full fine-tuning trial's: the same folder.
    (request,) = json.loads(preparation_request([corpus], [full, lora, adapters_off]))
    assert json.loads(preparation_request([corpus], [lora]))[0]["references"] == request["references"]
    assert request["references"] == [{"model": str(folder), "key": reference_key(str(folder)),
                                      "trust_remote_code": False}]
    assert "--gpus-per-node=1" in sbatch_options({"gpus_per_node": 8}, tmp_path / "log", 4, gpu=True)
    assert not any("gpus" in o for o in sbatch_options({"gpus_per_node": 8}, tmp_path / "log", 4))
    # The job writes the pairs and the reference's numbers; then nothing is missing.
    prepare_requested(request, workers=1)
    assert reference_path(corpus.entry, str(folder)).is_file() and missing_corpora([full]) == []
    with pytest.raises(TokenCacheError, match=rf"^model.path={folder} changed since the sweep was submitted"):
        prepare_requested({**request, "references": [{**request["references"][0], "key": "0" * 24}]}, workers=1)


def test_the_memory_plan_counts_two_rows_a_pair(dpo):
    """A DPO micro-batch of ``data.batch_size`` pairs holds up to twice as many rows: the plan counts the policy's
    activations, loss and expert products for them, as for a next-token micro-batch of that many rows."""
    from dataclasses import replace

    from hpcsweep.memory_plan.plan import plan_memory
    from hpcsweep.memory_plan.trial_setup import setup_of_trial, shape_of_trial

    _, settings = dpo
    trial = trial_config_from_dict(trial_config(settings))
    setup = setup_of_trial(trial, world_size=1, device="cuda")
    assert (setup.batch_size, setup.rows_per_item, setup.rows) == (2, 2, 4)
    shape = shape_of_trial(trial.model)
    dpo_plan = plan_memory(shape, setup)
    as_rows = plan_memory(shape, replace(setup, batch_size=4, rows_per_item=1))
    half = plan_memory(shape, replace(setup, rows_per_item=1))
    assert dpo_plan.parts == as_rows.parts
    assert dpo_plan.activations > half.activations
