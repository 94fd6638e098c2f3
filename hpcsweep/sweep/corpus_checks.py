"""What the login node can tell of a ``data=text`` corpus before it is tokenized: an EOS token to end
each document with, and whether the corpus could fill one ``data.seq_len`` sample in each split.

The tokens are counted only by the preparation job (on Slurm) or the local preparation; before
that, the corpus's size in bytes bounds them. Every tokenizer hpcsweep prepares text with (byte-level
BPE, SentencePiece with byte fallback, WordPiece) makes at most one token per byte of text, and
each document adds its EOS and at most one prefix token (SentencePiece's ``▁``): so at most
``bytes + 2`` tokens per ``.txt`` file, and for a ``.jsonl`` line, whose ``{"text": ""}`` wrapping
alone is 12 bytes, at most the line's bytes. A corpus refused by this bound is certainly too small;
one that passes may still be (real text makes about one token per 3 to 5 bytes), and the preparation
job then checks the exact count (``hpcsweep.prepare.text_tokens``).
"""

from __future__ import annotations

from hpcsweep.config import DataConfig, check_corpus_fits
from hpcsweep.files.token_cache import TextCorpus
from hpcsweep.model.tokenizer_eos import missing_eos
from hpcsweep.prepare.text_documents import is_jsonl

TOKENS_PER_DOCUMENT_EXTRA = 2
"""Tokens a document may add beyond one per byte: its EOS and a tokenizer's prefix token."""


def most_tokens(corpus: TextCorpus) -> int:
    """An upper bound of the tokens ``corpus`` makes: one per byte, plus two per ``.txt`` document."""
    return sum(f.size + (0 if is_jsonl(f.path) else TOKENS_PER_DOCUMENT_EXTRA) for f in corpus.files)


def check_tokenizer_has_eos(corpus: TextCorpus, tokenizer_key: str) -> None:
    """Raise ``ValueError`` naming ``tokenizer_key`` when the corpus's tokenizer has no EOS token."""
    why = missing_eos(corpus.tokenizer_folder)
    if why:
        raise ValueError(
            f"{tokenizer_key}={corpus.tokenizer_folder} is not allowed for data=text: its tokenizer has no EOS token "
            f"to end each document with ({why}); add one (eos_token in tokenizer_config.json), or name another "
            "tokenizer with data.tokenizer"
        )


def check_corpus_may_fit(data: DataConfig, corpus: TextCorpus) -> None:
    """Raise ``ValueError`` naming ``data.seq_len`` when even ``most_tokens`` could not fill one sample of
    ``data.seq_len`` + 1 tokens in the validation split (``check_corpus_fits``'s rule)."""
    bound = most_tokens(corpus)
    nbytes = sum(f.size for f in corpus.files)
    try:
        check_corpus_fits(data, 1, num_tokens=bound, corpus_vocab_size=1, source="")
    except ValueError:
        val_start = int(bound * (1 - data.val_fraction))
        split = min(val_start, bound - val_start)
        raise ValueError(
            f"data.seq_len={data.seq_len} is not allowed: data.files={data.files!r} is too small for it before it is "
            f"even tokenized: {nbytes} bytes in {len(corpus.files)} files make at most {bound} tokens (one per byte, "
            f"plus 2 per .txt document), so its validation split (data.val_fraction={data.val_fraction}) holds at most "
            f"{split}, and a sample needs data.seq_len + 1; add text or lower data.seq_len (at most {max(split - 2, 0)})"
        ) from None
