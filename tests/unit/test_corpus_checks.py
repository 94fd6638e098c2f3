"""A data=text corpus that cannot train is refused on the login node before it is tokenized: a tokenizer
without EOS (item 4), a corpus whose bytes cannot make one data.seq_len sample per split (item 3); the
preparation job checks the exact count, and its refusal reaches each trial's metrics.json in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsweep.files.metrics_file import read_metrics
from hpcsweep.files.token_cache import text_corpus
from hpcsweep.model.tokenizer_eos import missing_eos
from hpcsweep.sweep.corpus_checks import most_tokens
from hpcsweep.sweep.prepare import validate_composed
from hpcsweep.sweep.text_preparation import preparation_request
from hpcsweep.prepare import text_tokens
from tests.model_folders import corpus_documents, train_tokenizer, write_text_corpus


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """A tokenizer folder with EOS, as a model folder holds one, and the same tokenizer saved without one."""
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tokenizers")
    trained = train_tokenizer(corpus_documents(count=8))
    with_eos = root / "with-eos"
    trained.save_pretrained(with_eos)
    PreTrainedTokenizerFast(tokenizer_object=trained.backend_tokenizer, bos_token="<|bos|>").save_pretrained(
        root / "no-eos")
    return with_eos, root / "no-eos"


def text_trial(tokenizer: Path, files: str, cache: Path, **data) -> dict:
    return {"model": {"vocab_size": 384}, "trainer": {"device": "cpu"},
            "data": {"kind": "text", "files": files, "tokenizer": str(tokenizer), "cache_dir": str(cache), **data}}


def test_a_tokenizer_without_eos_is_refused_before_anything_is_tokenized(tmp_path, tokenizers):
    with_eos, no_eos = tokenizers
    corpus = write_text_corpus(tmp_path / "corpus")
    with pytest.raises(ValueError) as info:
        validate_composed(text_trial(no_eos, f"{corpus}/*", tmp_path / "cache"))
    assert str(info.value) == (
        f"data.tokenizer={no_eos} is not allowed for data=text: its tokenizer has no EOS token to end each document "
        "with (neither tokenizer_config.json nor special_tokens_map.json names an eos_token); add one (eos_token in "
        "tokenizer_config.json), or name another tokenizer with data.tokenizer")
    assert not (tmp_path / "cache").exists()
    validate_composed(text_trial(with_eos, f"{corpus}/*", tmp_path / "cache"))


def test_transformers_agrees_that_the_refused_tokenizer_has_no_eos(tokenizers):
    with_eos, no_eos = tokenizers
    # What the preparation job makes of the folders (AutoTokenizer): it would have failed on the node.
    with pytest.raises(ValueError, match="has no eos_token to put between documents"):
        text_tokens.load_tokenizer(str(no_eos))
    assert text_tokens.load_tokenizer(str(with_eos)).eos_token == "<|eos|>"


@pytest.mark.parametrize(("files", "missing"), [
    ({"tokenizer_config.json": {"eos_token": "</s>"}}, None),
    ({"tokenizer_config.json": {"eos_token": {"content": "</s>", "lstrip": False}}}, None),
    ({"tokenizer_config.json": {}, "special_tokens_map.json": {"eos_token": "<eos>"}}, None),
    ({"tokenizer_config.json": {"tokenizer_class": "LlamaTokenizer"}}, None),  # the class brings "</s>"
    ({"tokenizer_config.json": {"tokenizer_class": "LlamaTokenizer", "eos_token": None}},
     "its eos_token is empty (tokenizer_config.json)"),
    ({"tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast"}},
     "neither tokenizer_config.json nor special_tokens_map.json names an eos_token"),
    ({}, "neither tokenizer_config.json nor special_tokens_map.json names an eos_token"),
    ({"config.json": {"model_type": "llama"}}, None),  # AutoTokenizer takes llama's class, "</s>" with it
    ({"config.json": {}, "tokenizer_config.json": {"tokenizer_class": "TokenizersBackend"}},
     "neither tokenizer_config.json nor special_tokens_map.json names an eos_token"),
])
def test_where_an_eos_token_is_found(tmp_path, files, missing):
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    assert missing_eos(tmp_path) == missing


def test_the_eos_check_imports_no_torch_nor_transformers():
    code = ("import sys; from hpcsweep.sweep import corpus_checks; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_a_corpus_too_small_for_seq_len_is_refused_from_its_bytes_before_the_cache_exists(tmp_path, tokenizers):
    with_eos, _ = tokenizers
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("x" * 598)
    (corpus / "b.jsonl").write_text(json.dumps({"text": "y" * 88}) + "\n")  # 101 bytes
    entry = text_corpus(f"{corpus}/*", str(with_eos), str(tmp_path / "cache"), "data.tokenizer")
    assert most_tokens(entry) == 598 + 2 + 101
    with pytest.raises(ValueError) as info:
        validate_composed(text_trial(with_eos, f"{corpus}/*", tmp_path / "cache", seq_len=64))
    assert str(info.value) == (
        f"data.seq_len=64 is not allowed: data.files='{corpus}/*' is too small for it before it is even tokenized: "
        "699 bytes in 2 files make at most 701 tokens (one per byte, plus 2 per .txt document), so its validation "
        "split (data.val_fraction=0.05) holds at most 36, and a sample needs data.seq_len + 1; add text or lower "
        "data.seq_len (at most 34)")
    assert not (tmp_path / "cache").exists()
    validate_composed(text_trial(with_eos, f"{corpus}/*", tmp_path / "cache", seq_len=34))  # the bound's own limit


def test_the_preparation_job_counts_exactly_and_records_why_each_trial_never_starts(tmp_path, tokenizers, capsys):
    with_eos, _ = tokenizers
    # 40 documents of real words: about 4 bytes a token, so the bytes pass the login node's bound and the tokens fail.
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(count=4, words_per_document=60), jsonl=False)
    cache = tmp_path / "cache"
    trial = validate_composed(text_trial(with_eos, f"{corpus}/*", cache, seq_len=40))  # passes the estimate
    small = validate_composed(text_trial(with_eos, f"{corpus}/*", cache, seq_len=8))
    entry = text_corpus(f"{corpus}/*", str(with_eos), str(cache), "data.tokenizer")
    dirs = [tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"]
    request = tmp_path / "request.json"
    request.write_text(preparation_request([entry], [trial, small], dirs))
    assert json.loads(request.read_text())[0]["needs"] == [
        {"seq_len": 40, "val_fraction": 0.05, "trial_dirs": [str(dirs[0])]},
        {"seq_len": 8, "val_fraction": 0.05, "trial_dirs": [str(dirs[1])]}]

    assert text_tokens.main(["--request", str(request), "--workers", "1"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    tokens = json.loads((entry.entry / "tokens.json").read_text())["num_tokens"]
    split = tokens - int(tokens * 0.95)
    refusal = (f"data.seq_len=40 is not allowed: at most {split - 2}: the corpus tokenized into {entry.entry} holds "
               f"{tokens} tokens, its validation split (data.val_fraction=0.05) {split}")
    assert line == f"token preparation failed: {refusal}"
    assert read_metrics(dirs[0] / "metrics.json")["error"] == f"never started: token preparation: {refusal}"
    assert read_metrics(dirs[0] / "metrics.json")["status"] == "not_started"
    assert not (dirs[1] / "metrics.json").exists()  # its seq_len fits: it is cancelled only because the job failed
    ran_before = {"status": "stopped", "step": 3, "error": None}
    (dirs[0] / "metrics.json").write_text(json.dumps(ran_before))
    text_tokens.record_never_started(dirs[0], "never started: again")
    assert read_metrics(dirs[0] / "metrics.json") == ran_before  # a trial that ran keeps the record of its run
    assert entry.is_cached()  # the tokens are right, only too few for one trial: the next sweep reuses them
    with pytest.raises(ValueError, match=rf"^data.seq_len=40 is not allowed: at most {split - 2}: data.files="):
        validate_composed(text_trial(with_eos, f"{corpus}/*", cache, seq_len=40))  # exact, once the cache exists


def test_a_byte_level_token_file_is_refused_for_a_trial_with_a_tokenizer_folder(tmp_path, tokenizers):
    import numpy as np

    from hpcsweep.train.data.corpora import write_token_file

    with_eos, _ = tokenizers
    write_token_file(tmp_path / "docs.bin", np.arange(5000) % 256, 256, "bytes")  # scripts/prepare-data's default
    trial = {"model": {"vocab_size": 384}, "trainer": {"device": "cpu"},
             "data": {"kind": "file", "path": str(tmp_path / "docs.bin")}}
    validate_composed(trial)  # the built-in model reads bytes as well as any ids
    with pytest.raises(ValueError) as info:
        validate_composed({**trial, "data": {**trial["data"], "tokenizer": str(with_eos)}})
    assert str(info.value) == (
        f"data.path={str(tmp_path / 'docs.bin')!r} is not allowed: it holds byte-level tokens (scripts/prepare-data "
        f"without --model), not those of data.tokenizer={str(with_eos)!r}'s tokenizer; tokenize the text with it "
        f"(scripts/prepare-data --model {with_eos} --out FILE.bin TEXT...), or use data=text")


def test_a_local_preparation_counts_exactly_and_ends_the_command_with_one_line(tmp_path, tokenizers, caplog):
    from hpcsweep.sweep.text_preparation import prepare_here

    with_eos, _ = tokenizers
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(count=4, words_per_document=60), jsonl=False)
    trial = validate_composed(text_trial(with_eos, f"{corpus}/*", tmp_path / "cache", seq_len=40))
    with pytest.raises(SystemExit) as exit_info:
        prepare_here([trial])
    assert exit_info.value.code == 2
    assert caplog.messages[-1].startswith("data.seq_len=40 is not allowed: at most ")
    assert caplog.messages[-1].endswith("; no trial ran") and "the corpus tokenized into" in caplog.messages[-1]
