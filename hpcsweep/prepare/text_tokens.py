"""Tokenize a text corpus once, into its token cache entry (``hpcsweep.files.token_cache``).

Every document becomes its token ids followed by the tokenizer's EOS token, so EOS separates one
document from the next. Pieces of the corpus (``hpcsweep.prepare.text_documents``) are tokenized by a
pool of worker processes, one per CPU this process may use, and written in corpus order as they
come back: the result is the same bytes for any number of workers, and memory holds a few pieces,
never the corpus. The entry is written into a temporary folder beside it and renamed into place,
so a reader sees a whole entry or none, and two preparers of one entry never corrupt it (the
second's rename finds the first's entry and its own copy is dropped).

    python -m hpcsweep.prepare --request SWEEP_DIR/.token-preparation/request.json

is the Slurm preparation job of a ``data=text`` sweep (``hpcsweep.sweep.text_preparation``), through ``hpcsweep/prepare/__main__.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hpcsweep.config import DataConfig, check_corpus_fits
from hpcsweep.files.atomic import atomic_write_text, fsync_dir
from hpcsweep.files.chat_samples import check_samples
from hpcsweep.files.preference_pairs import check_pairs
from hpcsweep.files.metrics_file import NOT_STARTED, read_metrics, write_metrics
from hpcsweep.files.token_cache import TOKENS_NAME, TextCorpus, TokenCacheError, chat_rendering, text_corpus
from hpcsweep.files.token_file import TokenHeader, header_path, header_text, read_token_header
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.model.folder_tokenizer import load_folder_tokenizer
from hpcsweep.prepare.cache_entry import publish_entry
from hpcsweep.prepare.chat_tokens import write_chat_files
from hpcsweep.prepare.preference_tokens import write_preference_files
from hpcsweep.prepare.reference_logps import reference_key, write_reference_logps
from hpcsweep.prepare.text_documents import Piece, corpus_pieces, read_documents

log = logging.getLogger(__name__)

_worker_tokenizer: Any = None
"""The tokenizer of this worker process, loaded once by the pool's initializer."""


def load_tokenizer(folder: str, *, trust_remote_code: bool = False) -> Any:
    """The tokenizer of ``folder`` (``load_folder_tokenizer``: a corpus's ``trust_remote_code``, which is
    ``model.trust_remote_code``); ``TokenCacheError`` when it has no EOS token to put between documents."""
    # Each worker process is one CPU's worth already: the Rust tokenizer must not add threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = load_folder_tokenizer(folder, trust_remote_code=trust_remote_code)
    if tokenizer.eos_token_id is None:
        raise TokenCacheError(f"the tokenizer in {folder} has no eos_token to put between documents")
    return tokenizer


def pad_token_id(tokenizer: Any) -> int:
    """The id a row's padding holds: the tokenizer's pad token, else its EOS (Llama 3's and many
    published tokenizers have no pad token). Padding takes no loss, no attention from a sample and no
    routed load; its id is still what the model embeds there."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def piece_tokens(tokenizer: Any, piece: Piece) -> np.ndarray:
    """The ids of every document of ``piece``, each followed by EOS (int64)."""
    documents = read_documents(piece)
    if not documents:
        return np.empty(0, dtype=np.int64)
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return np.fromiter((t for doc in ids for t in (*doc, eos)), dtype=np.int64)


def _init_worker(folder: str, trust_remote_code: bool) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)


def _tokenize_in_worker(piece: Piece) -> np.ndarray:
    return piece_tokens(_worker_tokenizer, piece)


def available_cpus() -> int:
    """The CPUs this process may run on (a Slurm job's own, under its cgroup or affinity)."""
    return len(os.sched_getaffinity(0))


def tokenized_pieces(corpus: TextCorpus, pieces: Sequence[Piece], workers: int) -> Iterator[np.ndarray]:
    """Each piece's tokens, in the order of ``pieces``, from ``workers`` processes (1: this one)."""
    folder, trust_remote_code = corpus.tokenizer_folder, corpus.trust_remote_code
    if workers <= 1 or len(pieces) <= 1:
        tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
        for piece in pieces:
            yield piece_tokens(tokenizer, piece)
        return
    # fork: this process has not used the tokenizer (nor torch), and a worker starts in milliseconds.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(workers, len(pieces)), mp_context=context,
                             initializer=_init_worker, initargs=(folder, trust_remote_code)) as pool:
        yield from pool.map(_tokenize_in_worker, pieces)


def write_tokens(corpus: TextCorpus, token_path: Path, workers: int, piece_bytes: int | None = None) -> int:
    """Tokenize ``corpus`` into the token file ``token_path`` and its header (not atomically: callers
    write into a staging place); return the number of tokens."""
    vocab_size = len(load_tokenizer(corpus.tokenizer_folder, trust_remote_code=corpus.trust_remote_code))
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    pieces = corpus_pieces([(f.path, f.size) for f in corpus.files], *([piece_bytes] if piece_bytes else []))
    count = 0
    with open(token_path, "wb") as out:
        for tokens in tokenized_pieces(corpus, pieces, workers):
            out.write(tokens.astype(dtype).tobytes())
            count += len(tokens)
        out.flush()
        os.fsync(out.fileno())
    atomic_write_text(header_path(token_path), header_text(
        np.dtype(dtype).name, vocab_size, count, corpus.tokenizer_folder, corpus.tokenizer_sha256))
    log.info("tokenized %d files with %s: %d tokens, vocabulary %d (%d workers)",
             len(corpus.files), corpus.tokenizer_folder, count, vocab_size, workers)
    return count


def write_entry(corpus: TextCorpus, workers: int, piece_bytes: int | None = None) -> Path:
    """Tokenize ``corpus`` into its cache entry unless it is there; return its token file. A chat corpus
    is rendered by ``hpcsweep.prepare.chat_tokens``, a preference corpus by ``hpcsweep.prepare.preference_tokens``."""
    if corpus.preference:
        return publish_entry(corpus, lambda staging: write_preference_files(corpus, staging, workers, piece_bytes))
    if corpus.chat is not None:
        return publish_entry(corpus, lambda staging: write_chat_files(corpus, staging, workers, piece_bytes))
    return publish_entry(corpus, lambda staging: write_tokens(corpus, staging / TOKENS_NAME, workers, piece_bytes))

def write_token_file_at(corpus: TextCorpus, out: Path, workers: int) -> None:
    """Tokenize ``corpus`` into the token file ``out`` (and its header), replacing both atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        staged = staging / out.name
        write_tokens(corpus, staged, workers)
        # The header last: a reader that finds the new header finds the new tokens.
        os.replace(staged, out)
        os.replace(header_path(staged), header_path(out))
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def prepare_requested(request: dict[str, Any], workers: int) -> Path:
    """Write the cache entry one request names (``hpcsweep.sweep.text_preparation.preparation_request``),
    and a preference corpus's reference log-probabilities (``hpcsweep.prepare.reference_logps``), having checked
    it against what its trials need (``check_needs``; a chat corpus's sample selections, a preference corpus's pair
    selections);
    ``TokenCacheError`` when its corpus or tokenizer is no longer what the sweep was submitted with, or
    when it is too small for a trial."""
    chat = request.get("chat")
    rendering = chat_rendering(chat["template"], chat["train_on"], chat.get("template_kwargs")) if chat else None
    corpus = text_corpus(request["files"], request["tokenizer"], request["cache_dir"], "data.tokenizer", rendering,
                         trust_remote_code=bool(request.get("trust_remote_code")),
                         preference=bool(request.get("preference")))
    if request.get("key") and corpus.key != request["key"]:
        raise TokenCacheError(
            f"the corpus or the tokenizer changed since the sweep was submitted (cache entry {corpus.key}, "
            f"not {request['key']}): submit the sweep again"
        )
    token_path = write_entry(corpus, workers)
    check_needs(read_token_header(token_path), request.get("needs") or [], f"the corpus tokenized into {corpus.entry}")
    kind, check_selection = ("preference", check_pairs) if corpus.preference else ("chat", check_samples)
    for check in chat.get("checks", ()) if chat else ():
        # An overlong sample or pair under data.overlong=refuse fails the job, so no trial of the sweep starts;
        # before the reference's forwards, which it would waste.
        data = DataConfig(kind=kind, files=request["files"], **check)
        log.info("data.seq_len=%d: %s", data.seq_len, check_selection(corpus, data).summary(data))
    for reference in request.get("references") or []:
        if reference_key(reference["model"]) != reference["key"]:
            raise TokenCacheError(f"model.path={reference['model']} changed since the sweep was submitted (its "
                                  "reference key differs): submit the sweep again")
        write_reference_logps(corpus, reference["model"], trust_remote_code=bool(reference.get("trust_remote_code")))
    return token_path


def check_needs(header: TokenHeader, needs: Sequence[dict[str, Any]], source: str) -> None:
    """``TokenCacheError`` (the first refusal's line) when the counted tokens cannot fill one sample of a
    trial's ``data.seq_len`` in each split (``hpcsweep.config.check_corpus_fits``); each trial it refuses
    gets that line as its ``metrics.json`` error, with the status of a trial that never started."""
    refusals = []
    for need in needs:
        data = DataConfig(seq_len=int(need["seq_len"]), val_fraction=float(need["val_fraction"]))
        try:
            check_corpus_fits(data, header.vocab_size, num_tokens=header.num_tokens,
                              corpus_vocab_size=header.vocab_size, source=source)
        except ValueError as err:
            refusals.append(str(err))
            for trial_dir in need.get("trial_dirs") or []:
                record_never_started(Path(trial_dir), f"never started: token preparation: {err}")
    if refusals:
        raise TokenCacheError(refusals[0])


def record_never_started(trial_dir: Path, error: str) -> None:
    """The trial's ``metrics.json``: it never started, and ``error`` says why (one line). A trial that has
    run before (a retried one) keeps the record of its run."""
    path = TrialFiles(trial_dir).metrics
    if (read_metrics(path) or {}).get("status", NOT_STARTED) != NOT_STARTED:
        return
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_metrics(path, {"status": NOT_STARTED, "step": 0, "error": error})


def main(argv: Sequence[str] | None = None) -> int:
    """The preparation job: write every requested cache entry; exit 1 with one line on failure."""
    parser = argparse.ArgumentParser(prog="python -m hpcsweep.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--request", type=Path, required=True,
                        help="JSON list of {files, tokenizer, cache_dir, key}, written by the sweep")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (default: every CPU of this job)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # In a sweep's job, the code snapshot's archive (hpcsweep.sweep.snapshot): the code the trials run.
    log.info("hpcsweep imported from %s", Path(__file__).parents[1])
    try:
        for request in json.loads(args.request.read_text()):
            prepare_requested(request, args.workers or available_cpus())
    except (ValueError, OSError) as err:  # TokenCacheError, CorpusError and a refused sample are ValueErrors
        print(f"token preparation failed: {err}", file=sys.stderr)
        return 1
    return 0
