"""A tokenizer that ships its own code (a ``tokenizer_config.json`` ``auto_map``) loads wherever a trial
reads its tokenizer folder (the token preparation, the chat rendering, the packed documents' EOS, the
task scores) exactly as ``model.trust_remote_code`` says: refused by transformers without it, loaded
with it (issue 30, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict
from hpcsweep.files.token_file import read_token_header
from hpcsweep.sweep.text_preparation import preparation_request, prepare_here, sweep_text_corpus
from hpcsweep.prepare.text_tokens import prepare_requested, write_entry
from tests.task_fixtures import TASK, make_fact_chat_model, write_fact_chat_corpus, write_fact_corpus, write_fact_task

REMOTE_TOKENIZER = '''from transformers import PreTrainedTokenizerFast


class TinyRemoteTokenizer(PreTrainedTokenizerFast):
    """transformers has no class of this name: the folder loads only with trust_remote_code=True."""
'''
REFUSED = "contains custom code which must be executed"
"""What transformers says when a folder's own code is needed and not trusted."""


def with_remote_tokenizer(folder: Path) -> Path:
    """``folder``'s tokenizer made one whose class is the folder's own code (``tokenization_tiny_remote.py``)."""
    (folder / "tokenization_tiny_remote.py").write_text(REMOTE_TOKENIZER)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="TinyRemoteTokenizer",
                  auto_map={"AutoTokenizer": [None, "tokenization_tiny_remote.TinyRemoteTokenizer"]})
    path.write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny DeepseekV3 whose tokenizer (with a chat template) is remote code, its facts as text and
    chat corpora, and an lm-eval task."""
    root = tmp_path_factory.mktemp("remote-tokenizer")
    model = with_remote_tokenizer(make_fact_chat_model(root / "model"))
    text, chat = write_fact_corpus(root / "text"), write_fact_chat_corpus(root / "chat")
    return model, text, chat, write_fact_task(root / "tasks")


def trial(files, cache: Path, kind: str, trust: bool, **data):
    model, text, chat, _ = files
    corpus = text / "*.txt" if kind == "text" else chat / "*.jsonl"
    return trial_config_from_dict({
        "model": {"path": str(model), "trust_remote_code": trust},
        "data": {"kind": kind, "files": str(corpus), "cache_dir": str(cache), "seq_len": 32, "batch_size": 4, **data},
    })


def remote_tokenizer(model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True, trust_remote_code=True)
    assert type(tokenizer).__name__ == "TinyRemoteTokenizer"
    return tokenizer


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_the_preparation_job_loads_the_tokenizer_with_model_trust_remote_code(tmp_path, files, kind):
    model, text, *_ = files
    untrusted = trial(files, tmp_path / "cache", kind, trust=False)
    (request,) = json.loads(preparation_request([sweep_text_corpus(untrusted)], [untrusted]))
    with pytest.raises(ValueError, match=REFUSED):
        prepare_requested(request, workers=1)

    trusted = trial(files, tmp_path / "cache", kind, trust=True)
    corpus = sweep_text_corpus(trusted)
    (request,) = json.loads(preparation_request([corpus], [trusted]))
    assert request["trust_remote_code"] is True
    token_path = prepare_requested(request, workers=1)
    assert corpus.is_cached() and token_path == corpus.token_path
    tokenizer = remote_tokenizer(model)
    header = read_token_header(token_path)
    assert header.vocab_size == len(tokenizer)
    tokens = np.fromfile(token_path, dtype=np.dtype(header.dtype))
    if kind == "text":  # the first document (in path order) and its EOS come first
        ids = tokenizer((text / "doc-000.txt").read_text(), add_special_tokens=False)["input_ids"]
        assert tokens[:len(ids) + 1].tolist() == [*ids, tokenizer.eos_token_id]
    else:
        assert len(tokens) == header.num_tokens > 0


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_worker_processes_load_it_trusted_too(tmp_path, files, kind):
    corpus = sweep_text_corpus(trial(files, tmp_path / "cache", kind, trust=True))
    # Pieces of 1 kB: several, so two forked workers each load the tokenizer in their initializer.
    write_entry(corpus, workers=2, piece_bytes=1024)
    one = sweep_text_corpus(trial(files, tmp_path / "one", kind, trust=True))
    write_entry(one, workers=1)
    assert corpus.token_path.read_bytes() == one.token_path.read_bytes()


def test_a_trial_that_trusts_its_tokenizer_code_packs_its_documents_and_scores_tasks(tmp_path, files):
    from hpcsweep.train import worker

    model, *_, tasks = files
    cfg = trial_config_to_dict(trial(files, tmp_path / "cache", "text", trust=True, packing=True))
    cfg["trainer"] = {"device": "cpu", "max_steps": 2, "warmup_steps": 0, "eval_batches": 1, "log_every": 1,
                      "ckpt_every": 0, "telemetry_every_s": 0}
    cfg["tasks"] = {"names": [TASK], "include_path": str(tasks), "limit": 4}
    parsed = trial_config_from_dict(cfg)
    prepare_here([parsed])
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(parsed)))
    assert worker.run_trial(trial_dir) == 0
    metrics = json.loads((trial_dir / "metrics.json").read_text())
    assert metrics["status"] == "completed" and 0.0 <= metrics["tasks"][TASK]["acc"] <= 1.0



def test_an_edit_of_the_tokenizers_own_code_is_another_cache_key(tmp_path, files):
    import shutil

    from hpcsweep.files.token_cache import tokenizer_sha256

    folder = Path(shutil.copytree(files[0], tmp_path / "model"))
    before = tokenizer_sha256(folder)
    code = folder / "tokenization_tiny_remote.py"
    code.write_text(code.read_text() + "\n# a changed tokenizer\n")
    assert tokenizer_sha256(folder) != before
