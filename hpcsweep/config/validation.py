"""The one wording of a refused config value: a ``ValueError`` naming the key, the value and what is allowed."""

from __future__ import annotations

import typing
from typing import Any


def _fail(key: str, value: Any, allowed: str) -> typing.NoReturn:
    raise ValueError(f"{key}={value!r} is not allowed: {allowed}")


def _require(condition: bool, key: str, value: Any, allowed: str) -> None:
    if not condition:
        _fail(key, value, allowed)
