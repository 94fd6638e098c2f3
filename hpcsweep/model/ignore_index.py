"""The target that takes no loss: the one place its value is written (``tests/unit/test_facts_once.py``)."""

from __future__ import annotations

IGNORE_INDEX = -100
"""A target that takes no loss: chat data's prompt tokens and a packed row's padding. It is
``F.cross_entropy``'s default ``ignore_index``, and what transformers' models skip in ``labels``."""
