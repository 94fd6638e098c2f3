"""``data=text``: the user's text, tokenized once per (tokenizer, corpus) with a Hugging Face
tokenizer folder into a shared cache, and read by the trainer like a token file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hpcsweep.config import DataConfig, trial_config_from_dict
from hpcsweep.files.sweep_record import TokenPreparationRecord
from hpcsweep.files.token_cache import TokenCacheError, cache_key, corpus_files, text_corpus, tokenizer_sha256
from hpcsweep.files.token_file import read_token_header
from hpcsweep.results.token_preparation import parse_job_state, preparation_line
from hpcsweep.sweep.prepare import validate_composed
from hpcsweep.sweep.snapshot import ARCHIVE_FILE, with_snapshot
from hpcsweep.sweep.text_preparation import (
    dependency_parameters,
    preparation_request,
    preparation_script,
    sbatch_options,
)
from hpcsweep.prepare.text_documents import CorpusError, corpus_pieces, jsonl_documents, read_documents
from hpcsweep.prepare.text_tokens import load_tokenizer, write_entry, write_token_file_at
from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tokenizer folder (a config-only model folder), a second one trained on other text, and a corpus."""
    root = tmp_path_factory.mktemp("text")
    model = make_model_folder(root / "model", weights=False)
    other = make_model_folder(root / "other", weights=False, documents=corpus_documents(seed=7), vocab_size=320)
    corpus = write_text_corpus(root / "corpus", corpus_documents(count=8, words_per_document=60))
    return model, other, corpus


def globs(corpus: Path) -> list[str]:
    return [str(corpus / "*.txt"), str(corpus / "*.jsonl")]


# The cache key


def test_the_cache_key_follows_each_files_name_size_and_mtime_and_the_tokenizer_not_the_glob_order(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(f"text of {name}\n")
    files = corpus_files([str(tmp_path / "*.txt")])
    key = cache_key("tok", files)
    assert [Path(f.path).name for f in files] == ["a.txt", "b.txt"]
    assert cache_key("tok", corpus_files([str(tmp_path / "b.txt"), str(tmp_path / "a.txt")])) == key
    assert cache_key("tok", list(reversed(files))) == key
    assert cache_key("another tokenizer", files) != key

    os.utime(tmp_path / "a.txt", ns=(files[0].mtime_ns + 10**9, files[0].mtime_ns + 10**9))
    touched = cache_key("tok", corpus_files([str(tmp_path / "*.txt")]))
    assert touched != key
    (tmp_path / "a.txt").write_text("longer text of a.txt\n")
    os.utime(tmp_path / "a.txt", ns=(files[0].mtime_ns + 10**9, files[0].mtime_ns + 10**9))
    resized = cache_key("tok", corpus_files([str(tmp_path / "*.txt")]))
    assert resized not in (key, touched)
    (tmp_path / "a.txt").rename(tmp_path / "c.txt")
    assert cache_key("tok", corpus_files([str(tmp_path / "*.txt")])) not in (key, touched, resized)


def test_the_tokenizer_hash_covers_its_files_and_a_folder_without_any_is_refused(tmp_path, folders):
    model, other, _ = folders
    assert tokenizer_sha256(model) == tokenizer_sha256(model)
    assert tokenizer_sha256(model) != tokenizer_sha256(other)
    with pytest.raises(TokenCacheError, match="^it holds no tokenizer files"):
        tokenizer_sha256(tmp_path)
    with pytest.raises(TokenCacheError, match=r"^data.tokenizer='/no/such' is not allowed: not a directory$"):
        text_corpus(["x"], "/no/such", str(tmp_path), "data.tokenizer")


def test_a_glob_that_matches_no_file_is_named(tmp_path):
    with pytest.raises(TokenCacheError, match=r"^data.files='.*/\*.md' is not allowed: it matches no file$"):
        corpus_files([str(tmp_path / "*.md")])


# Documents


def test_jsonl_lines_are_documents_and_a_bad_line_is_named_by_file_and_line(tmp_path):
    assert jsonl_documents('{"text": "a"}\n\n{"text": "b", "id": 2}\n', "f.jsonl") == ["a", "b"]
    with pytest.raises(CorpusError, match=r"^f.jsonl:3 is not a JSON object"):
        jsonl_documents('{"text": "a"}\n\n{oops\n', "f.jsonl")
    with pytest.raises(CorpusError, match=r"^f.jsonl:1 has no string field 'text'$"):
        jsonl_documents('{"body": "a"}\n', "f.jsonl")

    path = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(50)]
    lines[37] = "not json"
    path.write_text("\n".join(lines) + "\n")
    pieces = corpus_pieces([(str(path), path.stat().st_size)], piece_bytes=100)
    assert len(pieces) > 5 and pieces[0].start == 0 and pieces[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    found = []
    with pytest.raises(CorpusError, match=rf"^{path}:38 is not a JSON object"):
        for piece in pieces:
            found.extend(read_documents(piece))
    assert found == [f"document {i}" for i in range(len(found))] and len(found) >= 30


def test_a_plain_text_file_is_one_document(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("line one\n\nline two\n")
    (piece,) = corpus_pieces([(str(path), path.stat().st_size)], piece_bytes=4)
    assert read_documents(piece) == ["line one\n\nline two\n"]


# Tokenizing


def test_every_document_is_followed_by_eos_in_path_order(tmp_path, folders):
    model, _, corpus = folders
    entry = write_entry(text_corpus(globs(corpus), str(model), str(tmp_path), "data.tokenizer"), workers=1)
    tokenizer = load_tokenizer(str(model))
    documents = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    documents += [json.loads(line)["text"] for line in (corpus / "extra.jsonl").read_text().splitlines()]
    expected = [t for doc in documents for t in (*tokenizer(doc, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id)]
    tokens = np.fromfile(entry, dtype=np.uint16)
    assert tokens.tolist() == expected
    assert (tokens == tokenizer.eos_token_id).sum() == len(documents) == 8
    header = read_token_header(entry)
    assert (header.vocab_size, header.num_tokens, header.tokenizer_sha256) == (
        len(tokenizer), len(expected), tokenizer_sha256(model))


def test_parallel_tokenizing_writes_the_same_bytes_as_serial(tmp_path, folders):
    model, _, corpus = folders
    serial = write_entry(text_corpus(globs(corpus), str(model), str(tmp_path / "serial"), "data.tokenizer"), workers=1)
    parallel_corpus = text_corpus(globs(corpus), str(model), str(tmp_path / "parallel"), "data.tokenizer")
    parallel = write_entry(parallel_corpus, workers=2, piece_bytes=512)
    assert len(corpus_pieces([(f.path, f.size) for f in parallel_corpus.files], 512)) > len(parallel_corpus.files)
    assert parallel.read_bytes() == serial.read_bytes()
    assert parallel.with_suffix(".json").read_text() == serial.with_suffix(".json").read_text()
    # Written once: a second preparer of the same entry finds it and leaves it as it is.
    stamp = parallel.stat().st_mtime_ns
    assert write_entry(text_corpus(globs(corpus), str(model), str(tmp_path / "parallel"), "data.tokenizer"), 2) == parallel
    assert parallel.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "parallel").iterdir()] == [parallel_corpus.key]


def test_two_preparers_of_one_entry_leave_one_whole_entry(tmp_path, folders, monkeypatch, caplog):
    from hpcsweep.prepare import text_tokens

    model, _, corpus = folders
    entry = text_corpus(globs(corpus), str(model), str(tmp_path), "data.tokenizer")
    write_tokens = text_tokens.write_tokens
    other = {}

    def racing(corpus_, token_path, workers, piece_bytes=None):
        count = write_tokens(corpus_, token_path, workers, piece_bytes)
        # Another preparer finishes the same entry while this one is still staging its own.
        monkeypatch.setattr(text_tokens, "write_tokens", write_tokens)
        other["path"] = write_entry(text_corpus(globs(corpus), str(model), str(tmp_path), "data.tokenizer"), 1)
        other["bytes"] = other["path"].read_bytes()
        return count

    monkeypatch.setattr(text_tokens, "write_tokens", racing)
    caplog.set_level("INFO", logger="hpcsweep.prepare.cache_entry")
    assert write_entry(entry, workers=1) == other["path"] == entry.token_path
    assert caplog.messages[-1] == f"another preparer wrote {entry.entry} first: keeping its entry"
    assert entry.token_path.read_bytes() == other["bytes"] and read_token_header(entry.token_path).num_tokens > 0
    assert [p.name for p in tmp_path.iterdir()] == [entry.key]  # the loser's staging folder is gone


def test_prepare_data_with_a_model_folder_writes_what_the_sweep_reads(tmp_path, folders):
    model, _, corpus = folders
    cache = tmp_path / "cache"
    script = [sys.executable, str(REPO / "scripts" / "prepare-data"), "--model", str(model)]
    made = subprocess.run([*script, "--cache-dir", str(cache), *globs(corpus)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    entry = text_corpus(globs(corpus), str(model), str(cache), "data.tokenizer")
    assert entry.is_cached() and made.stdout.startswith(f"{entry.token_path}: the token cache entry")
    out = tmp_path / "out" / "corpus.bin"
    write_token_file_at(entry, out, workers=1)
    assert out.read_bytes() == entry.token_path.read_bytes()
    assert read_token_header(out).tokenizer_sha256 == tokenizer_sha256(model)
    refused = subprocess.run([*script, str(corpus / "*.md")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and refused.stderr.strip().endswith("is not allowed: it matches no file")


# Checks before submit


def composed(**data):
    return {"model": {"vocab_size": 384}, "data": data, "trainer": {"device": "cpu"}}


def test_data_text_needs_files_and_a_tokenizer():
    with pytest.raises(ValueError, match=r"^data.files=None is not allowed: a glob or a list of globs"):
        trial_config_from_dict(composed(kind="text", tokenizer="/t"))
    with pytest.raises(ValueError, match=r"^data.tokenizer=None is not allowed: a Hugging Face tokenizer folder"):
        trial_config_from_dict(composed(kind="text", files="/c/*.txt"))
    trial = trial_config_from_dict(composed(kind="text", files=["/c/*.txt", "/c/*.jsonl"], tokenizer="/t"))
    assert trial.data.cache_dir == "multirun/token-cache"


def test_a_token_file_made_with_another_tokenizer_is_refused_before_submit(tmp_path, folders):
    model, other, corpus = folders
    path = tmp_path / "corpus.bin"
    write_token_file_at(text_corpus(globs(corpus), str(other), str(tmp_path), "data.tokenizer"), path, workers=1)
    with pytest.raises(ValueError) as err:
        validate_composed(composed(kind="file", path=str(path), tokenizer=str(model)))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"data.path={str(path)!r} is not allowed: it was made with another tokenizer ({other}")
    assert f"than data.tokenizer={str(model)!r}" in str(err.value)
    validate_composed(composed(kind="file", path=str(path), tokenizer=str(other)))


def test_a_text_trial_whose_tokenizer_or_files_cannot_be_used_is_refused(tmp_path, folders):
    model, _, corpus = folders
    with pytest.raises(ValueError, match=r"^data.tokenizer='.*' is not allowed: it holds no tokenizer files"):
        validate_composed(composed(kind="text", files=globs(corpus), tokenizer=str(tmp_path)))
    with pytest.raises(ValueError, match=r"^data.files='.*nothing\*' is not allowed: it matches no file$"):
        validate_composed(composed(kind="text", files=str(corpus / "nothing*"), tokenizer=str(model)))
    # Once its entry exists, the corpus is checked against the model as a token file is.
    cache = tmp_path / "cache"
    write_entry(text_corpus(globs(corpus), str(model), str(cache), "data.tokenizer"), workers=1)
    with pytest.raises(ValueError, match=r"^model.vocab_size=256 is not allowed: data.files=.* needs at least 384"):
        validate_composed({**composed(kind="text", files=globs(corpus), tokenizer=str(model), cache_dir=str(cache)),
                           "model": {"vocab_size": 256}})


# The Slurm preparation job, as text


def test_the_preparation_job_and_the_arrays_dependency():
    # The job's CPUs are data.prepare_cpus, not the trials' cpus_per_task (a GPU node's 64 would queue it).
    options = sbatch_options({"cpus_per_task": 64, "timeout_min": 30, "partition": "gpu", "qos": None},
                             Path("/s/p.log"), 8)
    assert options == ["--job-name=hpcsweep-tokenize", "--output=/s/p.log", "--nodes=1", "--ntasks=1",
                       "--cpus-per-task=8", "--time=30", "--partition=gpu"]
    assert DataConfig().prepare_cpus == 8
    with pytest.raises(ValueError, match=r"^data.prepare_cpus=0 is not allowed: an integer >= 1 \(CPUs\)"):
        DataConfig(prepare_cpus=0)
    assert dependency_parameters(TokenPreparationRecord("41", "/s/p.log", [])) == {
        "dependency": "afterok:41", "kill_on_invalid_dep": "yes"}
    assert dependency_parameters(None) == {}


def test_the_preparation_job_runs_the_setup_lines_then_the_snapshots_hpcsweep(tmp_path):
    """The job imports the hpcsweep that was submitted (the snapshot's archive), after the user's own
    setup lines, as the trials' batch scripts do: not the installed or working tree's one."""
    code_dir = tmp_path / "sweep" / ".code"
    code_dir.mkdir(parents=True)
    marker = tmp_path / "ran.json"
    with zipfile.ZipFile(code_dir / ARCHIVE_FILE, "w") as archive:
        archive.writestr("hpcsweep/__init__.py", "")
        archive.writestr("hpcsweep/prepare/__init__.py", "")
        archive.writestr("hpcsweep/prepare/__main__.py", (
            "import json, os, sys\n"
            f"open({str(marker)!r}, 'w').write(json.dumps("
            "{'file': __file__, 'argv': sys.argv[1:], 'setup': os.environ.get('USER_SETUP')}))\n"))
    params = with_snapshot({"setup": ["export USER_SETUP=ran"], "code_snapshot": True}, code_dir)
    script = tmp_path / "prepare.sh"
    script.write_text(preparation_script(params["setup"]))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "USER_SETUP")}
    # From the repo's root, where python -m would otherwise import the working tree's hpcsweep.
    ran = subprocess.run(["sh", str(script), sys.executable, "--request", "r.json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(marker.read_text()) == {
        "file": str(code_dir / ARCHIVE_FILE / "hpcsweep" / "prepare" / "__main__.py"),
        "argv": ["--request", "r.json"], "setup": "ran"}


def test_the_request_names_the_files_found_at_submit_and_the_entry_to_write(tmp_path, folders):
    model, _, corpus = folders
    entry = text_corpus(globs(corpus), str(model), str(tmp_path), "data.tokenizer")
    (request,) = json.loads(preparation_request([entry]))
    assert request == {"files": [f.path for f in entry.files], "tokenizer": str(model), "cache_dir": str(tmp_path),
                       "key": entry.key, "needs": []}


def test_status_says_why_the_trials_were_cancelled_when_the_preparation_failed(tmp_path):
    log = tmp_path / "prepare.log"
    log.write_text("2026 hpcsweep: tokenizing\ntoken preparation failed: /c/x.jsonl:3 is not a JSON object\n\n")
    preparation = TokenPreparationRecord("41", str(log), [])
    state = parse_job_state("40|COMPLETED|0:0\n41|FAILED|1:0\n", "41")
    assert state == ("FAILED", "1:0")
    assert preparation_line(preparation, state) == (
        f"token preparation: job 41 FAILED (exit 1:0): the trials were cancelled, as they can never start without it; "
        f"log: {log}: token preparation failed: /c/x.jsonl:3 is not a JSON object")
    assert preparation_line(preparation, ("RUNNING", "0:0")).endswith("RUNNING: the trials wait for it to tokenize the corpus")
    assert preparation_line(preparation, ("COMPLETED", "0:0")).endswith("COMPLETED: the corpus is tokenized")
    assert parse_job_state("", "41") is None


# A local sweep


def test_a_local_sweep_of_two_trials_tokenizes_its_text_once_before_the_first_starts(tmp_path, folders):
    model, _, corpus = folders
    args = ["-m", "hydra/launcher=local", "data=text", f"data.files=[{corpus}/*.txt,{corpus}/*.jsonl]",
            f"data.tokenizer={model}", "model.vocab_size=384", "model.lr=1e-3,2e-3", "trainer.max_steps=2",
            "trainer.eval_every=2", "trainer.ckpt_every=2", "data.batch_size=2", "data.seq_len=16"]
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}
    result = subprocess.run([sys.executable, "-m", "hpcsweep", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    tokenizing = [i for i, line in enumerate(output.splitlines()) if "tokenizing 5 files with" in line]
    started = [i for i, line in enumerate(output.splitlines()) if "trial #0 started" in line]
    assert len(tokenizing) == 1 and started and tokenizing[0] < started[0], output[-3000:]
    # The default cache lies beside the sweep dirs, relative to where the sweep was submitted.
    (entry,) = (tmp_path / "multirun" / "token-cache").iterdir()
    (sweep_file,) = tmp_path.glob("multirun/*/*/sweep.json")
    for trial in json.loads(sweep_file.read_text())["trials"]:
        metrics = json.loads((tmp_path / trial["trial_dir"] / "metrics.json").read_text())
        assert metrics["status"] == "completed", metrics
    # A later sweep with the same tokenizer and corpus finds the entry: nothing is missing.
    again = text_corpus([f"{corpus}/*.txt", f"{corpus}/*.jsonl"], str(model), str(tmp_path / "multirun/token-cache"),
                        "data.tokenizer")
    assert again.entry == entry and again.is_cached()


def test_a_second_preparation_of_the_same_corpus_says_it_reuses_the_entry_and_tokenizes_nothing(
        tmp_path, folders, caplog):
    from hpcsweep.sweep.text_preparation import prepare_here

    model, _, corpus = folders
    trial = trial_config_from_dict(composed(kind="text", files=globs(corpus), tokenizer=str(model),
                                            cache_dir=str(tmp_path / "cache"), seq_len=16))
    cached = text_corpus(globs(corpus), str(model), str(tmp_path / "cache"), "data.tokenizer")
    reuse = f"data.files={globs(corpus)!r}: reusing its tokens, cache entry {cached.entry} (not tokenized again)"
    caplog.set_level("INFO", logger="hpcsweep.sweep.text_preparation")

    prepare_here([trial])
    first = list(caplog.messages)
    assert reuse not in first and any(m.startswith("tokenizing 5 files with") for m in first), first
    written = cached.token_path.stat().st_mtime_ns
    caplog.clear()

    prepare_here([trial, trial])  # two trials of one corpus: said once
    assert caplog.messages == [reuse]
    assert cached.token_path.stat().st_mtime_ns == written


def test_a_local_corpus_that_cannot_be_tokenized_ends_the_command_with_one_line(tmp_path, folders, caplog):
    from hpcsweep.sweep.text_preparation import prepare_here

    model, _, _ = folders
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    trial = trial_config_from_dict(composed(kind="text", files=str(tmp_path / "*.jsonl"), tokenizer=str(model),
                                            cache_dir=str(tmp_path / "cache")))
    with pytest.raises(SystemExit) as exit_info:
        prepare_here([trial])
    assert exit_info.value.code == 2
    assert caplog.messages[-1] == f"{tmp_path / 'bad.jsonl'}:2 has no string field 'text'; no trial ran"
    assert [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == []
    assert list((tmp_path / "cache").iterdir()) == []
