"""Tokenize a ``data=text`` sweep's corpus once, before its trials: here, or in one Slurm job.

Every trial of a sweep with the same tokenizer and corpus reads one token cache entry
(``hpcsweep.files.token_cache``), so the corpus is tokenized once per (tokenizer, corpus), however
many trials and sweeps read it. A local sweep writes a missing entry before its first trial starts.
On Slurm the login node never tokenizes, whatever the corpus's size: one preparation job writes
every missing entry, and each trial array waits on it (``--dependency=afterok:JOB``) and is
cancelled by Slurm if it fails (``--kill-on-invalid-dep=yes``). ``sweep.json`` records the job and
its log, which ``python -m hpcsweep.status`` names when it failed.

The job's script is the launcher's ``setup`` lines, as the trials' batch scripts run them (the
user's own, then the code snapshot's: the job imports the hpcsweep that was submitted, as the trials
do, not the working tree as it is when the job starts), then one fixed line; the corpus, tokenizer
and cache dir reach it as arguments, never through a shell. In a container (``hydra.launcher.container``)
that line runs the image's Python in it, as the trials' tasks do: a job step with pyxis's or Slurm
OCI's flags, or Apptainer's command in front.
"""

from __future__ import annotations

import functools
import json
import logging
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.config import TEMPLATE_KINDS, TrialConfig, reference_folder, tokenizer_folder
from hpcsweep.files.atomic import atomic_write_text
from hpcsweep.files.sweep_record import TokenPreparationRecord
from hpcsweep.files.chat_samples import SampleSelection, check_samples
from hpcsweep.files.preference_pairs import PairSelection, check_pairs
from hpcsweep.files.token_cache import ChatRendering, TextCorpus, TokenCacheError, chat_rendering, glob_patterns, text_corpus
from hpcsweep.slurm import commands
from hpcsweep.sweep.containers import launch_of
from hpcsweep.sweep.sweep_trials import exit_with_config_error

log = logging.getLogger(__name__)

PREPARATION_DIR = ".token-preparation"
"""In the sweep dir: the preparation job's script, its request, and each preparation job's log."""
JOB_NAME = "hpcsweep-tokenize"
SCRIPT_RUN = """\
python="$1"
shift
exec {step}"$python" -m hpcsweep.prepare "$@"
"""
"""The script's fixed end: ``$1`` is the Python to run, the rest its arguments; ``{step}`` the words that run
it in a container (empty without one)."""


def preparation_script(setup: Sequence[str], step: Sequence[str] = ()) -> str:
    """The preparation job's script: the launcher's ``setup`` lines, then ``SCRIPT_RUN``; ``step``: the words in
    front of the Python, quoted (a container's ``srun`` flags or ``apptainer exec ... IMAGE``)."""
    run = SCRIPT_RUN.format(step=shlex.join(step) + " " if step else "")
    return "\n".join(["#!/bin/sh", "# hpcsweep's token preparation job: $1 is the Python to run, the rest its arguments.",
                      *setup, run])


TOKENIZED_KINDS = ("text", "chat", "preference")
"""The ``data.kind``s whose files are tokenized into the token cache."""


@functools.cache
def _text_corpus(files: tuple[str, ...], folder: str, cache_dir: str, tokenizer_key: str,
                 chat: ChatRendering | None, trust_remote_code: bool, preference: bool) -> TextCorpus:
    return text_corpus(list(files), folder, cache_dir, tokenizer_key, chat, trust_remote_code=trust_remote_code,
                       preference=preference)


@functools.cache
def _chat_rendering(template_path: str | None, train_on: str, template_kwargs: tuple[tuple[str, Any], ...]) -> ChatRendering:
    return chat_rendering(template_path, train_on, dict(template_kwargs))


def sweep_text_corpus(trial: TrialConfig) -> TextCorpus:
    """The ``TextCorpus`` of a ``data.kind=text``, ``chat`` or ``preference`` trial, globbed and hashed once per distinct
    (files, tokenizer, cache dir, template, its variables, train_on) in this login-node command, not once per trial of a
    1,000-trial sweep."""
    data = trial.data
    folder = tokenizer_folder(data, trial.model)
    assert data.files is not None and folder is not None  # DataConfig and TrialConfig check both
    key = "data.tokenizer" if data.tokenizer else "model.path"
    variables = tuple(sorted((data.chat_template_kwargs or {}).items()))
    rendered = data.kind in ("chat", "preference")
    chat = _chat_rendering(data.chat_template, data.train_on, variables) if rendered else None
    return _text_corpus(tuple(glob_patterns(data.files)), folder, data.cache_dir, key, chat,
                        trial.model.trust_remote_code, data.kind == "preference")


def reference_models(trials: Sequence[TrialConfig], corpus: TextCorpus) -> list[tuple[str, bool]]:
    """The reference folders (with their ``model.trust_remote_code``) whose answer log-probabilities the preparation
    computes for ``corpus``: those its DPO trials read (``hpcsweep.config.reference_folder``;
    ``hpcsweep.prepare.reference_logps``), in trial order."""
    found: dict[str, bool] = {}
    for trial in trials:
        folder = reference_folder(trial)
        if folder is not None and sweep_text_corpus(trial).key == corpus.key:
            found.setdefault(folder, trial.model.trust_remote_code)
    return list(found.items())


def missing_references(trials: Sequence[TrialConfig], corpus: TextCorpus) -> list[tuple[str, bool]]:
    """``reference_models`` whose file ``corpus``'s entry does not hold yet; each one it holds is said to be reused."""
    from hpcsweep.prepare.reference_logps import reference_path

    missing = []
    for model, trust in reference_models(trials, corpus):
        if corpus.is_cached() and reference_path(corpus.entry, model).is_file():
            key = "objective.reference" if any(t.objective.reference == model for t in trials) else "model.path"
            log.info("%s=%s: reusing its reference log-probabilities of data.files in %s (not computed again)", key,
                     model, corpus.entry)
        else:
            missing.append((model, trust))
    return missing


def missing_corpora(trials: Sequence[TrialConfig]) -> list[TextCorpus]:
    """The distinct ``data=text``/``chat`` corpora of ``trials`` that have no cache entry yet, in trial order;
    each one that has is said to be reused, once. A written preference corpus still missing a reference's
    log-probabilities (``missing_references``) counts as missing: the preparation computes them."""
    found: dict[str, tuple[TextCorpus, Any]] = {}
    for trial in trials:
        if trial.data.kind in TOKENIZED_KINDS:
            corpus = sweep_text_corpus(trial)
            found.setdefault(corpus.key, (corpus, trial.data.files))
    for corpus, files in found.values():
        if corpus.is_cached():
            log.info("data.files=%r: reusing its tokens, cache entry %s (not tokenized again)", files, corpus.entry)
    return [corpus for corpus, _ in found.values()
            if not corpus.is_cached() or (corpus.preference and missing_references(trials, corpus))]


def prepare_here(trials: Sequence[TrialConfig]) -> None:
    """Write every missing cache entry of ``trials`` now, on this machine's CPUs (a local sweep, a
    single run); a corpus that cannot be tokenized, or whose exact count is too small for a trial's
    ``data.seq_len`` (as the Slurm preparation job checks it), ends the command with one line, no trial run."""
    from hpcsweep.files.token_file import read_token_header
    from hpcsweep.prepare.reference_logps import write_reference_logps
    from hpcsweep.prepare.text_documents import CorpusError
    from hpcsweep.prepare.text_tokens import available_cpus, check_needs, write_entry

    for corpus in missing_corpora(trials):
        log.info("tokenizing %d files with %s into %s", len(corpus.files), corpus.tokenizer_folder, corpus.entry)
        try:
            token_path = write_entry(corpus, available_cpus())
            check_needs(read_token_header(token_path), sample_needs(trials, (), corpus),
                        f"the corpus tokenized into {corpus.entry}")
            for model, trust in reference_models(trials, corpus):
                write_reference_logps(corpus, model, trust_remote_code=trust)
        except (TokenCacheError, CorpusError) as err:
            exit_with_config_error(err, "no trial ran")
    summaries = []
    for trial in trials:
        if trial.data.kind in TEMPLATE_KINDS:
            try:
                summary = checked_samples(trial).summary(trial.data)
            except ValueError as err:
                exit_with_config_error(err, "no trial ran")
            if summary not in summaries:
                summaries.append(summary)
                log.info("%s at data.seq_len=%d: %s", "preference pairs" if trial.data.kind == "preference"
                         else "chat samples", trial.data.seq_len, summary)


_selections: dict[tuple[Any, ...], SampleSelection | PairSelection] = {}


def checked_samples(trial: TrialConfig) -> SampleSelection | PairSelection:
    """``check_samples`` of a ``data.kind=chat`` trial whose entry is written (``check_pairs`` of a
    ``preference`` one), once per distinct (entry, ``seq_len``, ``overlong``, ``max_samples``) in this login-node
    command."""
    corpus, data = sweep_text_corpus(trial), trial.data
    key = (str(corpus.entry), data.seq_len, data.overlong, data.max_samples)
    if key not in _selections:
        _selections[key] = check_pairs(corpus, data) if corpus.preference else check_samples(corpus, data)
    return _selections[key]


def sample_checks(corpus: TextCorpus, trials: Sequence[TrialConfig]) -> list[dict[str, Any]]:
    """The distinct sample selections (``hpcsweep.files.chat_samples``; of pairs, ``preference_pairs``) that the
    preparation job checks on a chat or preference corpus once written, so an overlong sample or pair under
    ``data.overlong=refuse`` fails it."""
    checks = {
        (t.data.seq_len, t.data.overlong, t.data.max_samples): None
        for t in trials if t.data.kind in TEMPLATE_KINDS and sweep_text_corpus(t).key == corpus.key
    }
    return [{"seq_len": s, "overlong": o, "max_samples": m} for s, o, m in checks]


def sample_needs(trials: Sequence[TrialConfig], trial_dirs: Sequence[Path], corpus: TextCorpus) -> list[dict[str, Any]]:
    """What the ``data=text`` trials that read ``corpus`` need of its token count, one entry per distinct
    (``data.seq_len``, ``data.val_fraction``) with the dirs of the trials that need it (``trial_dirs``: in
    the order of ``trials``, or empty when unknown). A chat corpus's samples are checked by ``sample_checks``."""
    needs: dict[tuple[int, float], list[str]] = {}
    for num, trial in enumerate(trials):
        if trial.data.kind == "text" and sweep_text_corpus(trial).key == corpus.key:
            dirs = needs.setdefault((trial.data.seq_len, trial.data.val_fraction), [])
            if num < len(trial_dirs):
                dirs.append(str(trial_dirs[num]))
    return [{"seq_len": s, "val_fraction": v, "trial_dirs": dirs} for (s, v), dirs in needs.items()]


def preparation_request(
    corpora: Sequence[TextCorpus], trials: Sequence[TrialConfig] = (), trial_dirs: Sequence[Path] = ()
) -> str:
    """The job's request file: for each corpus, its files as found at submit, its tokenizer, the cache
    entry it must write (a corpus changed since is refused), and what its trials need of its token count
    (``sample_needs``), which the job checks exactly once it has counted them; for a chat corpus also its
    template, the template's variables, ``train_on`` and the sample selections of ``trials`` to check once it is written; and
    ``trust_remote_code`` when its tokenizer may run the code its folder ships."""
    requests = []
    for c in corpora:
        request: dict[str, Any] = {"files": [f.path for f in c.files], "tokenizer": c.tokenizer_folder,
                                   "cache_dir": c.cache_dir, "key": c.key, "needs": sample_needs(trials, trial_dirs, c)}
        if c.trust_remote_code:
            request["trust_remote_code"] = True
        if c.preference:
            request["preference"] = True
            from hpcsweep.prepare.reference_logps import reference_key

            references = [{"model": model, "key": reference_key(model), "trust_remote_code": trust}
                          for model, trust in reference_models(trials, c)]
            if references:
                request["references"] = references
        if c.chat is not None:
            request["chat"] = {"template": c.chat.template_path, "train_on": c.chat.train_on}
            request["chat"]["checks"] = sample_checks(c, trials)
            if c.chat.template_kwargs:
                request["chat"]["template_kwargs"] = c.chat.template_variables()
        requests.append(request)
    return json.dumps(requests, indent=2) + "\n"


def sbatch_options(params: Mapping[str, Any], log_path: Path, cpus: int, gpu: bool = False) -> list[str]:
    """The preparation job's sbatch options: one task of ``cpus`` CPUs on one node, on the launcher's
    partition, QOS and account, within its time limit; ``gpu``: one of the trials' GPUs too (a reference
    model's log-probabilities to compute), when the trials ask for GPUs."""
    options = [
        f"--job-name={JOB_NAME}", f"--output={log_path}", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}",
    ]
    if gpu and params.get("gpus_per_node"):
        options.append("--gpus-per-node=1")
    if params.get("timeout_min"):
        options.append(f"--time={int(params['timeout_min'])}")
    for key in ("partition", "qos", "account"):
        if params.get(key):
            options.append(f"--{key}={params[key]}")
    return options


def log_name(job_id: str) -> str:
    """The preparation job's log file, in ``PREPARATION_DIR``."""
    return f"prepare-{job_id}.log"


def submit_preparation(
    trials: Sequence[TrialConfig], params: Mapping[str, Any], sweep_dir: Path, trial_dirs: Sequence[Path] = ()
) -> TokenPreparationRecord | None:
    """Submit the one job that writes every missing cache entry of ``trials``; None when none is missing.

    The job prepares the corpora one after another, each over all its CPUs. ``params`` are the launcher
    settings the trials are submitted with, their code snapshot's ``setup`` lines and container included
    (``hpcsweep.sweep.containers.submission_params``). ``trial_dirs`` (in the order of ``trials``) are where
    it records why a trial can never start, when its corpus is too small for it.
    """
    corpora = missing_corpora(trials)
    if not corpora:
        return None
    folder = sweep_dir / PREPARATION_DIR
    script, request = folder / "prepare.sh", folder / "request.json"
    launch = launch_of(params)
    # In a container: the image's Python, started by the launch's words.
    step, python = (launch.step_prefix(), launch.python) if launch else ([], sys.executable)
    atomic_write_text(script, preparation_script(params.get("setup") or (), step))
    atomic_write_text(request, preparation_request(corpora, trials, trial_dirs))
    # Each job logs to its own file (sbatch fills in %j): a retry's preparation keeps the failed one's log.
    cpus = max(t.data.prepare_cpus for t in trials if t.data.kind in TOKENIZED_KINDS)
    gpu = any(c.preference and reference_models(trials, c) for c in corpora)
    options = sbatch_options(params, folder / log_name("%j"), cpus, gpu)
    job_id = commands.sbatch(options, str(script), [python, "--request", str(request)])
    log_path = folder / log_name(job_id)
    log.info("token preparation: job %s tokenizes %s on %d CPUs (data.prepare_cpus); the trials wait on it", job_id,
             ", ".join(f"{len(c.files)} files into {c.entry}" for c in corpora), cpus)
    return TokenPreparationRecord(job_id, str(log_path), [str(c.entry) for c in corpora])


def dependency_parameters(preparation: TokenPreparationRecord | None) -> dict[str, str]:
    """The sbatch options (submitit's ``slurm_additional_parameters``) that make an array wait on the
    preparation and be cancelled when it fails."""
    if preparation is None:
        return {}
    return {"dependency": f"afterok:{preparation.job_id}", "kill_on_invalid_dep": "yes"}
