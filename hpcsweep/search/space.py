"""A search space written in Hydra's sweep syntax, parsed into plain dataclasses.

``model.lr=tag(log, interval(1e-4, 3e-2))`` is a float dimension on a log scale,
``trainer.warmup_steps=choice(10, 20, 50)`` (or ``10,20,50``) a categorical one,
``range(8, 65, 8)`` an integer one with a step (a float range is a categorical of its values),
``tag(int, interval(1, 64))`` an integer interval. Any other override is fixed and passes through
unchanged. Bad dimensions raise ``ValueError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    Glob,
    IntervalSweep,
    Override,
    OverrideType,
    RangeSweep,
)
from hydra.errors import HydraException

KINDS = ("float", "int", "categorical")
TAGS = ("log", "int")
"""The tags a dimension may carry: ``log`` (sample on a log scale), ``int`` (an integer interval)."""
CategoricalValue = bool | int | float | str | None
_PREFIXES = {OverrideType.CHANGE: "", OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}


@dataclass(frozen=True)
class Dimension:
    """One searched key: a float or int interval (``low``..``high``, both inclusive) or categorical ``choices``."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: int | None = None
    log: bool = False
    choices: tuple[CategoricalValue, ...] = ()
    # "", "+" or "++": how the override adds the key (Hydra's override prefix).
    prefix: str = ""

    def ends(self) -> tuple[Any, ...]:
        """The values validation tries: both ends of an interval, every choice of a categorical."""
        return self.choices if self.kind == "categorical" else (self.low, self.high)

    def override(self, value: Any) -> str:
        """The override that sets this key to ``value``: ``model.lr=0.0003``."""
        return f"{self.prefix}{self.key}={Override._get_value_element_as_str(value)}"

    def contains(self, value: Any) -> bool:
        """True when ``value`` is one this dimension can sample."""
        if self.kind == "categorical":
            return value in self.choices
        if self.kind == "int" and (not isinstance(value, int) or (value - self.low) % (self.step or 1)):
            return False
        return self.low <= value <= self.high


@dataclass(frozen=True)
class SearchSpace:
    """The searched dimensions and the fixed overrides every trial gets."""

    dimensions: tuple[Dimension, ...]
    fixed: tuple[str, ...] = ()

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's overrides: the fixed ones, then one per dimension from ``params`` (key -> value)."""
        return [*self.fixed, *(d.override(params[d.key]) for d in self.dimensions)]

    def to_dict(self) -> dict[str, Any]:
        """The space as JSON-ready data (:func:`space_from_dict` reads it back)."""
        return {"dimensions": [asdict(d) for d in self.dimensions], "fixed": list(self.fixed)}


def space_from_dict(raw: Mapping[str, Any]) -> SearchSpace:
    """The space :meth:`SearchSpace.to_dict` wrote."""
    dims = tuple(Dimension(**{**d, "choices": tuple(d.get("choices", ()))}) for d in raw["dimensions"])
    return SearchSpace(dims, tuple(raw.get("fixed", ())))


def _tags(key: str, tags: set[str]) -> set[str]:
    unknown = sorted(tags - set(TAGS))
    if unknown:
        raise ValueError(f"{key}: tag {unknown[0]!r} is not allowed: one of {', '.join(TAGS)}")
    return tags


def _interval(key: str, low: float, high: float, tags: set[str], prefix: str) -> Dimension:
    if low > high:
        raise ValueError(f"{key}=interval({low:g}, {high:g}) is not allowed: low > high")
    if "log" in tags and low <= 0:
        raise ValueError(f"{key}=tag(log, interval({low:g}, {high:g})) is not allowed: a log scale needs low > 0")
    if "int" in tags:
        if low != int(low) or high != int(high):
            raise ValueError(f"{key}=tag(int, interval({low:g}, {high:g})) is not allowed: its ends must be whole numbers")
        return Dimension(key, "int", int(low), int(high), 1, "log" in tags, prefix=prefix)
    return Dimension(key, "float", float(low), float(high), None, "log" in tags, prefix=prefix)


def _range(key: str, sweep: RangeSweep, tags: set[str], prefix: str) -> Dimension:
    start, stop, step = sweep.start, sweep.stop, sweep.step
    values = [start + i * step for i in range(max(0, int(-(-(stop - start) // step))))] if step else []
    if not values:
        raise ValueError(f"{key}=range({start:g}, {stop:g}, {step:g}) is not allowed: it holds no value")
    if "int" in tags:
        raise ValueError(f"{key}: tag 'int' is not allowed on range(): a range of whole numbers is already one")
    if all(isinstance(v, int) for v in (start, stop, step)):
        if "log" in tags and (start <= 0 or step != 1):
            raise ValueError(f"{key}=tag(log, range(...)) is not allowed: a log scale needs start > 0 and step 1")
        return Dimension(key, "int", start, values[-1], step, "log" in tags, prefix=prefix)
    if "log" in tags:
        raise ValueError(f"{key}=tag(log, range(...)) is not allowed: a float range is a list of values; use interval()")
    return Dimension(key, "categorical", choices=tuple(values), prefix=prefix)


def _choice(key: str, sweep: ChoiceSweep, tags: set[str], prefix: str) -> Dimension:
    if tags:
        raise ValueError(f"{key}: tag {sorted(tags)[0]!r} is not allowed on choice(): only on interval() or range()")
    for value in sweep.list:
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ValueError(f"{key}: choice value {value!r} is not allowed: a number, a string, a bool or null")
    if len(set(map(repr, sweep.list))) != len(sweep.list):
        raise ValueError(f"{key}=choice({', '.join(map(str, sweep.list))}) is not allowed: a value appears twice")
    return Dimension(key, "categorical", choices=tuple(sweep.list), prefix=prefix)


def dimension_of(override: Override) -> Dimension:
    """The dimension a sweep override asks for; ``ValueError`` naming its key when it is not allowed."""
    key, value = override.key_or_group, override.value()
    prefix = _PREFIXES.get(override.type)
    if prefix is None:
        raise ValueError(f"{override.input_line}: deleting a key (~) cannot be searched")
    if isinstance(value, Glob):
        raise ValueError(f"{key}=glob(...) is not allowed in a search: use choice() of the config names")
    tags = _tags(key, set(getattr(value, "tags", set()) or set()))
    if isinstance(value, IntervalSweep):
        return _interval(key, value.start, value.end, tags, prefix)
    if isinstance(value, RangeSweep):
        return _range(key, value, tags, prefix)
    assert isinstance(value, ChoiceSweep)
    return _choice(key, value, tags, prefix)


def parse_space(arguments: Sequence[str]) -> SearchSpace:
    """The space of a search sweep's command-line overrides; ``ValueError`` naming the key on a bad one.

    At least one override must be a sweep (something to search), and a searched key appears once.
    """
    parser = OverridesParser.create()
    parsed = []
    for line in arguments:
        try:
            parsed.append(parser.parse_override(line))
        except HydraException as err:
            raise ValueError(f"{line}: {str(err).splitlines()[0]}") from None
    dims: list[Dimension] = []
    fixed: list[str] = []
    for override in parsed:
        if override.is_sweep_override():
            dims.append(dimension_of(override))
        else:
            # A plain value given twice is Hydra's business (the last one wins), as in a grid.
            fixed.append(override.input_line)
    plain = {o.key_or_group for o in parsed if not o.is_sweep_override()}
    searched = [d.key for d in dims]
    for key in searched:
        if searched.count(key) > 1 or key in plain:
            raise ValueError(f"{key} is given twice: a searched key takes one sweep and no other value")
    if not dims:
        raise ValueError("hydra/sweeper=search needs a space: at least one key=choice(...), range(...) or interval(...)")
    return SearchSpace(tuple(dims), tuple(fixed))


@dataclass(frozen=True)
class CheckTrial:
    """A trial that validation composes: one end of one dimension, the other dimensions at their first end."""

    key: str
    value: Any
    overrides: list[str] = field(default_factory=list)


def check_trials(space: SearchSpace) -> list[CheckTrial]:
    """One trial per end of every dimension (every choice of a categorical), for validation before submit."""
    base = {d.key: d.ends()[0] for d in space.dimensions}
    trials = []
    for dim in space.dimensions:
        for value in dict.fromkeys(dim.ends()):
            trials.append(CheckTrial(dim.key, value, space.overrides({**base, dim.key: value})))
    return trials
