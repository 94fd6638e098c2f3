"""The one way a trial's tokenizer is loaded from its folder: offline, local files only, and with the
remote code ``model.trust_remote_code`` allows.

A folder may ship its tokenizer's own code (a ``tokenizer_config.json`` ``auto_map``); without
``trust_remote_code=True`` transformers refuses to load it. Every load that reads a trial's tokenizer
folder (the token preparation, the chat rendering, the packed documents' EOS, the task scores) comes
here with the trial's setting; the argument has no default, so no new caller can leave it out.
"""

from __future__ import annotations

import os
from typing import Any


def load_folder_tokenizer(folder: str, *, trust_remote_code: bool) -> Any:
    """``AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=...)``, offline."""
    # Before transformers is first imported: huggingface_hub reads it once, at import.
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
