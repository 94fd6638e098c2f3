"""The files an export takes from its base folder unchanged: the tokenizer's and the remote code's.

They are copied byte for byte, never loaded and saved again: a tokenizer round trip through
``AutoTokenizer`` can rewrite ``tokenizer_config.json`` (and needs the remote code to run), and the
export should tokenize exactly as the base does. Remote code is each ``*.py`` module that an
``auto_map`` names (config.json's for the model, tokenizer_config.json's for the tokenizer).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json", "merges.txt", "vocab.txt",
    "chat_template.jinja", "chat_template.json",
)
"""The names tokenizers are saved under (``save_pretrained`` of slow and fast tokenizers)."""


def auto_map_modules(auto_map: Mapping[str, Any]) -> list[str]:
    """The ``*.py`` files an ``auto_map`` names: ``"modeling_x.Class"`` -> ``modeling_x.py`` (a value may
    be a list, as the tokenizer's ``[slow, fast]`` with a null; ``repo--module.Class`` names the module
    after ``--``)."""
    modules = set()
    for value in auto_map.values():
        for reference in value if isinstance(value, list) else [value]:
            if isinstance(reference, str) and "." in reference:
                modules.add(reference.split("--")[-1].rsplit(".", 1)[0] + ".py")
    return sorted(modules)


def _auto_map(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8")).get("auto_map")
    return value if isinstance(value, dict) else {}


def files_to_copy(folder: Path, *, model_code: bool) -> list[str]:
    """The names, in ``folder``, of its tokenizer files and of the remote code they and (``model_code``:
    for a full model, not an adapter) the model's config.json name."""
    names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    maps: Iterable[Mapping[str, Any]] = [_auto_map(folder / "tokenizer_config.json")]
    if model_code:
        maps = [*maps, _auto_map(folder / "config.json")]
    for auto_map in maps:
        names += [name for name in auto_map_modules(auto_map) if (folder / name).is_file() and name not in names]
    return names


def copy_base_files(folder: Path, target: Path, *, model_code: bool) -> list[str]:
    """Copy ``files_to_copy`` from ``folder`` into ``target`` byte for byte (replacing what
    ``save_pretrained`` wrote under the same name); return their names."""
    names = files_to_copy(folder, model_code=model_code)
    for name in names:
        shutil.copyfile(folder / name, target / name)
    return names


def needs_remote_code(folder: Path) -> bool:
    """Whether loading ``folder``'s model or tokenizer runs its own code (an ``auto_map``)."""
    return bool(_auto_map(folder / "config.json") or _auto_map(folder / "tokenizer_config.json"))
