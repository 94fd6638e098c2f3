"""DPO pairs/s of hpcsweep's trainer against TRL's ``DPOTrainer``, and what the shared reference saves a sweep.

    python benchmarks/dpo.py [--shape moe256] [--pairs 128] [--batch 4] [--steps 10] [--seq-len 256] [--rank 8]
                             [--no-expert-lora] [--contenders NAME ...] [--json FILE]

One model folder, made as users bring one (``tests/model_folders.make_model_folder``: ``DeepseekV3Config``'s
defaults with sizes only changed, ``save_pretrained`` safetensors, a trained tokenizer with ChatML's turn markers;
``--shape`` takes ``benchmarks/finetune.py``'s shapes, ``moe256`` being DeepSeek-V3's MoE at 1/32 of its widths),
and one preference file: ``--pairs`` pairs whose prompt asks to repeat 8-24 words, the chosen answer repeating
them and the rejected one other words, rendered by Qwen 3's real chat template (``tests/data``). The same settings
on both sides: LoRA r (``model.lora.r``, hpcsweep's targets: attention, dense and shared MLPs and every routed
expert, given to TRL as the same ``peft.LoraConfig``), alpha, no dropout, lr, AdamW with weight decay 0.1,
gradient clipping at 1.0, beta 0.1, the sigmoid loss, ``--batch`` pairs a step, ``--seq-len`` (hpcsweep's
``data.seq_len``, TRL's ``max_length``), fp32, CPU. Each step visits the same pairs on every side (TRL's dataset is
hpcsweep's order, read sequentially).

The contenders, each a training step as its trainer runs it (their reference is the model with its adapters off):

- ``hpcsweep``: ``Trainer.train_step`` of a ``model.peft=lora objective=dpo`` trial (``hpcsweep.train.trainer``):
  the micro-batch's pairs packed into ``seq_len`` rows, a reference forward without gradients, the policy's
  forward and backward (each answer's log-probability at the LM head, ``answer_logps``), the optimizer step.
- ``hpcsweep, precomputed``: the same trainer reading the reference's log-probabilities that the preparation job
  computed (``hpcsweep.prepare.reference_logps``) with the rows: no reference forward
  (``objective.precompute_reference=true``; ``hpcsweep`` above is ``false``). In a checkout without that switch,
  whose LoRA trials always run the reference forward, the trainer is handed the rows with the numbers as a
  ``model.peft=none`` trial reads them: the step such a trial would run.
- ``hpcsweep, unpacked`` (only when named): ``data.packing=false``, one sequence a row padded to ``data.seq_len``.
- ``TRL``: ``DPOTrainer(..., peft_config=...)`` with ``precompute_ref_log_probs=False``, its own loop
  (``Trainer.train``) and collator (``DataCollatorForPreference``: chosen then rejected rows padded to the
  batch's longest; TRL 1.16 has turned ``padding_free`` off "after a refactor"): a reference forward with the
  adapters disabled every step, then the policy's.
- ``TRL, precomputed``: the same with ``precompute_ref_log_probs=True``: TRL computes the reference's
  log-probabilities of its whole dataset in ``DPOTrainer.__init__`` (adapters disabled), then no reference forward
  a step. That pass is timed too: it runs once per ``DPOTrainer``, i.e. once per trial (it is cached in the
  dataset's cache files, which an in-memory dataset such as this one keeps in a temporary folder).

``--no-expert-lora`` (``model.lora.experts=false`` on both sides) leaves the routed experts frozen: with them
adapted, TRL runs peft's ``ParamWrapper`` (its fold ``W + s·B·A`` of every expert tensor) where hpcsweep runs
``expert_lora``'s grouped GEMMs, so the frozen run is the one whose difference is the DPO step alone. The
output also says whether TRL tokenized every answer as hpcsweep's preparation did, and how many parameters each
side trains (the same ``peft.LoraConfig``: the same count).

Method (``benchmarks/README.md``): the contenders alternate step by step in this one process, the order rotated
every step, one thread (``torch.set_num_threads(1)``), CPU time (``time.process_time``: the other contenders
wait, blocked, while one runs; a TRL trainer runs its own ``train()`` in a thread that hands control back at
each ``on_step_end``, so its step is its loop's whole iteration, data included); each contender's first step is
left out; medians. It prints pairs/s and the ratio line ``hpcsweep/TRL pairs/s X.XX`` (the like-with-like pair:
a reference forward a step on both sides).

Then the shared reference on a sweep of 4 LoRA trials, each one epoch over the training pairs: computing the
reference in every trial costs 4 x (the reference forward's CPU time in hpcsweep's step, measured inside each
measured step of ``hpcsweep``, median) x (steps of an epoch); computing it once costs the preparation job's
``hpcsweep.prepare.reference_logps`` over every pair of the file, model load included, measured here. It
prints ``shared reference saves X.X s of Y.Y s (4 trials)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")  # a TRL trainer's thread starts with one intra-op thread too
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from finetune import SHAPES  # noqa: E402  (benchmarks/ is sys.path[0] as a script)

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict  # noqa: E402
from hpcsweep.files.token_cache import OFFSETS_NAME, SPANS_NAME, chat_rendering, text_corpus  # noqa: E402
from hpcsweep.files.token_file import read_token_header  # noqa: E402
from tests.chat_fixtures import REAL_TEMPLATES  # noqa: E402
from tests.model_folders import WORDS, make_model_folder  # noqa: E402

CONTENDERS = ("hpcsweep", "hpcsweep, precomputed", "TRL", "TRL, precomputed")
OPTIONAL = ("hpcsweep, unpacked",)
"""Named with ``--contenders`` only: ``data.packing=false``, one sequence a row padded to ``data.seq_len``."""
LIKE_WITH_LIKE = ("hpcsweep", "TRL")
"""The ratio line's pair: both run a reference forward with the adapters off every step."""
TRIALS = 4
BETA, LR = 0.1, 1e-4


def preference_pairs(count: int, seed: int = 0) -> list[dict[str, str]]:
    """Pairs whose chosen answer repeats the prompt's 8-24 words and whose rejected one says other words."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 24))]
        pairs.append({"prompt": "Repeat: " + " ".join(words), "chosen": " ".join(words),
                      "rejected": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24)))})
    return pairs


def settings_of(args: argparse.Namespace, folder: Path, files: str, cache: str, template: str) -> dict[str, Any]:
    return {
        "model.path": str(folder), "model.peft": "lora", "model.lr": LR, "model.lora.r": args.rank,
        "model.lora.alpha": 2.0 * args.rank, "model.lora.dropout": 0.0,
        "model.lora.experts": not args.no_expert_lora,
        "objective.kind": "dpo", "objective.beta": BETA, "objective.loss": "sigmoid",
        "data.kind": "preference", "data.files": files, "data.cache_dir": cache, "data.chat_template": template,
        "data.packing": None,  # what data=preference gives: packed (DataConfig resolves null by data.kind)
        "data.seq_len": args.seq_len, "data.batch_size": args.batch, "data.val_fraction": 0.05,
        "trainer.device": "cpu", "trainer.max_steps": 10_000, "trainer.warmup_steps": 0, "trainer.grad_clip": 1.0,
        "trainer.weight_decay": 0.1, "trainer.log_every": 10_000, "trainer.eval_every": 10_000,
        "trainer.ckpt_every": 0, "trainer.telemetry_every_s": 0, "logging.backends": [],
    }


def trial_config(settings: dict[str, Any]):
    """The trial config of ``settings`` (``{"group.key": value}``) over the defaults, as a sweep's trial gets it."""
    cfg = trial_config_to_dict(trial_config_from_dict({}))
    for key, value in settings.items():
        *groups, name = key.split(".")
        node = cfg
        for group in groups:
            node = node[group]
        node[name] = value
    return trial_config_from_dict(cfg)


class Timed:
    """CPU seconds of each call of ``fn``, kept in ``seconds``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.seconds = fn, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds.append(time.process_time() - start)


def has_precompute_switch() -> bool:
    """Whether this checkout's trials choose their reference route (``objective.precompute_reference``)."""
    from hpcsweep.config import ObjectiveConfig

    return "precompute_reference" in {f.name for f in dataclasses.fields(ObjectiveConfig)}


class HpcsweepRunner:
    """A hpcsweep trial's trainer, one ``train_step`` at a time; its reference forwards timed apart."""

    def __init__(self, name: str, trainer: Any, *, precomputed: bool) -> None:
        self.name, self.trainer, self.seconds = name, trainer, []
        if precomputed != trainer.preference.precomputed:
            # A checkout without objective.precompute_reference, whose LoRA trials always run the reference forward:
            # the rows carry the preparation job's numbers as a model.peft=none trial's do, the step it would run.
            from hpcsweep.train.data import corpora

            assert precomputed and not has_precompute_switch()
            cfg = trainer.cfg
            trainer.corpus = corpora.load_corpus(cfg.data, trainer.model.config.vocab_size, cfg.model.path,
                                                 reference=cfg.model.path)
            trainer.preference.precomputed = True
        self.reference = Timed(trainer.preference.reference_logps)
        trainer.preference.reference_logps = self.reference

    def step(self) -> None:
        start = time.process_time()
        self.trainer.train_step()
        self.seconds.append(time.process_time() - start)

    def positions(self, steps: int) -> int:
        """Row positions (rows x seq_len) the forwards of ``steps`` steps compute."""
        from hpcsweep.train.data import corpora

        cfg = self.trainer.cfg
        return sum(corpora.get_rows(self.trainer.corpus, cfg.data, split="train", step=s, rank=0, micro_step=0,
                                    world_size=1, grad_accum=1).inputs.numel() for s in range(steps))

    def close(self) -> None:
        self.trainer.close()


class TrlRunner:
    """A TRL trainer running its own ``train()`` in a thread that waits at each ``on_step_end`` for the next turn."""

    def __init__(self, name: str, trainer: Any) -> None:
        from transformers import TrainerCallback

        self.name, self.trainer, self.seconds, self.positions_seen = name, trainer, [], 0
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.error: BaseException | None = None
        runner = self

        class Baton(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                runner.seconds.append(time.process_time() - runner.start)
                runner.done.release()
                runner.go.acquire()
                runner.start = time.process_time()

        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # its end-of-training metrics line
        trainer.add_callback(Baton())
        collate = trainer.data_collator

        def counted(examples):  # the positions each forward computes: 2 x batch rows, padded to the longest
            batch = collate(examples)
            self.positions_seen += batch["input_ids"].numel()
            return batch

        trainer.data_collator = counted
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.go.acquire()
        self.start = time.process_time()
        try:
            self.trainer.train()
        except BaseException as err:  # handed to the main thread
            self.error = err
        finally:
            self.done.release()

    def step(self) -> None:
        self.go.release()
        self.done.acquire()
        if self.error is not None:
            raise RuntimeError(f"{self.name}: {self.error!r}") from self.error

    def close(self) -> None:
        self.go.release()  # the last step's on_step_end: let train() finish
        self.thread.join(timeout=120)


def trl_dataset(pairs: list[dict[str, str]]):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p["prompt"]}],
                               "chosen": [{"role": "assistant", "content": p["chosen"]}],
                               "rejected": [{"role": "assistant", "content": p["rejected"]}]} for p in pairs])


def trl_trainer(name: str, args: argparse.Namespace, folder: Path, template: str, pairs: list[dict[str, str]],
                peft_config: Any, out: Path, *, precompute: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = Path(template).read_text()
    config = DPOConfig(
        output_dir=str(out / name.replace(" ", "_").replace(",", "").replace("'", "")), report_to=[],
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=0,
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=1, max_steps=args.steps,
        learning_rate=LR, weight_decay=0.1, max_grad_norm=1.0, lr_scheduler_type="constant",
        beta=BETA, loss_type=["sigmoid"], max_length=args.seq_len, padding_free=False,
        precompute_ref_log_probs=precompute, precompute_ref_batch_size=args.batch,
        train_sampling_strategy="sequential", dataloader_num_workers=0,
        logging_steps=10_000, save_strategy="no", eval_strategy="no", disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return DPOTrainer(model=model, args=config, train_dataset=trl_dataset(pairs), processing_class=tokenizer,
                      peft_config=peft_config)


def visiting_order(trainer: Any, pairs: list[dict[str, str]], corpus: Any, count: int) -> list[dict[str, str]]:
    """The first ``count`` pairs hpcsweep's training steps visit, as the file's pairs (matched by their tokens)."""
    header = read_token_header(corpus.token_path)
    tokens = np.memmap(corpus.token_path, dtype=header.dtype, mode="r")
    offsets = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)
    of_sequence = {tuple(tokens[offsets[2 * i] : offsets[2 * i + 1]].tolist()): i for i in range(len(pairs))}
    rows = trainer.corpus.train
    order = []
    for position in range(count):
        pair = rows.pair_at(position)
        start, n = int(rows.starts[2 * pair]), int(rows.lengths[2 * pair])
        order.append(pairs[of_sequence[tuple(rows.tokens[start : start + n].tolist())]])
    return order


def check_same_tokens(trl: Any, corpus: Any, order: list[dict[str, str]], pairs: list[dict[str, str]]) -> str:
    """Whether TRL tokenized each answer as hpcsweep's preparation did: the same prompt ids and answer ids, TRL's
    answer one token longer (the newline its template writes after the end-of-turn token, which TRL scores)."""
    header = read_token_header(corpus.token_path)
    tokens = np.memmap(corpus.token_path, dtype=header.dtype, mode="r")
    offsets = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)
    spans = np.fromfile(corpus.entry / SPANS_NAME, dtype=np.int64).reshape(-1, 2)
    index = {json.dumps(p, sort_keys=True): i for i, p in enumerate(pairs)}
    same = total = extra = 0
    for row, pair in zip(trl.train_dataset, order):
        i = index[json.dumps(pair, sort_keys=True)]
        for k, key in enumerate(("chosen_ids", "rejected_ids")):
            sequence = tokens[offsets[2 * i + k] : offsets[2 * i + k + 1]].tolist()
            lo, hi = (int(v) for v in spans[2 * i + k])
            total += 1
            same += sequence[:lo] == row["prompt_ids"] and sequence[lo:hi] == row[key][: hi - lo]
            extra += len(row[key]) - (hi - lo)
    return f"{same} of {total} answers tokenized alike (TRL scores {extra / max(total, 1):.1f} more token an answer)"


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from hpcsweep.prepare.reference_logps import reference_logps, write_reference_logps
    from hpcsweep.prepare.text_tokens import write_entry
    from hpcsweep.train import lora
    from hpcsweep.train.distributed import init_distributed
    from hpcsweep.train.trainer import Trainer

    made, load_before = time.perf_counter(), os.getloadavg()
    folder = make_model_folder(workdir / "folder", chat_markers=True, **SHAPES[args.shape])
    pairs = preference_pairs(args.pairs)
    (workdir / "pairs").mkdir()
    (workdir / "pairs" / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    files, cache, template = str(workdir / "pairs" / "*.jsonl"), str(workdir / "cache"), str(REAL_TEMPLATES["qwen3"])
    corpus = text_corpus(files, str(folder), cache, "data.tokenizer", chat_rendering(template, "assistant"),
                         preference=True)
    write_entry(corpus, workers=1)  # the preparation job's tokenization
    # The preparation job's reference pass over every pair, model load included: the sweep's one-time cost.
    start = time.process_time()
    reference_logps(corpus, str(folder))
    prepare_s = time.process_time() - start
    write_reference_logps(corpus, str(folder))  # the file the precomputed contender reads (its own pass, untimed)

    settings = settings_of(args, folder, files, cache, template)
    cfg = trial_config(settings)
    world = init_distributed("cpu", 60, env={})
    runners: dict[str, Any] = {}
    wanted = args.contenders
    for name in ("hpcsweep", "hpcsweep, precomputed", "hpcsweep, unpacked"):
        if name in wanted or name == "hpcsweep":  # the TRL side and the sweep read the first
            (workdir / name.replace(", ", "-")).mkdir()
            precomputed = name.endswith("precomputed")
            own = {**settings, "data.packing": False} if name.endswith("unpacked") else settings
            if has_precompute_switch():
                own = {**own, "objective.precompute_reference": precomputed}
            trainer = Trainer(trial_config(own), world, workdir / name.replace(", ", "-"))
            runners[name] = HpcsweepRunner(name, trainer, precomputed=precomputed)
    first = runners["hpcsweep"].trainer
    order = visiting_order(first, pairs, corpus, args.steps * args.batch)
    # The trial's own LoraConfig, of the folder's model as loaded (before any adapter wraps its modules).
    from transformers import AutoModelForCausalLM

    peft_config = lora.peft_config(cfg.model, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    trl_setup: dict[str, float] = {}
    from trl import DPOTrainer

    plain_precompute = DPOTrainer._precompute_ref_logps
    for name in ("TRL", "TRL, precomputed"):
        if name not in wanted:
            continue
        timed = Timed(plain_precompute)
        DPOTrainer._precompute_ref_logps = lambda self, *a, _t=timed, **k: _t(self, *a, **k)
        try:
            trainer = trl_trainer(name, args, folder, template, order, peft_config, workdir,
                                  precompute=name == "TRL, precomputed")
        finally:
            DPOTrainer._precompute_ref_logps = plain_precompute
        if timed.seconds:
            trl_setup[name] = sum(timed.seconds)
        runners[name] = TrlRunner(name, trainer)
    tokens_check = check_same_tokens(runners["TRL"].trainer, corpus, order, pairs) if "TRL" in runners else ""
    for name in list(runners):
        if name not in wanted:
            runners.pop(name).close()
    setup_s = time.perf_counter() - made

    names = list(runners)
    for step in range(args.steps):
        rotated = names[step % len(names):] + names[: step % len(names)]
        for name in rotated:
            runners[name].step()
    row: dict[str, Any] = {"shape": args.shape, "expert_lora": not args.no_expert_lora, "pairs": args.pairs,
                           "batch": args.batch, "steps": args.steps, "seq_len": args.seq_len, "rank": args.rank,
                           "load_average": load_before,
                           "setup_s": setup_s, "tokens_check": tokens_check, "contenders": {}}
    for name, runner in runners.items():
        timed = runner.seconds[1:]  # the first step of each is left out
        median = statistics.median(timed)
        net = runner.trainer.model
        entry = {"pairs_per_s": args.batch / median, "step_median_s": median, "step_s": timed,
                 "trained_parameters": sum(p.numel() for p in net.parameters() if p.requires_grad)}
        if isinstance(runner, HpcsweepRunner):
            entry["reference_median_s"] = statistics.median(runner.reference.seconds[1:])
            entry["positions_per_pair"] = runner.positions(args.steps) / (args.steps * args.batch)
        else:
            entry["positions_per_pair"] = runner.positions_seen / (args.steps * args.batch)
        if name in trl_setup:
            entry["precompute_s"] = trl_setup[name]
        row["contenders"][name] = entry
    # The sweep: 4 LoRA trials of one epoch each over the training pairs.
    train_pairs = first.corpus.train.pairs
    epoch_steps = math.ceil(train_pairs / args.batch)
    per_trial = row["contenders"]["hpcsweep"]["reference_median_s"] * epoch_steps if "hpcsweep" in wanted else None
    row["sweep"] = {"trials": TRIALS, "train_pairs": train_pairs, "epoch_steps": epoch_steps,
                    "per_trial_reference_s": per_trial, "prepare_reference_s": prepare_s,
                    "file_pairs": len(pairs)}
    row["load_average_after"] = os.getloadavg()
    for runner in runners.values():
        runner.close()
    return row


def report(row: dict[str, Any]) -> None:
    import trl

    c = row["contenders"]
    experts = "" if row["expert_lora"] else " (routed experts frozen: model.lora.experts=false)"
    print(f"DPO, {row['shape']} folder, LoRA r={row['rank']}{experts}, beta {BETA}, sigmoid, lr {LR}, "
          f"{row['batch']} pairs a step, seq_len/max_length {row['seq_len']}, fp32, CPU, one thread; "
          f"TRL {trl.__version__}, "
          f"torch {torch.__version__}; {row['steps'] - 1} measured steps each, alternating; load "
          f"{row['load_average'][0]:.2f} -> {row['load_average_after'][0]:.2f}")
    if row["tokens_check"]:
        print(f"  data: {row['tokens_check']}")
    print(f"  {'contender':<24} {'pairs/s':>8} {'step s':>7} {'ref fwd s':>9} {'positions/pair':>14} "
          f"{'trained':>9}  per step")
    does = {
        "hpcsweep": "packed rows; reference forward (adapters off) + policy fwd/bwd + AdamW",
        "hpcsweep, precomputed": "packed rows; reference read from the rows (preparation job) + policy fwd/bwd",
        "hpcsweep, unpacked": "a sequence a row, padded to the batch's longest; reference forward + policy fwd/bwd + AdamW",
        "TRL": "padded rows; reference forward (adapters off) + policy fwd/bwd + AdamW",
        "TRL, precomputed": "padded rows; reference precomputed in __init__ + policy fwd/bwd",
    }
    for name, e in c.items():
        ref = f"{e['reference_median_s']:.3f}" if "reference_median_s" in e else ""
        print(f"  {name:<24} {e['pairs_per_s']:>8.2f} {e['step_median_s']:>7.3f} {ref:>9} "
              f"{e['positions_per_pair']:>14.1f} {e['trained_parameters']:>9,}  {does[name]}")
    for name, e in c.items():
        if "precompute_s" in e:
            print(f"  {name}: its precompute pass {e['precompute_s']:.2f} s over {row['steps'] * row['batch']} pairs "
                  f"(once per trainer: every trial)")
    if all(name in c for name in LIKE_WITH_LIKE):
        print(f"hpcsweep/TRL pairs/s {c['hpcsweep']['pairs_per_s'] / c['TRL']['pairs_per_s']:.2f}")
    if "hpcsweep, precomputed" in c and "TRL, precomputed" in c:
        print(f"hpcsweep/TRL pairs/s, both precomputed "
              f"{c['hpcsweep, precomputed']['pairs_per_s'] / c['TRL, precomputed']['pairs_per_s']:.2f}")
    s = row["sweep"]
    if s["per_trial_reference_s"] is not None:
        every = TRIALS * s["per_trial_reference_s"]
        print(f"  sweep: {TRIALS} LoRA trials x 1 epoch of {s['train_pairs']} pairs ({s['epoch_steps']} steps): "
              f"reference in every trial {TRIALS} x {s['epoch_steps']} x "
              f"{c['hpcsweep']['reference_median_s']:.3f} s = {every:.1f} s; once by the preparation job "
              f"(reference_logps, {s['file_pairs']} pairs, model load included) {s['prepare_reference_s']:.1f} s")
        print(f"shared reference saves {every - s['prepare_reference_s']:.1f} s of {every:.1f} s ({TRIALS} trials)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="moe256", help="model folder (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=128, help="pairs in the file (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=4, help="pairs a step (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="steps of each contender, the first left out "
                        "(default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=256, help="data.seq_len and TRL's max_length "
                        "(default: %(default)s)")
    parser.add_argument("--rank", type=int, default=8, help="model.lora.r (default: %(default)s)")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS + OPTIONAL, default=list(CONTENDERS),
                        help="default: %(default)s")
    parser.add_argument("--no-expert-lora", action="store_true",
                        help="model.lora.experts=false on both sides: the routed experts stay frozen, every adapter "
                        "is peft's own layer, and what differs is the DPO step")
    parser.add_argument("--workdir", type=Path, help="where the folder, the cache and trial dirs go (default: a "
                        "temporary dir)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2: the first step is left out")
    torch.set_num_threads(1)  # CPU time of one thread: the contenders compare on the same footing
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="dpo-") as tmp:
        workdir = args.workdir or Path(tmp)
        row = measure(args, workdir)
    report(row)
    if args.json:
        import trl

        args.json.write_text(json.dumps({"trl": trl.__version__, "torch": torch.__version__, **row}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
