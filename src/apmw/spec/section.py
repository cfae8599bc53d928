"""What every section of a spec is: frozen, strict about its keys, finite in its numbers."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator


def line_for(loc: tuple, lines: dict[tuple, int]) -> int | None:
    """The line of the deepest key of ``loc`` that exists in the file."""
    keys = tuple(str(k) if not isinstance(k, int) else k for k in loc)
    for n in range(len(keys), 0, -1):
        for path in (keys[:n], keys[:n - 1] + (str(keys[n - 1]),)):    # an index, or a mapping key written 1:
            if path in lines:
                return lines[path]
    return None


class FieldError(ValueError):
    """A section's own check that one of its fields is wrong: ``field`` is that field's key path inside the
    section (``"ttl_s"``, ``"parallelism.tp"``, ``("tasks_per_hour", 3)``), so that the error names the field and
    its line in the file, not the section's (:func:`apmw.spec.load.error_location`)."""

    def __init__(self, field: str | tuple, message: str):
        super().__init__(message)
        self.field: tuple = tuple(field.split(".")) if isinstance(field, str) else tuple(field)


def named_field(err: Mapping[str, Any]) -> tuple:
    """The key path below pydantic's location that a :class:`FieldError` in the error ``err`` names (or ())."""
    raised = (err.get("ctx") or {}).get("error")
    return raised.field if isinstance(raised, FieldError) else ()


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_not_yes_or_no(cls, data: object) -> object:
        """A number field given ``true``/``false`` (YAML's yes/no), and a yes/no field given a number or text, are
        refused, not converted: 1 or 0 for a yes/no, or ``'yes'``, may not be what was meant. A number written as
        text is read as the number (PyYAML reads ``80e9`` and ``1.5e3``, numbers in YAML 1.2, as text)."""
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                value = data.get(field.alias or name)
                if isinstance(value, bool) and _numeric(field.annotation):
                    raise FieldError(name, f"{str(value).lower()} is a yes/no, not a number; write the number")
                if isinstance(value, (int, float, str)) and not isinstance(value, bool) and _yes_or_no(field.annotation):
                    raise FieldError(name, f"{value!r} is not a yes/no; write true or false")
                if isinstance(value, (list, tuple)) and _holds_numbers(field.annotation):
                    for i, item in enumerate(value):
                        if isinstance(item, bool):
                            raise FieldError((name, i), f"{str(item).lower()} is a yes/no, not a number; "
                                             "write the number")
        return data


def refuse_yes_or_no(data: object, at: tuple = ()) -> object:
    """A quantity's numbers (a distribution's mean, p95, quantile keys and values) given ``true``/``false``
    are refused, not read as 1 or 0; for ``mode="before"`` validators of models that take only numbers.
    ``at``: the key path of ``data`` inside the quantity, named in the error."""
    if isinstance(data, bool):
        raise FieldError(at, f"{str(data).lower()} is a yes/no, not a number; write the number")
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, bool):
                raise FieldError(at, f"the key {str(key).lower()} is a yes/no, not a number; write the number")
            refuse_yes_or_no(value, at + (str(key),))
    return data


def _kinds(annotation: object) -> tuple:
    return get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)


def _numeric(annotation: object) -> bool:
    """Whether a field takes a number and not a yes/no (``int``, ``float``, either or None)."""
    kinds = _kinds(annotation)
    return bool not in kinds and any(k in (int, float) for k in kinds)


def _yes_or_no(annotation: object) -> bool:
    """Whether a field takes a yes/no and nothing else (``bool``, or None)."""
    kinds = [k for k in _kinds(annotation) if k is not type(None)]
    return kinds == [bool]


def _holds_numbers(annotation: object) -> bool:
    """Whether a field takes a list or tuple of numbers (``list[float]``, or None)."""
    return any(get_origin(k) in (list, tuple) and any(_numeric(a) for a in get_args(k) if a is not Ellipsis)
               for k in _kinds(annotation))


def settle(section: BaseModel, **resolved: object) -> None:
    """Write fields a validator resolved (a layout's unset sizes) into a frozen section while it is being
    validated; nothing else may change a section once validated."""
    for name, value in resolved.items():
        object.__setattr__(section, name, value)
