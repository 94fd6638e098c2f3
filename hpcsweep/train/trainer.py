"""The training loop of one trial: steps, evaluation, checkpoints, metrics, stop requests.

``Trainer`` owns the built parts (model, data, optimizer, checkpoints, logger) and the loop state
(step, early stopping). Metrics and events go through rank 0, checkpoints are written by every rank
(its share, in the background); every decision that changes control flow (stop, early stop, save)
is taken identically on all ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcsweep.config import TrialConfig, reference_folder, tokenizer_folder
from hpcsweep.files import metrics_file, tb_runs
from hpcsweep.files.metric_keys import TASKS_KEY, metric_value
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.model.record import ModelRecord
from hpcsweep.results import hparams
from hpcsweep.search.pruning import PRUNED_STEP_TAG, pruning_reporter
from hpcsweep.telemetry.trial_telemetry import TrialTelemetry
from hpcsweep.train import gpu_choices, grad_comm, head_loss, lora, model, optim, parallel
from hpcsweep.train.checkpoint import trained_state
from hpcsweep.train.checkpoint.manager import CheckpointManager
from hpcsweep.train.checkpoint.schedule import SaveSchedule, first_save_message
from hpcsweep.train.data import corpora, sample_attention
from hpcsweep.train.data.batch import Batch
from hpcsweep.train.distributed import (
    WorldInfo,
    all_gather_objects,
    any_rank,
    broadcast_object,
    max_over_ranks,
    mean_over_ranks,
    node_name,
    sum_over_ranks,
)
from hpcsweep.memory_plan.loss_chunk import loss_chunk_tokens
from hpcsweep.train.loss import chunked_cross_entropy
from hpcsweep.train.moe import load_balance, router_stats
from hpcsweep.train.moe.routed_tokens import routed_tokens
from hpcsweep.train.observe import memory_record, step_timer
from hpcsweep.train.observe.profiling import StepProfiler
from hpcsweep.train.preference.dpo_step import PreferenceStep, PreferenceWindow
from hpcsweep.train.scores import task_scorer
from hpcsweep.train.trackers import backends, metrics
from hpcsweep.control.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_STOPPED
from hpcsweep.control.stop import STOP_REQUESTED, StopRequest

log = logging.getLogger(__name__)

StepHook = Callable[["Trainer", int], None]
"""Called on every rank after each optimizer step with the number of steps done."""


def worker_seed(seed: int, rank: int) -> int:
    """The per-rank seed for dropout and other runtime randomness (ranks must differ)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


class Trainer:
    """Trains one trial in ``trial_dir`` on this worker."""

    def __init__(
        self,
        cfg: TrialConfig,
        world: WorldInfo,
        trial_dir: Path,
        *,
        stop_event: StopRequest = STOP_REQUESTED,
        hooks: Sequence[StepHook] = (),
        restarts: int = 0,
        signal_delay_s: int | None = None,
        search_trial: Path | None = None,
        model_record: ModelRecord | None = None,
    ) -> None:
        self.cfg, self.world, self.trial_dir = cfg, world, trial_dir
        self.stop_event, self.hooks, self.signal_delay_s = stop_event, tuple(hooks), signal_delay_s
        self.is_writer = world.rank == metrics.logging_rank(world.world_size)
        self.model_record = model_record  # the folder as the login node read it (None: read here)
        # The parts in the order the data flows; each step reads only what the steps before it built.
        self._choose()  # device facts -> precision, attention, kernels (pure)
        self._build_model()  # the folder's model, its adapters, balance and head loss
        memory_plan = self._distribute()  # DDP or FSDP by the memory plan, gradient communication
        self._build_training()  # data, optimizer and schedule, task scores, checkpoints
        self._start_reporting(memory_plan, restarts, search_trial)  # report, trackers, profiler, telemetry

    def _choose(self) -> None:
        """What this device runs the trial with: ``gpu_choices``' pure decisions, applied to torch's backends."""
        cfg, world = self.cfg, self.world
        self.device_facts = gpu_choices.device_facts(world.device)
        self.own_code = model.own_code(cfg.model, self.model_record)
        self.choices = gpu_choices.choose(
            cfg.trainer, cfg.model, self.device_facts, flash_available=gpu_choices.flash_attention_available(),
            packing=bool(cfg.data.packing), own_code=self.own_code,
        )
        self.backend_before = gpu_choices.apply_backend_settings(self.choices, world.device.type)
        self.weights_dtype = model.load_dtype(self.choices.precision, frozen_base=cfg.model.peft != "none",
                                              device=world.device)

    def _build_model(self) -> None:
        """The model on this device with its LoRA adapters, router balance and loss at the head, in train mode."""
        cfg, tcfg, world = self.cfg, self.cfg.trainer, self.world
        self.model = model.build_model(cfg.model, tcfg.seed, self.choices.attn_implementation,
                                       self.weights_dtype).to(world.device)
        self.model = lora.apply_lora(self.model, cfg.model, seed=tcfg.seed)
        self.balance = load_balance.attach(self.model, cfg.model)
        self.head_loss = head_loss.attach(self.model, tcfg.loss_kernel, tcfg.loss_chunk_tokens, world.device.type)
        self.preference: PreferenceStep | None = None
        if cfg.objective.kind == "dpo":  # DPO on pairs: the reference is precomputed, or the model with its adapters off
            vocab, reference = self.model.config.vocab_size, reference_folder(cfg)
            self.preference = PreferenceStep(cfg.objective, self.model, self.head_loss, lambda tokens: loss_chunk_tokens(
                tcfg.loss_chunk_tokens, world.device.type, vocab, None, tokens), precomputed=reference is not None)
            if reference:
                log.info("reference log-probabilities: precomputed from %s by the preparation job, read with the "
                         "pairs (no reference forward)", reference)
            else:
                log.info("reference: the model with its adapters off, a forward each micro-batch")
            self.preference_window = PreferenceWindow(world.device)
        if tcfg.grad_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.peak_memory = memory_record.PeakMemory(world.device)
        self.step_timer = step_timer.build_step_timer(world.device.type, self.peak_memory,
                                                      enabled=tcfg.step_timing and self.is_writer)

    def _distribute(self) -> dict[str, Any]:
        """``self.net``: the model under DDP, or FSDP where the memory plan says DDP cannot fit; returns the plan."""
        cfg, tcfg, world = self.cfg, self.cfg.trainer, self.world
        find_unused = gpu_choices.find_unused_parameters(lora.trainable_parameter_names(self.model))
        memory_plan = memory_record.worker_memory_plan(cfg, world.world_size, world.device, self.choices.precision,
                                                       self.choices.attn_implementation, self.model_record)
        self.parallel = parallel.resolve_parallel(tcfg, ddp_fits=memory_record.planned_parallel(memory_plan) != "fsdp")
        if self.parallel == "fsdp" and cfg.tasks.names:
            # The login node refuses this already (hpcsweep.sweep.memory_check), where its GPU's memory is known.
            raise ValueError("tasks.names is not allowed with FSDP (trainer.parallel=auto chose it: the trial does not "
                             "fit a GPU with DDP): task scores run on each rank's whole model")
        self.net = parallel.wrap_model(
            self.model, world, self.parallel, tcfg, facts=self.device_facts, precision=self.choices.precision,
            find_unused_parameters=find_unused, fixed_buckets=gpu_choices.fixed_buckets(
                deterministic=self.choices.deterministic, grad_comm=tcfg.grad_comm, find_unused=find_unused),
        )
        self.grad_comm = grad_comm.register_grad_comm(self.net, tcfg)
        return memory_plan

    def _build_training(self) -> None:
        """The data, the optimizer and its schedule, early stopping, the task scorer and the checkpoints."""
        cfg, tcfg, world = self.cfg, self.cfg.trainer, self.world
        torch.manual_seed(worker_seed(tcfg.seed, world.rank))
        # A DPO trial whose reference is precomputed reads its log-probabilities beside its pairs.
        self.corpus = corpora.load_corpus(cfg.data, self.model.config.vocab_size, tokenizer_folder(cfg.data, cfg.model),
                                          trust_remote_code=cfg.model.trust_remote_code,
                                          reference=reference_folder(cfg))
        self.optimizer = optim.build_optimizer(self.model, cfg.model, tcfg)
        self.scheduler = optim.build_scheduler(self.optimizer, cfg.model, tcfg)
        self.scaler = optim.build_grad_scaler(self.choices.precision, world.device)
        self.early = optim.EarlyStopping(tcfg.early_stop_patience, tcfg.early_stop_min_delta, tcfg.early_stop_mode)
        # best_val_loss is reported whatever early stopping watches.
        self.best_val = optim.EarlyStopping(0, 0.0)
        self.task_scorer = task_scorer.build_task_scorer(
            cfg.tasks, tokenizer_folder(cfg.data, cfg.model), rank=world.rank, world_size=world.world_size,
            trust_remote_code=cfg.model.trust_remote_code)
        self.ckpt = CheckpointManager(TrialFiles(self.trial_dir).checkpoints, keep_top_k=tcfg.keep_top_k, world=world,
                                      base_model=trained_state.base_model_identity(cfg.model, self.model_record))
        self.save_schedule = SaveSchedule(
            tcfg.ckpt_every, tcfg.ckpt_every_min, is_coordinator=self.is_writer, agree=lambda flag: any_rank(world, flag)
        )

    def _start_reporting(self, memory_plan: dict[str, Any], restarts: int, search_trial: Path | None) -> None:
        """The loop's counters, metrics.json's report, the trackers, the profiler and the telemetry thread."""
        cfg, tcfg, world, trial_dir = self.cfg, self.cfg.trainer, self.world, self.trial_dir
        tb_dir = tb_runs.trial_run_dir(trial_dir)
        if self.is_writer:
            hparams.write_trial_hparams(trial_dir, tb_dir)
        self.tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * tcfg.grad_accum * world.world_size
        self.flops_per_token = lora.training_flops_per_token(
            self.model.config, cfg.model.peft, cfg.data.seq_len, self.model)
        self.peak_flops = metrics.peak_flops(self.device_facts.name, self.choices.precision, self.choices.tf32)
        self.step = 0
        self.step_seconds = 0.0
        self.first_save_logged = False
        self.val_loss: float | None = None
        self.val_accuracy: float | None = None
        self.val_reward: dict[str, float] = {}
        self.first_chosen_logps: float | None = None
        """``objective=dpo``: the trial's first log window's ``logps/chosen`` (checkpointed, so a resumed trial keeps it)."""
        """``objective=dpo``: the last evaluation's ``val_reward_accuracy`` and ``val_reward_margin``."""
        self.evaluated_at: int | None = None
        # A search trial reports each evaluation to its study, which may prune it.
        self.pruning = pruning_reporter(search_trial)
        self.report = metrics_file.new_report(
            max_steps=tcfg.max_steps, world_size=world.world_size, restarts=restarts, env=os.environ
        )
        me = {"rank": world.rank, "local_rank": world.local_rank, "node": node_name(os.environ), "pid": os.getpid()}
        ranks = all_gather_objects(world, me)
        self.report["ranks"] = ranks
        self.report["nodes"] = sorted({r["node"] for r in ranks})
        self.logger = backends.build_loggers(cfg.logging, rank=world.rank, world_size=world.world_size, tb_dir=tb_dir,
                                             trial_dir=trial_dir, nodes=self.report["nodes"])
        # Exact resume on CPU holds at one intra-op thread count: a reduction split over threads sums in another order.
        self.report.update(device_name=self.device_facts.name, parallel=self.parallel,
                           intra_op_threads=torch.get_num_threads(), **dataclasses.asdict(self.choices))
        self.report["memory_plan"] = memory_plan
        if (fill := corpora.fill_rate(self.corpus)) is not None:
            self.report["fill_rate"] = fill
        self.profiler = StepProfiler(tcfg, trial_dir, rank=world.rank, world_size=world.world_size, device=world.device,
                                     is_reader=self.is_writer, on_trace=lambda summary: self.write_report(profile=summary))
        log.info("device %s: %s", self.device_facts.name or "cpu", self.choices)
        self.telemetry = TrialTelemetry.start(tcfg.telemetry_every_s, device_type=world.device.type, ranks=ranks,
                                              rank=world.rank, gather=lambda obj: all_gather_objects(world, obj),
                                              is_writer=self.is_writer)

    # ----- checkpoints -------------------------------------------------------------------------

    def trainer_state(self, status: str) -> dict[str, Any]:
        """What a checkpoint holds besides weights, optimizer and RNG: plain state, as rank 0 has it.

        ``step`` is also the sampler position.
        """
        return {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early.state_dict(),
            "best_val_loss": self.best_val.best,
            "status": status,
            "restarts": self.report["restarts"],
            "first_chosen_logps": self.first_chosen_logps,
        }

    def save(self, status: str, *, wait: bool) -> None:
        """Save a checkpoint of the current step (a collective: every rank must call it).

        In the background unless ``wait``: a stop and the end of training wait until it is durable.
        """
        self.save_schedule.saved()
        with self.step_timer.phase("checkpoint"):
            self.ckpt.save(
                model=self.model, optimizer=self.optimizer, trainer_state=self.trainer_state(status),
                # A checkpoint's name carries the loss of its own step, not of the last evaluation before it.
                step=self.step, val_loss=self.val_loss if self.evaluated_at == self.step else None, wait=wait,
                comm_state=self.grad_comm.state_bytes(self.model, self.optimizer) if self.grad_comm else None,
            )

    def log_first_save(self) -> None:
        """Once this run's first save is durable, log how long it took against the stop signal's lead."""
        if self.first_save_logged or self.ckpt.first_save is None:
            return
        self.first_save_logged = True
        if self.is_writer:
            save_s, size = self.ckpt.first_save
            warn, line = first_save_message(save_s, self.step_seconds, size, self.signal_delay_s)
            log.log(logging.WARNING if warn else logging.INFO, "%s", line)

    def resume(self) -> bool:
        """Load the newest usable checkpoint, if any; True when one was loaded."""
        state = self.ckpt.resume(self.model, self.optimizer, comm_state=bool(self.grad_comm and self.grad_comm.state))
        if state is None:
            return False
        if state.get("comm_state"):
            self.grad_comm.load_state_bytes(state["comm_state"], self.model, self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.early.load_state_dict(state["early_stopping"])
        # A checkpoint from before early stopping could watch another metric: its best was the loss's.
        self.best_val.best = float(state.get("best_val_loss", state["early_stopping"]["best"]))
        self.step, self.val_loss = state["step"], state["val_loss"]
        self.first_chosen_logps = state.get("first_chosen_logps")
        if not state["rng_restored"]:
            log.warning("checkpoint has RNG states of %d ranks, not %d: reseeding", state["world_size"], self.world.world_size)
            torch.manual_seed(worker_seed(self.cfg.trainer.seed + self.step, self.world.rank))
        log.info("resumed from %s at step %d", state["path"].name, self.step)
        return True

    # ----- steps -------------------------------------------------------------------------------

    def _attention(self, batch: Batch) -> dict[str, Any]:
        """What a forward of ``batch`` (still on the CPU) passes besides its inputs and position ids: the
        samples of a packed row kept apart by hpcsweep (``hpcsweep.train.data.sample_attention``), no KV cache."""
        return sample_attention.forward_kwargs(batch.position_ids, self.choices.attn_implementation,
                                               own_code=self.own_code, dtype=self.weights_dtype,
                                               device=self.world.device)

    def _logits(self, net: torch.nn.Module, batch: Batch, attention: dict[str, Any]) -> torch.Tensor:
        with optim.autocast_context(self.choices.precision, self.world.device):
            return net(input_ids=batch.inputs, position_ids=batch.position_ids, **attention).logits

    def _loss(self, batch: Batch, attention: dict[str, Any], net: torch.nn.Module) -> torch.Tensor:
        if self.head_loss is not None:  # the head takes the loss, a chunk of logits at a time
            with self.head_loss.taking(batch.targets) as taken:
                self._logits(net, batch, attention)
            return taken.loss
        logits = self._logits(net, batch, attention)
        # The logits are this step's alone: their gradient may take their place (hpcsweep.train.loss).
        return chunked_cross_entropy(logits, batch.targets, self.cfg.trainer.loss_chunk_tokens, overwrite_logits=True)

    def loss_divisors(self, batches: Sequence[Batch]) -> list[float]:
        """What each micro-batch's mean loss is divided by, so the step's loss (and gradient, once DDP
        averages it over ranks) is the mean over every target of the step: the step's loss tokens over
        the micro-batch's, times the ranks. Rows of samples hold different counts, summed over the ranks
        in one collective; windows hold the same, and the divisor is ``grad_accum``."""
        counts = [batch.loss_tokens for batch in batches]
        world_size = self.world.world_size
        step_total = (counts[0] * len(counts) * world_size if corpora.same_loss_tokens(self.corpus)
                      else sum_over_ranks(self.world, [sum(counts)])[0])
        return [step_total / (count * world_size) for count in counts]

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (loss, grad norm)."""
        tcfg, world = self.cfg.trainer, self.world
        total = torch.zeros((), device=world.device)
        self.step_timer.enter("data")
        batches = [
            corpora.get_rows(self.corpus, self.cfg.data, split="train", step=self.step, rank=world.rank,
                             micro_step=micro, world_size=world.world_size, grad_accum=tcfg.grad_accum)
            for micro in range(tcfg.grad_accum)
        ]
        for micro, (batch, divisor) in enumerate(zip(batches, self.loss_divisors(batches))):
            self.step_timer.enter("data")
            attention = self._attention(batch)
            routed = routed_tokens(batch, world.device)
            batch = batch.to(world.device)
            self.step_timer.enter("compute")
            last = micro == tcfg.grad_accum - 1
            # Gradients are reduced once, on the last micro-step.
            with parallel.gradient_sync(self.net, sync=last):
                if self.preference is not None:
                    pairs = self.preference.pair_losses(batch, self.net,
                                                        lambda net: self._logits(net, batch, attention))
                    self.preference_window.add(pairs)
                    loss = pairs.losses.mean() / divisor
                else:
                    loss = self._loss(batch, attention, self.net) / divisor
                # The router balance loss trains, but train/loss stays the LM loss that val/loss compares with.
                aux = self.balance.take_aux_loss(routed)
                self.scaler.scale(loss + aux / tcfg.grad_accum).backward()
            total += loss.detach()
        self.step_timer.enter("optimizer")
        self.scaler.unscale_(self.optimizer)
        max_norm = tcfg.grad_clip if tcfg.grad_clip > 0 else math.inf
        grad_norm = parallel.clip_grad_norm(self.model, max_norm)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # A step the fp16 scaler skipped (inf or NaN gradients, its scale lowered) moved no weight: it moves no bias.
        skipped = scale is not None and self.scaler.get_scale() < scale
        self.balance.after_optimizer_step(world, skipped=skipped)
        if self.grad_comm:
            self.grad_comm.after_step(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step_timer.enter(step_timer.OTHER)
        self.step += 1
        return total, grad_norm

    def _loss_and_accuracy(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of one validation batch (on the CPU), and ``(correct, counted)`` next-token predictions
        (``IGNORE_INDEX`` targets take no part in either)."""
        attention = self._attention(batch)
        batch = batch.to(self.world.device)
        if self.head_loss is not None:  # a chunk of logits at a time, as in training: no more memory than a step
            with self.head_loss.scoring(batch.targets) as scored:
                self._logits(self.model, batch, attention)
            return scored.loss, scored.accuracy_counts
        logits = self._logits(self.model, batch, attention)
        loss = chunked_cross_entropy(logits, batch.targets, self.cfg.trainer.loss_chunk_tokens)
        return loss, metrics.accuracy_counts(logits, batch.targets)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches, averaged over ranks; the next-token accuracy
        over the same batches goes to ``self.val_accuracy`` (``objective=dpo``: ``evaluate_pairs``)."""
        tcfg, world = self.cfg.trainer, self.world
        if self.preference is not None:
            return self.evaluate_pairs()
        self.model.eval()
        total = torch.zeros((), device=world.device)
        counts = torch.zeros(2, device=world.device, dtype=torch.float64)
        for i in range(tcfg.eval_batches):
            batches = [
                corpora.get_rows(self.corpus, self.cfg.data, split="val", step=i, rank=world.rank,
                                 micro_step=micro, world_size=world.world_size, grad_accum=tcfg.grad_accum)
                for micro in range(tcfg.grad_accum)
            ]
            for batch, divisor in zip(batches, self.loss_divisors(batches)):
                # Each evaluation batch weighs as a step: by its targets (windows: 1, as they all hold as many).
                loss, batch_counts = self._loss_and_accuracy(batch)
                total += loss * (tcfg.grad_accum / divisor)
                counts += batch_counts
        self.model.train()
        correct, counted = (mean_over_ranks(world, counts) * world.world_size).tolist()
        self.val_accuracy = correct / counted if counted else None
        return mean_over_ranks(world, total / (tcfg.eval_batches * tcfg.grad_accum)).item()

    @torch.no_grad()
    def evaluate_pairs(self) -> float:
        """``objective=dpo``: the mean DPO loss over every pair of the fixed validation batches of every rank; the
        pairs' reward accuracy (the share whose chosen answer's reward beats the rejected one's) and mean reward
        margin go to ``self.val_reward``."""
        tcfg, world = self.cfg.trainer, self.world
        assert self.preference is not None
        self.model.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=world.device)
        for i in range(tcfg.eval_batches):
            for micro in range(tcfg.grad_accum):
                batch = corpora.get_rows(self.corpus, self.cfg.data, split="val", step=i, rank=world.rank,
                                         micro_step=micro, world_size=world.world_size, grad_accum=tcfg.grad_accum)
                attention = self._attention(batch)
                batch = batch.to(world.device)
                pairs = self.preference.pair_losses(batch, self.model, lambda net: self._logits(net, batch, attention))
                sums += torch.stack([pairs.losses.double().sum(), pairs.metrics["rewards/accuracies"].double().sum(),
                                     pairs.metrics["rewards/margins"].double().sum(),
                                     torch.tensor(float(batch.pairs), dtype=torch.float64, device=world.device)])
        self.model.train()
        loss, accurate, margin, count = (mean_over_ranks(world, sums) * world.world_size).tolist()
        self.val_accuracy = None
        self.val_reward = {"val_reward_accuracy": accurate / count, "val_reward_margin": margin / count}
        return loss / count

    # ----- the loop ----------------------------------------------------------------------------

    def fit(self) -> int:
        """Train to ``max_steps``, an early stop, or a stop request; returns the exit code.

        A failure inside a profile window writes its trace so far before it is raised on."""
        try:
            return self.train_to_the_end()
        except Exception:
            self.profiler.write_after_failure()
            raise

    def train_to_the_end(self) -> int:
        tcfg = self.cfg.trainer
        self.write_report()
        window_start, window_steps = time.perf_counter(), 0
        fit_start, first_step = time.perf_counter(), self.step
        self.step_timer.start(self.step, earlier_total=self.report.get("step_time_total"))
        while self.step < tcfg.max_steps:
            with self.profiler.step(self.step + 1):
                loss, grad_norm = self.train_step()
            window_steps += 1
            self.step_seconds = (time.perf_counter() - fit_start) / (self.step - first_step)
            for hook in self.hooks:
                hook(self, self.step)
            if self.step % tcfg.log_every == 0 or self.step == tcfg.max_steps:
                elapsed = time.perf_counter() - window_start
                with self.step_timer.phase("logging"):
                    self.log_train(loss, grad_norm, window_steps / elapsed)
                window_start, window_steps = time.perf_counter(), 0
            evaluated = self.step % tcfg.eval_every == 0 or self.step == tcfg.max_steps
            scored = self.task_scorer_due()
            if evaluated or scored:
                stop = self.log_eval(self.evaluate()) if evaluated else False
                if scored:
                    stop = self.log_tasks() or stop
                if stop:
                    if self.cfg.tasks.names and not scored:
                        self.log_tasks()  # a trial that stops early ends with its task scores
                    return self.finish("stopped_early")
                if self.pruned(evaluated, scored):
                    return self.finish("pruned")
            if self.step == tcfg.max_steps:
                break
            # A profile request (read by rank 0) is agreed in the same collective as the stop.
            stop_flag, asked_steps = max_over_ranks(self.world, [self.stop_event.is_set(), self.profiler.asked_steps()])
            stop = bool(stop_flag)
            self.profiler.take_request(0 if stop else asked_steps, self.step)
            if stop or self.save_schedule.due(self.step):
                self.save("running", wait=stop)
            with self.step_timer.phase("checkpoint"):
                self.ckpt.poll()
            self.log_first_save()
            if stop:
                # The reason is known on the ranks that saw the signal or stop file, maybe not on rank 0.
                reasons = all_gather_objects(self.world, self.stop_event.reason)
                reason = next((r for r in reasons if r), None)
                # Whether the trial is requeued is its runner's decision, not this worker's (a local stop never is).
                log.info("stop requested (%s): saved at step %d, stopped", reason, self.step)
                self.profiler.close()
                self.report_speed_if_unlogged()
                self.write_report(last_stop_reason=reason)
                self.stop_event.clear()
                return EXIT_STOPPED
        return self.finish("completed")

    def log_train(self, loss: torch.Tensor, grad_norm: torch.Tensor, steps_per_s: float) -> None:
        """Report the (rank-averaged) train loss, lr, grad norm, throughput and the window's step time."""
        tokens_per_s = steps_per_s * self.tokens_per_step
        mfu = metrics.mfu(tokens_per_s, self.flops_per_token, self.world.world_size, self.peak_flops)
        window = self.step_timer.end_window(self.step, tokens_per_s=tokens_per_s, mfu=mfu)
        scalars = {
            "train/loss": mean_over_ranks(self.world, loss).item(),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": grad_norm.item(),
            "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": mfu,
            **step_timer.tensorboard_scalars(window),
        }
        if self.preference is not None:  # TRL's names: rewards/chosen, ..., logps/rejected
            window = self.preference_window.take(self.world)
            scalars.update(window)
            if window:  # report --efficiency compares the latest logps/chosen with the first (results.efficiency)
                if self.first_chosen_logps is None:
                    self.first_chosen_logps = window["logps/chosen"]
                self.report["preference"] = {"logps_chosen_first": self.first_chosen_logps,
                                             "logps_chosen": window["logps/chosen"],
                                             "rewards_accuracy": window["rewards/accuracies"]}
        router = self.balance.window_report(self.world)
        self.logger.log({**scalars, **router_stats.tensorboard_scalars(router)}, self.step)
        self.telemetry.log_window(self.step, self.logger)
        if router:
            self.report["router"] = router
        self.report.update(
            train_loss=scalars["train/loss"], lr=scalars["train/lr"], grad_norm=scalars["train/grad_norm"],
            tokens_per_s=tokens_per_s, mfu=scalars["perf/mfu"], **self.step_timer.report(),
        )
        self.write_report()
        log.info("step %d loss %.4f lr %.3g %.0f tok/s", self.step, scalars["train/loss"], scalars["train/lr"], tokens_per_s)

    def log_eval(self, val_loss: float) -> bool:
        """Report a validation loss (and ``self.val_accuracy``); True when early stopping says stop."""
        self.val_loss, self.evaluated_at = val_loss, self.step
        self.best_val.update(val_loss)
        stop = self.early_stop_says({"val_loss": val_loss, "val_accuracy": self.val_accuracy, **self.val_reward})
        with self.step_timer.phase("logging"):
            self.logger.log({"val/loss": val_loss, "val/accuracy": self.val_accuracy,
                             **{k.replace("val_", "val/", 1): v for k, v in self.val_reward.items()},
                             "hparams/best_val_loss": self.best_val.best}, self.step)
            self.report.update(val_loss=val_loss, val_accuracy=self.val_accuracy, best_val_loss=self.best_val.best,
                               **self.val_reward)
            self.write_report()
            log.info("step %d val_loss %.4f", self.step, val_loss)
        return stop

    def early_stop_says(self, measured: dict[str, Any]) -> bool:
        """Feed early stopping the watched metric when ``measured`` holds it; True when it says stop.
        Every rank holds the same ``measured``, so every rank decides alike."""
        value = metric_value(measured, self.cfg.trainer.early_stop_metric)
        return False if value is None else self.early.update(value)

    def task_scorer_due(self) -> bool:
        """Whether the trial's lm-eval tasks run after this step (``tasks.every``, and at the end)."""
        tasks = self.cfg.tasks
        return bool(tasks.names) and task_scorer.is_due(self.step, tasks.every, self.cfg.trainer.max_steps)

    def log_tasks(self) -> bool:
        """Score the tasks, each rank its share (rank 0 sends the gathered scores to all), report them; True when
        early stopping says stop. The step hooks run again meanwhile (with this step): the hang watchdog's heartbeat."""
        with optim.autocast_context(self.choices.precision, self.world.device):
            scores = self.task_scorer.score(self.model, heartbeat=lambda: [hook(self, self.step) for hook in self.hooks])
        scores = broadcast_object(self.world, scores)
        with self.step_timer.phase("logging"):
            self.logger.log(task_scorer.tensorboard_scalars(scores), self.step)
            self.report[TASKS_KEY] = scores
            self.write_report()
            log.info("step %d tasks %s", self.step, scores)
        return self.early_stop_says({TASKS_KEY: scores})

    def pruned(self, evaluated: bool = True, scored: bool = False) -> bool:
        """In a search trial: rank 0 reports the objective and asks the pruner; every rank follows.

        The objective counts only at a step that measured it: metrics.json's values at an evaluation
        (``evaluated``), task scores where the tasks ran (``scored``). Never at the last step: the
        trial has completed by then.
        """
        if self.pruning is None:
            return False
        if self.is_writer:
            measured = {k: v for k, v in self.report.items() if k != TASKS_KEY} if evaluated else {}
            if scored:
                measured[TASKS_KEY] = self.report[TASKS_KEY]
            self.pruning.report(self.step, measured)
        last = self.step == self.cfg.trainer.max_steps
        prune = any_rank(self.world, self.is_writer and not last and self.pruning.should_prune())
        if prune:
            self.logger.log({PRUNED_STEP_TAG: float(self.step)}, self.step)
            log.info("step %d: pruned by the search's pruner", self.step)
        return prune

    def report_speed_if_unlogged(self) -> None:
        """Give metrics.json a ``tokens_per_s`` when no log window ended in this run (it stopped first).

        Measured over the steps this run did; a run that did none says so in ``tokens_per_s_unknown``.
        """
        if self.report.get("tokens_per_s") is not None:
            return
        if self.step_seconds > 0:
            self.report.update(tokens_per_s=self.tokens_per_step / self.step_seconds,
                               tokens_per_s_over="the steps before the stop: no log window ended")
        else:
            self.report.update(tokens_per_s_unknown="stopped before its first step")

    def finish(self, status: str) -> int:
        """Save the final checkpoint and report the final weights (hashed on the one rank that reports)."""
        self.profiler.close()
        self.save(status, wait=True)
        self.log_first_save()
        self.report_speed_if_unlogged()
        # What trains (LoRA: the adapters), whole; with FSDP a collective, gathered on rank 0.
        weights = parallel.full_trained_state_dict(self.model)
        if self.is_writer:
            self.report.update(status=status, weights_sha256=metrics.weights_sha256(weights))
        self.write_report()
        log.info("trial %s at step %d, weights sha256 %s", status, self.step, self.report["weights_sha256"])
        return EXIT_OK

    def write_report(self, **extra: Any) -> None:
        """Rewrite metrics.json (rank 0 only)."""
        if self.is_writer:
            self.report.update(step=self.step, memory_peak=self.peak_memory.trial_peak(),
                               **self.telemetry.report_fields(), **self.logger.report_fields(), **extra)
            metrics_file.write_metrics(TrialFiles(self.trial_dir).metrics, self.report)

    def close(self) -> None:
        """Wait for the save under way, flush and close the logger, and put torch's process-wide flags
        (determinism, TF32) back as the trial found them (safe to call twice)."""
        try:
            self.telemetry.close()
            self.ckpt.close()
            # The trackers' runs end (or pause, for a trial stopped to be requeued) with the trial.
            self.logger.finish(self.report["status"], self.report)
            self.write_report()
        finally:
            self.logger.close()
            self.logger = metrics.Logger()
            gpu_choices.restore_backend_settings(self.backend_before)

