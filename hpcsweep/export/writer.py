"""Write an export folder: the weights as ``save_pretrained`` writes them, the tokenizer, the model card.

- full fine-tuning or pretraining: ``config.json``, ``model.safetensors`` (sharded with an index above
  ``max_shard_size``), ``generation_config.json``;
- LoRA: the peft adapter (``adapter_config.json``, ``adapter_model.safetensors``) whose
  ``base_model_name_or_path`` names the base. A base built from the config exists nowhere on disk, so
  it is written beside the adapter, in ``base/``, and named there;
- LoRA with ``merge``: the adapter merged into the base (``merge_and_unload``), as a full model.

An adapter's ``base_model_name_or_path`` is the base as the user named it (``model.path`` as typed,
or ``--base-name``), never the path the login node resolved it to, so the adapter means the same on
another machine. The weights of a full or merged model are written in the base's dtypes
(``hpcsweep.export.dtypes``). The tokenizer files, and the remote code an ``auto_map`` names, are
copied byte for byte from the base model's folder when the model came from one
(``hpcsweep.export.base_files``); a model built from the config has none (its token ids are the
data's own, see ``docs/user/lora-and-export.md``). Every export gets ``README.md``
(``hpcsweep.export.model_card``). The folder is written beside ``out`` under a temporary name and
renamed into place whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hpcsweep.export import dtypes as export_dtypes
from hpcsweep.export.base_files import copy_base_files, needs_remote_code
from hpcsweep.export.model_card import CardFacts, model_card
from hpcsweep.export.source import ExportRefused, ExportSource
from hpcsweep.export.weights import checkpoint_state, load_trial_model, trial_config
from hpcsweep.files.trial_files import TrialFiles

BASE_DIR = "base"
"""Where an adapter's base goes when it was built from the config rather than loaded from a folder."""
CARD_FILE = "README.md"


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """How to write an export, as the command line asks."""

    merge: bool = False
    """LoRA: the adapter merged into its base, one full model."""
    max_shard_size: str = "5GB"
    base_name: str | None = None
    """What an adapter names its base (``--base-name``); None: ``model.path`` as the trial was given it."""
    dtype: str | None = None
    """A torch dtype name for every weight (``--dtype``); None: the base's own dtypes."""


@dataclasses.dataclass(frozen=True)
class BaseFolder:
    """The folder a trial's model came from: where it is now, how the user named it, its dtypes."""

    path: Path | None
    """None for a model built from the config."""
    typed: str | None
    """``model.path`` as the trial's config.yaml holds it (as typed)."""
    tensors: dict[str, str]
    main_dtype: str
    remote_code: bool


def base_folder(identity: dict[str, Any], typed: str | None, trust_remote_code: bool) -> BaseFolder:
    """The base the checkpoint names (``identity``: the trial's record of the folder, its ``config.json``
    included, so that only the safetensors headers' dtypes are read from the folder), checked to be there still."""
    if not identity.get("path"):
        return BaseFolder(None, None, {}, "float32", False)
    path = Path(identity["path"])
    if not (path / "config.json").is_file():
        raise ExportRefused(f"the base model folder {path} that the trial trained from is gone: put it back "
                            "(an export reads the frozen base, and its tokenizer, from there)")
    tensors = export_dtypes.header_dtypes(path)
    config = identity.get("config") or json.loads((path / "config.json").read_text(encoding="utf-8"))
    remote = trust_remote_code or needs_remote_code(path)
    return BaseFolder(path, typed, tensors, export_dtypes.folder_dtype(config, tensors), remote)


def chat_facts(data: Any, base_path: Path | None, remote_code: bool) -> dict[str, Any]:
    """How a ``data=chat`` trial rendered its samples, for the card: ``data.chat_template``,
    ``data.chat_template_kwargs``, and ``prompt``, a user turn ``{{question}}`` as the trial would be asked it
    (``chat_prompt``), or ``prompt_missing`` saying why it cannot be rendered here."""
    from hpcsweep.prepare.chat_render import chat_prompt
    from hpcsweep.prepare.text_documents import CorpusError

    facts: dict[str, Any] = {"chat_template": data.chat_template, "chat_template_kwargs": data.chat_template_kwargs}
    folder = data.tokenizer or (None if base_path is None else str(base_path))
    if folder is None:
        facts["prompt_missing"] = "no tokenizer folder is recorded"
        return facts
    try:
        facts["prompt"] = chat_prompt(folder, "{{question}}", chat_template=data.chat_template,
                                      chat_template_kwargs=data.chat_template_kwargs, trust_remote_code=remote_code)
    except (OSError, CorpusError) as err:
        # Where the export runs, the tokenizer or template file the trial named may not be (a relative path).
        facts["prompt_missing"] = str(err)
    return facts


def export_trial(source: ExportSource, sweep_dir: Path, out: Path, options: ExportOptions) -> list[str]:
    """Write ``source``'s checkpoint to ``out`` (absent or empty); return the names of the files written."""
    cfg = trial_config(source.trial.trial_dir)
    if options.merge and cfg.model.peft != "lora":
        raise ExportRefused(f"--merge is for a LoRA trial (model.peft=lora); trial #{source.trial.num} trained "
                            f"every weight (model.peft={cfg.model.peft}): export it without --merge")
    state = checkpoint_state(source.checkpoint)
    identity: dict[str, Any] = dict(state.get("base_model") or {})
    base = base_folder(identity, cfg.model.path, cfg.model.trust_remote_code)
    # The folder as the checkpoint found it, wherever this command runs from (model.path may be relative).
    load_cfg = cfg if base.path is None else dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, path=str(base.path), trust_remote_code=base.remote_code))
    net = load_trial_model(load_cfg, source.checkpoint)
    resolved = out.resolve()
    temp = resolved.parent / f".{resolved.name}.tmp-{os.getpid()}"
    temp.mkdir(parents=True)
    try:
        kind, base_name, dtype = _write_weights(net, cfg.model.peft, temp, out, base, options)
        if base.path is not None:
            copy_base_files(base.path, temp, model_code=kind != "adapter")
        files = sorted(str(p.relative_to(temp)) for p in temp.rglob("*") if p.is_file() and p.name != CARD_FILE)
        facts = CardFacts(
            kind=kind, sweep_dir=str(sweep_dir), trial_num=source.trial.num, trial_dir=str(source.trial.trial_dir),
            overrides=source.trial.overrides, metrics=source.metrics, checkpoint=source.checkpoint.name,
            checkpoint_step=state["step"], checkpoint_val_loss=state.get("val_loss"), base_model=identity,
            base_model_path=base_name, model_config=dataclasses.asdict(cfg.model),
            code=_code_version(source.trial.trial_dir), files=[*files, CARD_FILE],
            trust_remote_code=base.remote_code, dtype=dtype,
            chat=None if cfg.data.kind != "chat" else chat_facts(cfg.data, base.path, base.remote_code),
        )
        (temp / CARD_FILE).write_text(model_card(facts, str(out)))
        if resolved.exists():
            resolved.rmdir()  # empty, as the CLI checked
        os.replace(temp, resolved)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return facts.files


def _save_model(model: Any, base: BaseFolder, override: str | None, folder: Path, max_shard_size: str) -> str:
    """Save a plain transformers model in the base's dtypes (or ``override``); return its main dtype."""
    main = override or base.main_dtype
    names = [name for name, _ in [*model.named_parameters(), *model.named_buffers()]]
    keep = export_dtypes.keep_fp32_modules(type(model))
    export_dtypes.cast_model(model, export_dtypes.export_dtypes(names, base.tensors, main, override, keep))
    import torch

    model.config.dtype = getattr(torch, main)
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    # transformers 5 writes ``dtype``; before 4.56 (and tools that read config.json themselves) it was
    # ``torch_dtype``. Both, so that every reader loads the weights in the dtype they were written in.
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if base.remote_code and base.path is not None:
        # The base's own config.json: its code reads it as published (rope_scaling null, ...), not as
        # transformers 5 holds it after the trainer made it fit that code (hpcsweep.train.remote_code).
        config = {**json.loads((base.path / "config.json").read_text(encoding="utf-8")), "dtype": main}
    config_file.write_text(json.dumps({**config, "torch_dtype": main}, indent=2, sort_keys=True) + "\n",
                           encoding="utf-8")
    return main


def _write_weights(
    net: Any, peft: str, temp: Path, out: Path, base: BaseFolder, options: ExportOptions
) -> tuple[str, str | None, str | None]:
    """Save the weights into ``temp``; ``(kind, the base as the adapter names it, dtype of the model written)``."""
    if peft != "lora":
        return "full", None, _save_model(net, base, options.dtype, temp, options.max_shard_size)
    if options.merge:
        dtype = _save_model(net.merge_and_unload(), base, options.dtype, temp, options.max_shard_size)
        return "merged", options.base_name or base.typed, dtype
    if options.dtype is not None and base.path is not None:
        raise ExportRefused("--dtype is for a model's weights: a full or merged export, or a built-in base written "
                            "beside its adapter; this adapter is written as it trained (add --merge for a model)")
    # A built-in base exists nowhere else: it goes beside the adapter, named as the user named --out.
    name = options.base_name or base.typed or str(out / BASE_DIR)
    net.peft_config["default"].base_model_name_or_path = name
    # No embedding layer trains (peft would look for the base's config to check that, before base/ is written).
    net.save_pretrained(temp, save_embedding_layers=False)
    dtype = None
    if base.path is None:
        dtype = _save_model(net.unload(), base, options.dtype, temp / BASE_DIR, options.max_shard_size)
    return "adapter", name, dtype


def _code_version(trial_dir: Path) -> dict[str, Any]:
    path = TrialFiles(trial_dir).environment
    if not path.exists():
        return {}
    environment = json.loads(path.read_text())
    snapshot = environment.get("code_snapshot") or {}
    # The hpcsweep the trial ran, version and install commit, wherever it ran from (hpcsweep.trial.install).
    install = {"hpcsweep": environment["hpcsweep"]} if environment.get("hpcsweep") else {}
    # The container it ran in (hpcsweep.container.record), and what ran there.
    if environment.get("container"):
        install["container"] = {**environment["container"], "os_release": environment.get("os_release"),
                                "python": environment.get("python")}
    if environment.get("git_commit") is None and snapshot.get("commit"):
        # A Slurm trial runs the sweep's code snapshot: its commit, and the hash of the diff on top of it.
        return {"git_commit": snapshot["commit"], "snapshot_diff_sha256": snapshot.get("diff_sha256"), **install}
    return {**{key: environment.get(key) for key in ("git_commit", "git_dirty")}, **install}
