"""Preference pairs whose chosen answer is systematically right, for tests of ``objective=dpo``.

    write_preference_file(tmp_path / "pairs" / "a.jsonl", right_and_wrong_pairs(64))
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.model_folders import WORDS


RIGHT_WORDS = tuple(dict.fromkeys(WORDS))[::2]
"""The words a chosen answer is made of: every other distinct word of ``WORDS``; a rejected answer takes the rest."""
WRONG_WORDS = tuple(w for w in dict.fromkeys(WORDS) if w not in RIGHT_WORDS)


def right_and_wrong_pairs(count: int, seed: int = 0, words: int = 4) -> list[dict[str, Any]]:
    """``count`` pairs (the same for the same seed) with a rule a tiny model learns in a few steps: the prompt is a
    few random words of ``WORDS``, the chosen answer ``words`` words of ``RIGHT_WORDS``, the rejected one ``words``
    words of ``WRONG_WORDS``. Every pair, validation's included, follows it."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
        pairs.append({"prompt": prompt, "chosen": " ".join(rng.choice(RIGHT_WORDS) for _ in range(words)),
                      "rejected": " ".join(rng.choice(WRONG_WORDS) for _ in range(words))})
    return pairs


def write_preference_file(path: Path, pairs: list[dict[str, Any]]) -> Path:
    """``pairs`` as JSON lines at ``path`` (one pair a line, TRL's standard form)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    return path
