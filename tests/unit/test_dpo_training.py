"""``objective=dpo`` trains on preference pairs: rows of chosen and rejected sequences, packed apart or padded,
give each answer the log-probability it has alone."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from hpcsweep.config import trial_config_from_dict
from hpcsweep.files.token_cache import chat_rendering, text_corpus
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.prepare.text_tokens import write_entry
from hpcsweep.train.data import corpora, sample_attention
from hpcsweep.train.preference.answer_logps import answer_logps, linear_answer_logps
from tests.chat_fixtures import REAL_TEMPLATES
from tests.model_folders import WORDS, make_model_folder

from .trial_dirs import trial_config

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
    }
    return folder, settings


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
    logps = {}
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
        # Packed: the four sequences share rows (something to keep apart); padded: one a row.
        assert batch.inputs.shape[0] == (2 if packing else 4)
    assert (logps[True] - logps[False]).abs().max() <= 1e-6, (logps[True], logps[False])
