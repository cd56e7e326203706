"""What every kind's config section shares (torch-free): reading one from config.json."""
from __future__ import annotations

from typing import Any, ClassVar, Dict, Optional, TypeVar

from ..errors import UsageError

S = TypeVar("S")


def section_from_json(cls: type[S], value: Any, name: str) -> S:
    """An instance of the frozen dataclass ``cls``, or config.json's object of one under
    ``name`` (unknown keys refused)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise UsageError(f"{name} must be a JSON object, got {value!r}")
    unknown = set(value) - set(cls.__dataclass_fields__)
    if unknown:
        raise UsageError(f"{name} has unknown fields: {', '.join(sorted(unknown))}")
    return cls(**value)


class ConfigOnlySection:
    """A section read from config.json only (no CLI options of its own): mixed into a frozen
    dataclass, whose ``json_name`` is its key in config.json (MHAConfig's field)."""

    json_name: ClassVar[str]

    @classmethod
    def cli_options(cls) -> Dict[str, str]:
        return {}

    @classmethod
    def from_options(cls, kw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        return None

    @classmethod
    def from_value(cls, value: Any) -> Any:
        """An instance, or config.json's object of one (unknown keys refused)."""
        return section_from_json(cls, value, cls.json_name)
