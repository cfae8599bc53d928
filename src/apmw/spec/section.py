"""What every section of a spec is: frozen, strict about its keys, finite in its numbers."""

from __future__ import annotations

import types
from typing import Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_not_yes_or_no(cls, data: object) -> object:
        """A number field given ``true``/``false`` (YAML's yes/no) is refused, not read as 1 or 0."""
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                value = data.get(field.alias or name)
                if isinstance(value, bool) and _numeric(field.annotation):
                    raise ValueError(f"{name}: {str(value).lower()} is a yes/no, not a number; write the number")
        return data


def _numeric(annotation: object) -> bool:
    """Whether a field takes a number and not a yes/no (``int``, ``float``, either or None)."""
    kinds = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return bool not in kinds and any(k in (int, float) for k in kinds)


def settle(section: BaseModel, **resolved: object) -> None:
    """Write fields a validator resolved (a layout's unset sizes) into a frozen section while it is being
    validated; nothing else may change a section once validated."""
    for name, value in resolved.items():
        object.__setattr__(section, name, value)
