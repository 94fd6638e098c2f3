"""``scripts/make-example-model``, the README's one command for its fine-tuning example: it writes the same
model folder and corpus as the test suite's helpers (``tests/model_folders.py``), byte for byte, and
refuses to write over a folder that holds files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.model_folders import make_model_folder, write_text_corpus

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "make-example-model"


def run_script(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # it needs no checkout on the path
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env={**env, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_it_writes_the_readmes_model_folder_and_corpus_as_the_tests_make_them(tmp_path):
    done = run_script(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("wrote models/tiny-deepseek (a tiny DeepSeek-V3 and its tokenizer) and corpus")
    expected = tmp_path / "expected"
    make_model_folder(expected / "model")
    write_text_corpus(expected / "corpus")
    assert files(tmp_path / "models" / "tiny-deepseek") == files(expected / "model")
    assert files(tmp_path / "corpus") == files(expected / "corpus")


def test_it_refuses_a_folder_that_holds_files_and_writes_nothing(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "mine.txt").write_text("keep me")
    done = run_script(tmp_path)
    assert done.returncode == 2
    assert done.stderr == "make-example-model: corpus exists and is not empty; nothing was written\n"
    assert not (tmp_path / "models").exists()
    assert [p.name for p in (tmp_path / "corpus").iterdir()] == ["mine.txt"]
