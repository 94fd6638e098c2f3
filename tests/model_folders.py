"""Hugging Face model folders and text corpora, made the way a user's are, for tests and benchmarks.

A folder is written by ``save_pretrained`` (config.json, safetensors, generation_config.json) and
holds a tokenizer trained by the ``tokenizers`` package on the test's own text, saved with
``PreTrainedTokenizerFast.save_pretrained``. Nothing is hand-written, nothing comes from a hub.

    folder = make_model_folder(tmp_path / "tiny-deepseek")
    corpus = write_text_corpus(tmp_path / "corpus")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

WORDS = (
    "the cluster runs a sweep of trials each trial trains a model on its own nodes and "
    "writes checkpoints metrics and events so that a preempted trial resumes where it stopped "
    "experts route tokens attention heads read keys and values the loss falls as steps go by"
).split()


def corpus_documents(count: int = 64, words_per_document: int = 120, seed: int = 0) -> list[str]:
    """``count`` documents of pseudo-random sentences over ``WORDS`` (the same for the same seed)."""
    import random

    rng = random.Random(seed)
    documents = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(words_per_document)]
        sentences = [" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, len(words), 12)]
        documents.append(" ".join(sentences))
    return documents


def write_text_corpus(folder: Path, documents: Sequence[str] | None = None, jsonl: bool = True) -> Path:
    """A folder of ``doc-NNN.txt`` files (and one ``extra.jsonl`` with a ``text`` field per line when
    ``jsonl``), the shape of a user's own text. Returns ``folder``."""
    documents = list(corpus_documents() if documents is None else documents)
    folder.mkdir(parents=True, exist_ok=True)
    plain, lines = (documents[: len(documents) // 2], documents[len(documents) // 2 :]) if jsonl else (documents, [])
    for i, text in enumerate(plain):
        (folder / f"doc-{i:03d}.txt").write_text(text + "\n", encoding="utf-8")
    if lines:
        (folder / "extra.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    return folder


def train_tokenizer(documents: Sequence[str], vocab_size: int = 384):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained by ``tokenizers`` on ``documents``,
    with BOS/EOS/PAD special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )


SIZE_KEYS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "n_routed_experts", "n_shared_experts", "num_local_experts", "num_experts", "num_experts_per_tok",
    "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "qk_head_dim", "layer_types",  # derived: the query-key width, and one attention kind per layer
    # Group-limited routing splits the routed experts into n_group groups and keeps topk_group of them:
    # both shrink with the expert count (8 groups of 256 experts cannot split 4).
    "n_group", "topk_group",
    # The token ids are the tokenizer's (a folder's config names its own tokenizer's BOS, EOS and pad).
    "bos_token_id", "eos_token_id", "pad_token_id",
})
"""The config keys a test folder may shrink or set from its tokenizer: sizes only. Every other key keeps its
config class's default, which mirrors the published model (``use_cache``, rope, router settings, tied
embeddings): folders saved otherwise once hid packed samples attending to each other from every test.
A test that needs another key changed passes it with the reason beside it."""

TINY_DEEPSEEK = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=256,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    n_group=1,
    topk_group=1,
)
"""A DeepseekV3 of about 0.13M parameters (vocabulary 384): MLA attention, one dense layer then one MoE layer.
Sizes only (``SIZE_KEYS``); the rest is ``DeepseekV3Config``'s defaults, ``use_cache=True`` among them."""


def changed_keys(config) -> dict[str, tuple]:
    """The keys of ``config`` (a transformers config) outside ``SIZE_KEYS`` whose value differs from its class's
    default, each with ``(default, value)``; what save_pretrained records of itself is left out."""
    recorded = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"}
    defaults = type(config)().to_dict()
    values = config.to_dict()
    return {key: (defaults.get(key), value) for key, value in values.items()
            if key not in SIZE_KEYS | recorded and defaults.get(key) != value}


def make_model_folder(
    folder: Path,
    *,
    weights: bool = True,
    tokenizer: bool = True,
    documents: Sequence[str] | None = None,
    vocab_size: int = 384,
    seed: int = 0,
    max_shard_size: str | None = None,
    chat_markers: bool = False,
    why: str | None = None,
    **config_overrides,
) -> Path:
    """A pretrained DeepseekV3 folder at ``folder``, as ``save_pretrained`` writes one.

    ``weights=False`` leaves a config-only folder (random init at train time); ``tokenizer=False``
    leaves the tokenizer out. The tokenizer is trained on ``documents`` (default: the corpus of
    ``corpus_documents()``), and the model's vocabulary is the tokenizer's. ``max_shard_size``
    (``"100KB"``) writes sharded safetensors with an index. ``chat_markers`` adds the turn markers of real
    chat templates as special tokens (``tests.chat_fixtures.MARKERS``), so those templates render with the
    folder's own tokenizer. ``config_overrides`` shrink sizes
    (``SIZE_KEYS``); any other key is refused unless ``why`` says why the test needs it. Returns ``folder``.
    """
    others = sorted(set(config_overrides) - SIZE_KEYS)
    if others and not why:
        raise ValueError(f"make_model_folder: {others} are not sizes; a folder keeps its config class's defaults "
                         "unless why= says why the test needs another value")
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    documents = list(corpus_documents() if documents is None else documents)
    tok = train_tokenizer(documents, vocab_size=vocab_size)
    if chat_markers:
        from tests.chat_fixtures import MARKERS

        tok.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    settings = {**TINY_DEEPSEEK, **config_overrides}
    config = DeepseekV3Config(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **settings,
    )
    folder.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(seed)
        model = DeepseekV3ForCausalLM(config)
        kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(folder, safe_serialization=True, **kwargs)
    else:
        config.save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder
