"""The ``README.md`` model card of an export: what was trained, how, how well, and from what (pure text)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcsweep.container.record import container_of

METRIC_KEYS = ("status", "step", "max_steps", "train_loss", "val_loss", "best_val_loss", "tokens_per_s",
               "restarts", "weights_sha256")
"""The metrics.json fields the card lists."""


@dataclass(frozen=True)
class CardFacts:
    """Everything the card says, gathered by the writer."""

    kind: str
    """``full``, ``adapter`` or ``merged``."""
    sweep_dir: str
    trial_num: int
    trial_dir: str
    overrides: Sequence[str]
    metrics: Mapping[str, Any]
    checkpoint: str
    checkpoint_step: int
    checkpoint_val_loss: float | None
    base_model: Mapping[str, Any]
    """The identity the checkpoint records; empty for a model built from the config."""
    base_model_path: str | None
    """The base as the adapter names it (``base_model_name_or_path``: ``model.path`` as typed, or
    ``--base-name``); None for a full export."""
    model_config: Mapping[str, Any]
    """The trial's ``model.*`` keys."""
    code: Mapping[str, Any]
    """``git_commit`` of the code the trial ran, and ``git_dirty`` or (a code snapshot) ``snapshot_diff_sha256``;
    ``hpcsweep``: its version and install commit (environment.json's ``hpcsweep``); ``container``: the container
    it ran in (environment.json's ``container``, with the ``os_release`` and ``python`` seen inside), absent
    without one."""
    files: Sequence[str]
    trust_remote_code: bool = False
    """The base runs its own code (an ``auto_map``): every load passes ``trust_remote_code=True``."""
    dtype: str | None = None
    """The main dtype of the model weights written (``bfloat16``), None when only an adapter is."""
    chat: Mapping[str, Any] | None = None
    """A ``data=chat`` trial's rendering: ``chat_template`` (``data.chat_template``, None: the tokenizer's
    own), ``chat_template_kwargs`` (``data.chat_template_kwargs``), and ``prompt`` (a user turn ``{{question}}``
    rendered so) or ``prompt_missing`` (why not); None for other data."""


_WHAT = {
    "full": "the trial's model, every weight as it trained (full fine-tuning or pretraining)",
    "adapter": "a LoRA adapter (peft) over the base model named below",
    "merged": "the trial's LoRA adapter merged into its base model: one plain model",
}

_LOAD = {
    "full": "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "model = AutoModelForCausalLM.from_pretrained(\"{out}\", local_files_only=True{remote})\n"
            "tokenizer = AutoTokenizer.from_pretrained(\"{out}\", local_files_only=True{remote})",
    "merged": "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
              "model = AutoModelForCausalLM.from_pretrained(\"{out}\", local_files_only=True{remote})\n"
              "tokenizer = AutoTokenizer.from_pretrained(\"{out}\", local_files_only=True{remote})",
    "adapter": "from peft import PeftModel\n"
               "from transformers import AutoModelForCausalLM\n"
               "base = AutoModelForCausalLM.from_pretrained(\"{base}\", local_files_only=True{remote})\n"
               "model = PeftModel.from_pretrained(base, \"{out}\", local_files_only=True)",
}

_ELSEWHERE = {
    "full": "Copy this folder whole; `from_pretrained` takes its path there. Nothing else is needed.",
    "merged": "Copy this folder whole; `from_pretrained` takes its path there. Nothing else is needed.",
    "adapter": "Copy this folder, and the base model `{base}` (or download it, if that is a hub name), to the "
               "other machine, and pass the base's path there to `AutoModelForCausalLM.from_pretrained` in place "
               "of `{base}`; `PeftModel.from_pretrained` takes this folder's path there. "
               "`AutoPeftModelForCausalLM` reads the base from `base_model_name_or_path` in "
               "`adapter_config.json`: set it to the base's path (or hub name) on that machine.",
}


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def chat_section(chat: Mapping[str, Any]) -> list[str]:
    """The card's lines on how a ``data=chat`` trial's samples were rendered, so its users prompt it so."""
    template = f"the Jinja file `{chat['chat_template']}`" if chat.get("chat_template") else "the tokenizer's own chat template"
    variables = dict(chat.get("chat_template_kwargs") or {})
    switches = "".join(f", {name}={value!r}" for name, value in sorted(variables.items()))
    shown = json.dumps(variables, sort_keys=True)
    return [
        "## Prompt it as it was trained",
        "",
        f"Trained on chat samples rendered with {template}"
        + (f" and the template variables `{shown}` (`data.chat_template_kwargs`)" if variables else
           ", its variables at their defaults")
        + "; the loss began where the template's generation prompt ends. Render prompts the same way:",
        "",
        "```python",
        f"prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False{switches})",
        "```",
        "",
        *_prompt_lines(chat),
    ]


def _prompt_lines(chat: Mapping[str, Any]) -> list[str]:
    if chat.get("prompt") is not None:
        return ["A user turn `{{question}}` is then this text, which the answer follows directly "
                "(`hpcsweep.prepare.chat_render.chat_prompt`; a task's `doc_to_text`):", "", "```text", chat["prompt"],
                "```", ""]
    if chat.get("prompt_missing"):
        return [f"(A user turn's prompt could not be rendered where this was exported: {chat['prompt_missing']}.)", ""]
    return []


def _install_text(install: Mapping[str, Any] | None) -> str:
    """``0.1.0, commit `abc...` (git checkout /src/hpcsweep)``: the hpcsweep the trial ran (environment.json)."""
    if not install:
        return "unknown (the trial recorded no hpcsweep version)"
    dirty = ", with uncommitted changes" if install.get("dirty") else ""
    commit = f"commit `{install['commit']}`" if install.get("commit") else "commit unknown"
    return f"{install.get('version')}, {commit} ({install.get('source')}{dirty})"


def _container_lines(container: Mapping[str, Any] | None) -> list[str]:
    """``- container: oci image `/s/bundle` (config.json sha256 ...), Debian GNU/Linux 12 (bookworm), Python
    3.11.2``: the image the trial ran in and what ran there (environment.json); none without a container."""
    where = container_of(container)
    if where is None:
        return []
    identity = (container or {}).get("identity") or {}
    runtime, _, image = where.partition(" image ")
    said = [f"{runtime} image `{image}`"]
    if identity.get("config_json"):
        said.append(f"(config.json sha256 `{identity['config_json']['sha256']}`)")
    elif identity.get("kind") == "file":
        said.append(f"({identity.get('size')} bytes, modified {identity.get('mtime')})")
    os_name = ((container or {}).get("os_release") or {}).get("PRETTY_NAME")
    inside = [part for part in (os_name, f"Python {container['python']}" if container.get("python") else None) if part]
    return [f"- container: {' '.join(said)}" + (f", {', '.join(inside)} inside" if inside else "")]


def model_card(facts: CardFacts, out: str) -> str:
    """The card's Markdown text; ``out`` is the folder it goes into (for the loading snippet)."""
    overrides = " ".join(facts.overrides) or "(none: the defaults)"
    base = (
        "```json\n" + json.dumps(dict(facts.base_model), indent=2, sort_keys=True) + "\n```"
        if facts.base_model
        else "built from the config (the `model.*` keys below) at `trainer.seed`, not loaded from a folder"
    )
    commit = facts.code.get("git_commit") or "unknown (not run from a git checkout)"
    dirty = " (with uncommitted changes)" if facts.code.get("git_dirty") else ""
    if facts.code.get("snapshot_diff_sha256"):
        dirty = f" (the sweep's code snapshot; its uncommitted diff has sha256 {facts.code['snapshot_diff_sha256']})"
    remote = ", trust_remote_code=True" if facts.trust_remote_code else ""
    val = "" if facts.checkpoint_val_loss is None else f", validation loss {facts.checkpoint_val_loss:.6g}"
    lines = [
        f"# hpcsweep trial #{facts.trial_num}",
        "",
        f"This folder holds {_WHAT[facts.kind]}. Written by `python -m hpcsweep.export`.",
        "",
        "## Trial",
        "",
        f"- sweep: `{facts.sweep_dir}`",
        f"- trial dir: `{facts.trial_dir}`",
        f"- overrides: `{overrides}`",
        f"- checkpoint: `{facts.checkpoint}` (step {facts.checkpoint_step}{val})",
        f"- code commit: `{commit}`{dirty}",
        f"- hpcsweep: {_install_text(facts.code.get('hpcsweep'))}",
        *_container_lines(facts.code.get("container")),
        "",
        "## Metrics (metrics.json)",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {key} | {_value(facts.metrics.get(key))} |" for key in METRIC_KEYS),
        "",
        "## Base model",
        "",
        base,
        *([] if facts.base_model_path is None else ["", (
            f"The adapter names it `{facts.base_model_path}`." if facts.kind == "adapter"
            else f"Given as `{facts.base_model_path}`; the adapter is merged into it here.")]),
        *([] if facts.dtype is None else ["", f"Weights written in `{facts.dtype}` (each tensor in the base's own "
                                              "dtype unless `--dtype` said otherwise)."]),
        "",
        "## Model config (model.*)",
        "",
        "```json",
        json.dumps(dict(facts.model_config), indent=2, sort_keys=True),
        "```",
        "",
        "## Load it",
        "",
        "```python",
        _LOAD[facts.kind].format(out=out, base=facts.base_model_path, remote=remote),
        "```",
        "",
        "### On another machine",
        "",
        _ELSEWHERE[facts.kind].format(base=facts.base_model_path),
        *([] if not facts.trust_remote_code else [
            "", "The base model runs its own code (`auto_map`): pass `trust_remote_code=True` to every load."]),
        "",
        *([] if facts.chat is None else chat_section(facts.chat)),
        "## Files",
        "",
        *(f"- `{name}`" for name in facts.files),
        "",
    ]
    return "\n".join(lines)
