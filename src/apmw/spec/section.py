"""What every section of a spec is: frozen, strict about its keys, finite in its numbers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def settle(section: BaseModel, **resolved: object) -> None:
    """Write fields a validator resolved (a layout's unset sizes) into a frozen section while it is being
    validated; nothing else may change a section once validated."""
    for name, value in resolved.items():
        object.__setattr__(section, name, value)
