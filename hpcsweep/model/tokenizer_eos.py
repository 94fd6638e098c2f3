"""Whether a tokenizer folder has an EOS token, read from its files without importing transformers.

A ``data=text`` corpus becomes each document's ids followed by EOS (``hpcsweep.prepare.text_tokens``),
so a tokenizer without one cannot prepare it. ``AutoTokenizer`` takes its EOS from
``tokenizer_config.json`` or ``special_tokens_map.json`` (``eos_token``, a string or an
``AddedToken`` mapping); a tokenizer class of its own (``LlamaTokenizer``) may bring a default one,
and so may the class ``AutoTokenizer`` picks for the folder's ``config.json`` ``model_type`` when
``tokenizer_config.json`` names none. So only a generic class, which has none, is refused when no
file names an EOS: named as such, or implied by a folder that names no class and no model type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
GENERIC_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast", "PreTrainedTokenizer"})
"""``tokenizer_class`` values that bring no EOS of their own."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def eos_token_text(value: Any) -> str | None:
    """``eos_token`` as a file writes it (``"</s>"`` or ``{"content": "</s>", ...}``) -> its text; None if empty."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def missing_eos(folder: str | Path) -> str | None:
    """Why the tokenizer in ``folder`` has no EOS token (one clause), or None when it has one or may have one."""
    root = Path(folder)
    configs = {name: _read_json(root / name) for name in CONFIG_FILES}
    named = [config["eos_token"] for config in configs.values() if "eos_token" in config]
    if any(eos_token_text(value) for value in named):
        return None
    if named:
        return "its eos_token is empty (" + " and ".join(n for n, c in configs.items() if "eos_token" in c) + ")"
    tokenizer_class = configs["tokenizer_config.json"].get("tokenizer_class")
    if tokenizer_class is None and _read_json(root / "config.json").get("model_type"):
        return None  # AutoTokenizer takes the model type's class, which may bring a default EOS
    if tokenizer_class is not None and tokenizer_class not in GENERIC_CLASSES:
        return None  # the class may bring a default EOS; the preparation job checks it exactly
    return f"neither {' nor '.join(CONFIG_FILES)} names an eos_token"
