"""The reference model's answer log-probabilities of a preference corpus, computed once, beside its pairs.

A full fine-tuning DPO trial (``objective=dpo model.peft=none``) compares the model that trains with the model
it started from, which it no longer holds. So the preparation job computes, once per (reference model, pairs,
template), the summed log-probability of every answer under the reference (the folder ``model.path`` names, as
published: float32, its own attention), and writes them into the pairs' cache entry
(``hpcsweep.prepare.preference_tokens``) as ``reference-KEY.bin``: one float64 per sequence, in the entry's
sequence order (pair ``i``'s chosen answer ``2i``, its rejected one ``2i + 1``). ``KEY`` hashes the folder's
identity (``hpcsweep.model.folder.model_identity``: its config and a fingerprint of its safetensors) and how the
numbers were computed, so a retrained folder gets new numbers and every trial and later sweep on the same folder
and pairs reads the same file. The file is written beside the entry and renamed into place: a reader sees it
whole or not at all.

Each sequence runs alone in its row (rows right-padded: a causal model's positions never read the padding after
them), without gradients, on the job's GPU when it has one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import fsync_dir
from hpcsweep.files.token_cache import TextCorpus
from hpcsweep.model.folder import model_identity, read_model_folder

log = logging.getLogger(__name__)

REFERENCE_FORMAT = {"format": 1, "dtype": "float32", "rows": "one sequence a row"}
"""How the numbers are computed, part of the key: a change here makes new files."""
REFERENCE_BYTES_PER_PARAMETER = 4
"""The folder's weights as the job loads them (float32, ``REFERENCE_FORMAT``), which the login node checks
against one of the trials' GPUs (``hpcsweep.sweep.memory_check.reference_refusal``)."""
ROWS_PER_FORWARD = 8
"""Sequences a forward of the reference takes."""


@functools.cache
def reference_key(model_path: str) -> str:
    """The key of the reference log-probabilities of the folder ``model_path`` (absolute or not)."""
    identity = model_identity(read_model_folder(os.path.abspath(os.path.expanduser(model_path))))
    described = {"config": identity["config"], "fingerprint": identity["fingerprint_sha256"], **REFERENCE_FORMAT}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


def reference_path(entry: Path, model_path: str) -> Path:
    """Where the pairs' entry ``entry`` keeps the log-probabilities of the reference ``model_path``."""
    return entry / f"reference-{reference_key(model_path)}.bin"


def write_reference_logps(corpus: TextCorpus, model_path: str, *, trust_remote_code: bool = False) -> Path:
    """Compute the reference's answer log-probabilities of ``corpus`` (a written preference entry) unless its file
    is there; return the file."""
    out = reference_path(corpus.entry, model_path)
    if out.is_file():
        log.info("reference log-probabilities of %s: reusing %s (not computed again)", model_path, out)
        return out
    logps = reference_logps(corpus, model_path, trust_remote_code=trust_remote_code)
    fd, staging = tempfile.mkstemp(dir=corpus.entry, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(logps.tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, out)
        fsync_dir(corpus.entry)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return out


def reference_logps(corpus: TextCorpus, model_path: str, *, trust_remote_code: bool = False) -> Any:
    """Every answer's summed log-probability under ``model_path``'s model (float64 numpy, one per sequence)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from hpcsweep.files.token_cache import OFFSETS_NAME, SPANS_NAME
    from hpcsweep.files.token_file import read_token_header

    header = read_token_header(corpus.token_path)
    tokens = np.memmap(corpus.token_path, dtype=header.dtype, mode="r")
    offsets = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)
    spans = np.fromfile(corpus.entry / SPANS_NAME, dtype=np.int64).reshape(-1, 2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True,
                                                 trust_remote_code=trust_remote_code).to(device).eval()
    head = model.get_output_embeddings()
    sequences = len(offsets) - 1
    out = np.empty(sequences, dtype=np.float64)
    with torch.no_grad():
        for first in range(0, sequences, ROWS_PER_FORWARD):
            chosen = range(first, min(first + ROWS_PER_FORWARD, sequences))
            lengths = [int(offsets[s + 1] - offsets[s]) for s in chosen]
            rows = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
            for row, s in enumerate(chosen):
                rows[row, : lengths[row]] = tokens[offsets[s] : offsets[s + 1]]
            inputs = torch.from_numpy(rows).to(device)
            # The head on the answers' positions only: the logits of every position of 8 rows would be the
            # largest tensor of the job (8 x 4096 x 102,400 fp32 = 13 GB at DeepSeek-MoE-16B's vocabulary).
            hidden = model.get_decoder()(input_ids=inputs, use_cache=False).last_hidden_state
            for row, s in enumerate(chosen):
                lo, hi = (int(v) for v in spans[s])
                # Answer token j is predicted at position j - 1.
                logits = head(hidden[row, lo - 1 : hi - 1]).float()
                token_logps = torch.log_softmax(logits, dim=-1).gather(-1, inputs[row, lo:hi, None])[:, 0]
                out[s] = float(token_logps.double().sum())
    log.info("reference log-probabilities of %d answers under %s computed on %s", sequences, model_path, device)
    return out
