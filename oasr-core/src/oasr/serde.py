"""The one cattrs converter every OASR config and spec goes through.

``oasr_config.json``, engine configs and the server's settings are all attrs classes structured and
unstructured here, so a field added to a class is serialized without anyone writing a ``from_dict``.
Unknown keys are rejected (a typo in a config must not be silently ignored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from oasr.errors import ConfigError

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=False)
converter.register_unstructure_hook(Path, str)
converter.register_structure_hook(Path, lambda v, _: Path(v))
# Tuples serialize as JSON lists; cattrs restores them from the annotation.
converter.register_structure_hook(Any, lambda v, _: v)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown key(s) {sorted(exc.extra_fields)} for {exc.cl.__name__}"
    if isinstance(exc, ClassValidationError):
        parts = []
        for sub in exc.exceptions:
            note = getattr(sub, "__notes__", None)
            where = f" ({note[0]})" if note else ""
            parts.append(_describe(sub) + where)
        return f"{exc.cl.__name__}: " + "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"


def structure(data: Any, cls: type[T], *, what: str = "config") -> T:
    """Build ``cls`` from plain data, raising :class:`ConfigError` that names the bad field."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
        raise ConfigError(f"invalid {what}: {_describe(exc)}") from exc


def unstructure(obj: Any) -> Any:
    return converter.unstructure(obj)


def dumps(obj: Any) -> str:
    return json.dumps(unstructure(obj), indent=2, sort_keys=False) + "\n"


def loads(text: str, cls: type[T], *, what: str = "config") -> T:
    return structure(json.loads(text), cls, what=what)


def structure_options(raw: Any, cls: type[T], *, what: str) -> T:
    """An options object from a dict; an unknown key raises naming the valid ones."""
    import attrs

    if raw is None:
        return cls()
    if isinstance(raw, cls):
        return raw
    valid = [f.name for f in attrs.fields(cls)]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ConfigError(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid) or '(none)'}",
                          key=unknown[0])
    return structure(dict(raw), cls, what=what)
