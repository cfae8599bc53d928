"""User-facing errors.

Every error a user can trigger in apmw subclasses :class:`ApmwError`, so the CLI can
catch one type and print the message without a traceback. Messages say what is wrong,
where (file, field, name), and how to fix it.
"""

from __future__ import annotations


class ApmwError(Exception):
    """Base class for every user-facing apmw error."""


class UnknownNameError(ApmwError):
    """A GPU, model or dtype name that is not in the catalogue.

    The message lists the closest known names so a typo is easy to fix.
    """


class ConfigError(ApmwError):
    """A config file or field that cannot be used as given (bad JSON, missing field)."""


class FieldRefusal(ApmwError):
    """A setting this replica cannot take, refused where it is checked; ``field`` names the spec field that holds
    it (dotted, ``model.kv_dtype``), so a caller that read a spec file can say where it is."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field
