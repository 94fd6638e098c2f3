"""Write an export folder: the weights as ``save_pretrained`` writes them, the tokenizer, the model card.

- full fine-tuning or pretraining: ``config.json``, ``model.safetensors`` (sharded with an index above
  ``max_shard_size``), ``generation_config.json``;
- LoRA: the peft adapter (``adapter_config.json``, ``adapter_model.safetensors``) whose
  ``base_model_name_or_path`` names the base. A base built from the config exists nowhere on disk, so
  it is written beside the adapter, in ``base/``, and named there;
- LoRA with ``merge``: the adapter merged into the base (``merge_and_unload``), as a full model.

The tokenizer files are copied from the base model's folder when the model came from one; a model
built from the config has none (its token ids are the data's own, see ``docs/user/lora-and-export.md``).
Every export gets ``README.md`` (``hpcsweep.export.model_card``). The folder is written beside ``out``
under a temporary name and renamed into place whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hpcsweep.export.model_card import CardFacts, model_card
from hpcsweep.export.source import ExportRefused, ExportSource
from hpcsweep.export.weights import checkpoint_state, load_trial_model, trial_config
from hpcsweep.files.trial_files import TrialFiles

BASE_DIR = "base"
"""Where an adapter's base goes when it was built from the config rather than loaded from a folder."""
CARD_FILE = "README.md"


def export_trial(source: ExportSource, sweep_dir: Path, out: Path, *, merge: bool, max_shard_size: str) -> list[str]:
    """Write ``source``'s checkpoint to ``out`` (absent or empty); return the names of the files written."""
    cfg = trial_config(source.trial.trial_dir)
    if merge and cfg.model.peft != "lora":
        raise ExportRefused(f"--merge is for a LoRA trial (model.peft=lora); trial #{source.trial.num} trained "
                            f"every weight (model.peft={cfg.model.peft}): export it without --merge")
    state = checkpoint_state(source.checkpoint)
    identity: dict[str, Any] = dict(state.get("base_model") or {})
    net = load_trial_model(cfg, source.checkpoint)
    out = out.resolve()
    temp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    temp.mkdir(parents=True)
    try:
        kind, base_path = _write_weights(net, cfg.model.peft, merge, temp, out, identity, max_shard_size)
        if identity.get("path"):
            _copy_tokenizer(Path(identity["path"]), temp)
        files = sorted(str(p.relative_to(temp)) for p in temp.rglob("*") if p.is_file() and p.name != CARD_FILE)
        facts = CardFacts(
            kind=kind, sweep_dir=str(sweep_dir), trial_num=source.trial.num, trial_dir=str(source.trial.trial_dir),
            overrides=source.trial.overrides, metrics=source.metrics, checkpoint=source.checkpoint.name,
            checkpoint_step=state["step"], checkpoint_val_loss=state.get("val_loss"), base_model=identity,
            base_model_path=base_path, model_config=dataclasses.asdict(cfg.model),
            code=_code_version(source.trial.trial_dir), files=[*files, CARD_FILE],
        )
        (temp / CARD_FILE).write_text(model_card(facts, str(out)))
        if out.exists():
            out.rmdir()  # empty, as the CLI checked
        os.replace(temp, out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return facts.files


def _write_weights(
    net: Any, peft: str, merge: bool, temp: Path, out: Path, identity: dict[str, Any], max_shard_size: str
) -> tuple[str, str | None]:
    """Save the weights into ``temp``; ``(kind, base model path)`` for the card."""
    if peft != "lora":
        net.save_pretrained(temp, max_shard_size=max_shard_size)
        return "full", None
    if merge:
        net.merge_and_unload().save_pretrained(temp, max_shard_size=max_shard_size)
        return "merged", identity.get("path")
    base_path = identity.get("path") or str(out / BASE_DIR)
    net.peft_config["default"].base_model_name_or_path = base_path
    # No embedding layer trains (peft would look for the base's config to check that, before base/ is written).
    net.save_pretrained(temp, save_embedding_layers=False)
    if not identity.get("path"):
        net.unload().save_pretrained(temp / BASE_DIR, max_shard_size=max_shard_size)
    return "adapter", base_path


def _copy_tokenizer(folder: Path, temp: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(folder, local_files_only=True).save_pretrained(temp)


def _code_version(trial_dir: Path) -> dict[str, Any]:
    path = TrialFiles(trial_dir).environment
    if not path.exists():
        return {}
    environment = json.loads(path.read_text())
    snapshot = environment.get("code_snapshot") or {}
    if environment.get("git_commit") is None and snapshot.get("commit"):
        # A Slurm trial runs the sweep's code snapshot: its commit, and the hash of the diff on top of it.
        return {"git_commit": snapshot["commit"], "snapshot_diff_sha256": snapshot.get("diff_sha256")}
    return {key: environment.get(key) for key in ("git_commit", "git_dirty")}
