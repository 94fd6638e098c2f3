"""hpcsweep's own checks of its trials: the trial schema, and resuming a trial dir.

A trial whose dir already holds a checkpoint is checked against the config it was trained with
(``hpcsweep.trial.identity``), every trial before any runs: a bad resume fails at once.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpcsweep.config import (
    CHAT_TEMPLATE_OWN_NAMES,
    ResumeConfig,
    TrialConfig,
    check_corpus_fits,
    tokenizer_folder,
    trial_config_from_dict,
)
from hpcsweep.files.token_cache import (
    TextCorpus,
    TokenCacheError,
    chat_template_texts,
    has_chat_template,
    tokenizer_sha256,
)
from hpcsweep.files.token_file import TokenFileError, TokenHeader, read_token_header
from hpcsweep.model.folder import ModelFolder, check_model_folder, read_model_folder
from hpcsweep.sweep.corpus_checks import check_corpus_may_fit, check_tokenizer_has_eos
from hpcsweep.sweep.jsonl_checks import check_corpus_lines
from hpcsweep.sweep.model_records import SweepModelRecords
from hpcsweep.sweep.sweep_trials import SweepConfigError, trial_label
from hpcsweep.sweep.text_preparation import checked_samples, sweep_text_corpus
from hpcsweep.files.task_files import check_tasks
from hpcsweep.trial.identity import (
    ConfigMismatch,
    differences_text,
    mismatch_message,
    resume_differences,
)

log = logging.getLogger(__name__)

BYTE_LEVEL_TOKENIZER = "bytes"
"""The tokenizer a byte-level token file's header names (``scripts/prepare-data`` without ``--tokenizer``/``--model``)."""


@dataclass(frozen=True)
class PreparedTrial:
    """One composed trial of hpcsweep's, validated."""

    num: int
    overrides: list[str]
    trial_dir: Path
    config: TrialConfig
    resume: ResumeConfig = field(default_factory=ResumeConfig)


def validate_composed(
    config: DictConfig | Mapping[str, Any], records: SweepModelRecords | None = None
) -> TrialConfig:
    """Validate one composed Hydra config (the ``hydra`` node, resolved only at run time, is skipped),
    its model folder and token file included. ``records``: the sweep's model folders as read once
    (``hpcsweep.sweep.model_records``); without it, the trial's folder is read here."""
    values: dict[str, Any] = {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in config.items()
        if key != "hydra"
    }
    trial = trial_config_from_dict(values)
    check_model_and_data(trial, records)
    check_tasks(trial)
    return trial


def check_model_and_data(trial: TrialConfig, records: SweepModelRecords | None = None) -> None:
    """Raise ``ValueError`` naming the key when the trial's model folder (``model.path``), or its
    token file or text, cannot be used; the vocabulary that counts is the folder's, when it has one.

    The folder comes from ``records`` (the sweep's, read once for all its trials); without it (a single
    run, or a task checking again what may have changed since submit), its files are read here."""
    if trial.model.path is None:
        folder = None
    elif records is None:  # the folder's files only: nothing here needs its weights' fingerprint
        folder = read_model_folder(trial.model.path)
    else:
        folder = records.record(trial.model).folder
    check_pretrained_model(trial, folder)
    if folder is None:
        check_token_file(trial, trial.model.vocab_size)
    else:
        check_token_file(trial, folder.vocab_size, vocab_key=f"{folder.key}: vocab_size")


def check_pretrained_model(trial: TrialConfig, folder: ModelFolder | None) -> None:
    """Refuse the ``folder`` ``model.path`` names, as read (``ModelRecord.folder``), when it cannot train
    (``hpcsweep.model.folder.check_model_folder``) or does not fit the data: its ``max_position_embeddings``
    bounds ``data.seq_len``, and its vocabulary is what the synthetic corpus is drawn from. Nothing to
    check for the built-in model (``folder`` None), which ``TrialConfig`` checks itself."""
    model, data = trial.model, trial.data
    if folder is None:
        return
    check_model_folder(folder, trust_remote_code=model.trust_remote_code, random_init=model.random_init)
    if folder.needs_remote_code and model.moe.aux_loss_coef is not None:
        # Its own code routes and adds its own balance loss (hpcsweep.train.moe.own_gate_stats): a coefficient
        # given here would train nothing, and the user would believe it did.
        raise ValueError(
            f"model.moe.aux_loss_coef={model.moe.aux_loss_coef} is not allowed with {folder.key}: it runs its "
            f"own model code, which adds its own balance loss at its config.json's aux_loss_alpha "
            f"({folder.config.get('aux_loss_alpha')}); leave the key null (change aux_loss_alpha in a copy of the "
            "folder, never to 0)")
    if folder.vocab_size is None:
        raise ValueError(f"{folder.key} is not allowed: its config.json has no integer vocab_size")
    limit = folder.max_position_embeddings
    if limit is not None and data.seq_len > limit:
        raise ValueError(
            f"data.seq_len={data.seq_len} is not allowed: at most {limit}, the max_position_embeddings of {folder.key}"
        )
    if data.kind == "synthetic":
        check_corpus_fits(
            data, folder.vocab_size, num_tokens=data.synthetic_tokens, corpus_vocab_size=folder.vocab_size,
            source=f"the synthetic corpus (data.synthetic_tokens={data.synthetic_tokens})",
            vocab_key=f"{folder.key}: vocab_size",
        )


def check_token_file(trial: TrialConfig, model_vocab_size: int, vocab_key: str = "model.vocab_size") -> None:
    """Raise ``ValueError`` naming ``data.path`` as typed when the trial's token file is missing or
    unreadable, made with another tokenizer than the trial's, or when its corpus does not fit the
    model's vocabulary (``model.vocab_size``, or that of the folder ``model.path`` names) and
    ``data.seq_len``. For ``data.kind=text``: naming ``data.files`` or the tokenizer when they cannot
    be used, and checking the cache entry once it exists. For ``data.kind=preference``: every line."""
    data = trial.data
    if data.kind == "chat":
        check_chat_corpus(trial)
        return
    if data.kind == "preference":
        check_preference_corpus(trial)
        return
    if data.kind == "text":
        check_text_corpus(trial, model_vocab_size, vocab_key)
        return
    if data.kind != "file":
        return
    assert data.path is not None
    try:
        header = read_token_header(Path(data.path))
    except TokenFileError as err:
        raise ValueError(f"data.path={data.path!r} is not allowed: {err}") from None
    check_same_tokenizer(trial, header)
    check_corpus_fits(
        data,
        model_vocab_size,
        num_tokens=header.num_tokens,
        corpus_vocab_size=header.vocab_size,
        source=data.path,
        vocab_key=vocab_key,
    )


def check_same_tokenizer(trial: TrialConfig, header: TokenHeader) -> None:
    """Refuse a token file whose header records another tokenizer's hash than the trial's tokenizer
    folder (``data.tokenizer``, else the model folder's); a file or a trial without one passes."""
    folder = tokenizer_folder(trial.data, trial.model)
    key = "data.tokenizer" if trial.data.tokenizer else "model.path"
    if folder is not None and header.tokenizer == BYTE_LEVEL_TOKENIZER:
        raise ValueError(
            f"data.path={trial.data.path!r} is not allowed: it holds byte-level tokens (scripts/prepare-data without "
            f"--model), not those of {key}={folder!r}'s tokenizer; tokenize the text with it "
            f"(scripts/prepare-data --model {folder} --out FILE.bin TEXT...), or use data=text"
        )
    if folder is None or header.tokenizer_sha256 is None:
        return
    try:
        digest = tokenizer_sha256(folder)
    except (TokenCacheError, OSError) as err:
        raise ValueError(f"{key}={folder!r} is not allowed: {err}") from None
    if digest != header.tokenizer_sha256:
        raise ValueError(
            f"data.path={trial.data.path!r} is not allowed: it was made with another tokenizer "
            f"({header.tokenizer or 'unnamed'}, sha256 {header.tokenizer_sha256[:12]}) than {key}={folder!r} "
            f"(sha256 {digest[:12]}); tokenize the text again with this tokenizer (scripts/prepare-data --model)"
        )


def check_text_corpus(trial: TrialConfig, model_vocab_size: int, vocab_key: str = "model.vocab_size") -> None:
    """The tokenizer folder and ``data.files`` of a ``data.kind=text`` trial can be used, and its
    cache entry, once written, fits the model."""
    corpus = sweep_text_corpus(trial)
    if not corpus.is_cached():
        # Estimated here, counted exactly by the preparation (hpcsweep.sweep.corpus_checks says how).
        check_tokenizer_has_eos(corpus, "data.tokenizer" if trial.data.tokenizer else "model.path")
        check_corpus_may_fit(trial.data, corpus)
        _check_lines(corpus, trial)
        return
    try:
        header = read_token_header(corpus.token_path)
    except TokenFileError as err:
        raise ValueError(f"data.files={trial.data.files!r} is not allowed: its token cache entry "
                         f"{corpus.entry} is broken ({err}): delete it to tokenize again") from None
    check_corpus_fits(
        trial.data,
        model_vocab_size,
        num_tokens=header.num_tokens,
        corpus_vocab_size=header.vocab_size,
        source=f"data.files={trial.data.files!r} (tokenized into {corpus.token_path})",
        vocab_key=vocab_key,
    )


def check_chat_corpus(trial: TrialConfig) -> None:
    """A ``data.kind=chat`` (or ``preference``) trial's tokenizer has a chat template (or ``data.chat_template`` names one)
    that reads every variable ``data.chat_template_kwargs`` sets, and its cache entry, once written, holds
    no sample it refuses (``data.overlong=refuse``)."""
    corpus = sweep_text_corpus(trial)
    if trial.data.chat_template is None and not has_chat_template(corpus.tokenizer_folder):
        raise ValueError(
            f"data.chat_template=null is not allowed: the tokenizer in {corpus.tokenizer_folder} has no chat "
            "template (tokenizer_config.json's chat_template, or chat_template.jinja); name a Jinja file"
        )
    if trial.data.chat_template_kwargs:
        assert corpus.chat is not None
        source = corpus.chat.template_path or corpus.tokenizer_folder
        reads = _template_reads(corpus.chat.template_path, corpus.chat.template_sha256 or corpus.tokenizer_sha256,
                                corpus.tokenizer_folder)
        for name in trial.data.chat_template_kwargs:
            if name not in reads:
                its_own = ", ".join(sorted(reads - set(CHAT_TEMPLATE_OWN_NAMES) - _TRANSFORMERS_GLOBALS)) or "none"
                raise ValueError(
                    f"data.chat_template_kwargs.{name} is not allowed: the chat template of {source} never reads "
                    f"{name} (the variables it reads that the key may set: {its_own})"
                )
    if corpus.is_cached():
        checked_samples(trial)
    else:
        _check_lines(corpus, trial)


def check_preference_corpus(trial: TrialConfig) -> None:
    """A ``data.kind=preference`` trial's reference: under full fine-tuning a folder whose log-probabilities the
    preparation computes once (the pretrained ``model.path`` it starts from, or ``objective.reference``), which
    must exist and share the trial's vocabulary; its template is checked as a chat trial's, and every line of its
    files not yet tokenized is a pair (``jsonl_checks``)."""
    if trial.objective.reference is not None:
        check_reference_folder(trial)
    elif trial.model.peft == "none" and trial.model.path and trial.model.random_init:
        raise ValueError(
            "model.random_init=true is not allowed with objective=dpo and model.peft=none: the reference is the "
            "folder's trained weights, which the trial would not start from; set model.random_init=false, or name "
            "the reference (objective.reference=DIR)")
    elif trial.model.peft == "none" and not trial.model.path:
        raise ValueError(
            "model.path=null is not allowed with objective=dpo and model.peft=none: full fine-tuning DPO compares "
            "with the pretrained folder it starts from (its log-probabilities computed once by the preparation "
            "job); name one (model=pretrained model.path=DIR), or set model.peft=lora")
    check_chat_corpus(trial)


def check_reference_folder(trial: TrialConfig) -> None:
    """``objective.reference`` names a model folder that can run (as ``model.path`` is checked) with the vocabulary
    of the trial's model: its log-probabilities are of the trial's token ids."""
    assert trial.objective.reference is not None
    given = Path(trial.objective.reference).expanduser()
    if (given / "adapter_config.json").is_file() and not (given / "config.json").is_file():
        raise ValueError(f"objective.reference={trial.objective.reference} is not allowed: it holds a LoRA adapter, "
                         "not a model; export the trial merged (python -m hpcsweep.export ... --merge) and name that "
                         "folder")
    folder = read_model_folder(trial.objective.reference, "objective.reference")
    check_model_folder(folder, trust_remote_code=trial.model.trust_remote_code, random_init=False)
    vocab = read_model_folder(trial.model.path).vocab_size if trial.model.path else trial.model.vocab_size
    if folder.vocab_size != vocab:
        raise ValueError(f"{folder.key} is not allowed: its vocab_size={folder.vocab_size} differs from the trial's "
                         f"model ({vocab}); the reference scores the trial's token ids, so it needs the same "
                         "tokenizer")


def _check_lines(corpus: TextCorpus, trial: TrialConfig) -> None:
    """Every line of a corpus not yet tokenized, read here rather than by a queued job (``jsonl_checks``);
    what it holds is printed once a command."""
    summary = check_corpus_lines(corpus, trial.data.kind, trial.data.files)
    if summary:
        log.info("%s", summary)


_TRANSFORMERS_GLOBALS = frozenset({"raise_exception", "strftime_now", "namespace", "range", "dict", "lipsum",
                                   "cycler", "joiner"})
"""Names a template reads that transformers or Jinja defines, not the user."""


@functools.cache
def _template_reads(template_path: str | None, sha256: str, folder: str) -> frozenset[str]:
    """The names the chat template (``template_path``'s, else every one of ``folder``'s) reads without
    setting them; once per template (``sha256``) in this login-node command."""
    import jinja2
    import jinja2.meta

    texts = [Path(template_path).read_text(encoding="utf-8")] if template_path else chat_template_texts(folder)
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    names: set[str] = set()
    for text in texts:
        try:
            names |= jinja2.meta.find_undeclared_variables(environment.parse(text))
        except jinja2.TemplateSyntaxError:
            # A tag of transformers' own ({% generation %}): every name the text has, read or not.
            names |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    return frozenset(names)


def check_resumes(trials: Sequence[PreparedTrial], records: SweepModelRecords | None = None) -> None:
    """Refuse the sweep if any trial dir was trained with another config (``resume.force`` allows it).

    Every trial is checked, so the error says how many differ, not only the first. A model folder is
    compared as ``records`` holds it (the sweep's, read once), else as read here once for all the trials.
    """
    refused: list[str] = []
    records = SweepModelRecords() if records is None else records
    for trial in trials:
        label = f"trial #{trial.num} ({trial_label(trial.overrides)})"
        try:
            differences = resume_differences(trial.trial_dir, trial.config, records.identity)
        except ConfigMismatch as err:
            if not trial.resume.force:
                refused.append(f"{label}: {err}")
            continue
        if differences and trial.resume.force:
            log.warning("%s resumes with a different config: %s", label, differences_text(differences))
        elif differences:
            refused.append(f"{label}: {mismatch_message(trial.trial_dir, differences)}")
    if refused:
        more = f" ({len(refused) - 1} more of the {len(trials)} trials differ too)" if len(refused) > 1 else ""
        raise SweepConfigError(refused[0] + more)
