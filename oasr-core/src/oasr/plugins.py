"""Plugin discovery and the component registries.

Plugins are found through entry points (``oasr.models``, ``oasr.features``, ``oasr.kernels``) and
managed by pluggy.  Core's own built-ins (:mod:`oasr._builtins`) go through the same hooks first.

Discovery is lazy: nothing is loaded until a registry is first consulted.  Each plugin's hook
implementations are called one at a time with a ``register`` callback bound to that plugin, so every
registration is attributed to its distribution and a plugin that raises is skipped alone, with one
warning, while everything else keeps working.

A name another distribution already holds is settled per entry, never by dropping the plugin: a
decode strategy is kept under its distribution's namespace (``"<distribution>:<name>"``, which the
engine prefers for that distribution's own models, see :func:`resolve_decoder`); any other entry is
refused alone, with a warning.  ``oasr plugins`` lists both per entry.

Environment:

``OASR_PLUGINS``
    Comma-separated allow-list of entry point names or distribution names.  Unset: load all.  Set but
    empty: load no entry-point plugin (built-ins still load).
``OASR_STRICT_PLUGINS=1``
    Raise :class:`oasr.errors.PluginLoadError` instead of warning.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import attrs
import pluggy

from oasr import hookspecs
from oasr.errors import PluginLoadError, UnknownComponentError
from oasr.imports import import_target

ENTRY_POINT_GROUPS = ("oasr.models", "oasr.features", "oasr.kernels")
CORE_DISTRIBUTION = "oasr-core"

#: registry kind -> the singular label used in listings and messages
LABELS = {"models": "model", "aliases": "alias", "extractors": "extractor", "tokenizers": "tokenizer",
          "decoders": "decoder", "kernels": "kernel"}

#: registry kind -> meta fields that hold lazily imported ``"module:attr"`` targets
TARGET_META = {"models": ("config", "converter")}

# registry kind -> hook name
HOOKS = {
    "models": "oasr_register_models",
    "aliases": "oasr_register_aliases",
    "extractors": "oasr_register_extractors",
    "tokenizers": "oasr_register_tokenizers",
    "decoders": "oasr_register_decoders",
    "kernels": "oasr_register_kernels",
}


@attrs.define
class Entry:
    """One registered component: its name, its (lazy) target and who registered it."""

    kind: str
    name: str
    target: Any
    distribution: str
    meta: dict[str, Any] = attrs.field(factory=dict)
    _loaded: Any = attrs.field(default=None, init=False, repr=False)

    def load(self) -> Any:
        """Import the target on first use and cache it."""
        if self._loaded is None:
            self._loaded = import_target(self.target)
        return self._loaded

    def load_meta(self, key: str) -> Any:
        value = self.meta.get(key)
        return None if value is None else import_target(value)

    def import_error(self) -> str | None:
        """Import the target and every target-valued meta field; the first failure as text, or None.

        Registration only records ``"module:attr"`` strings, so a plugin whose own module imports can still
        name code that does not (a typo, a missing dependency): listings call this to show it.
        """
        targets = [self.target, *(self.meta.get(key) for key in TARGET_META.get(self.kind, ()))]
        for target in targets:
            if target is None:
                continue
            try:
                import_target(target)
            except Exception as exc:  # any failure of third-party code is what the listing reports
                shown = target if isinstance(target, str) else repr(target)
                return (f"{LABELS.get(self.kind, self.kind)} {self.name!r}: {shown} failed to import: "
                        f"{type(exc).__name__}: {exc}")
        return None


@attrs.define
class PluginRecord:
    """What ``oasr plugins`` shows for one plugin."""

    name: str
    distribution: str
    version: str
    group: str
    registered: list[tuple[str, str]] = attrs.field(factory=list)
    #: entries whose name another distribution holds: (kind, name, what happened to it)
    clashes: list[tuple[str, str, str]] = attrs.field(factory=list)
    error: str | None = None


class Registry:
    """Name → :class:`Entry` for one kind of component; the owner of name collisions."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, target: Any, *, distribution: str, override: bool = False, **meta: Any) -> Entry:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        existing = self._entries.get(name)
        if existing is not None and not override and existing.distribution != distribution:
            raise ValueError(
                f"{LABELS.get(self.kind, self.kind)} {name!r} is already registered by {existing.distribution!r}; "
                f"{distribution!r} cannot register it again (pick another name)"
            )
        entry = Entry(self.kind, name, target, distribution, dict(meta))
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> Entry | None:
        """Drop ``name``; returns the entry it had (for :meth:`put` to restore)."""
        return self._entries.pop(name, None)

    def put(self, entry: Entry) -> None:
        """Reinstate an entry returned by :meth:`remove`."""
        self._entries[entry.name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def names(self) -> list[str]:
        return sorted(self._entries)

    def find(self, name: str) -> Entry | None:
        """The entry registered as ``name``, or None."""
        return self._entries.get(name)

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownComponentError(
                f"{LABELS.get(self.kind, self.kind)} {name!r} is not registered; registered: "
                f"{', '.join(self.names()) or '(none)'}{failed_plugins_hint()}",
                name=name,
            ) from None


class _PluginState:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.loaded = False
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registries = {kind: Registry(kind) for kind in HOOKS}
        self.records: list[PluginRecord] = []


_state = _PluginState()


def _allowed(ep: metadata.EntryPoint, dist_name: str) -> bool:
    raw = os.environ.get("OASR_PLUGINS")
    if raw is None:
        return True
    allowed = {item.strip() for item in raw.split(",") if item.strip()}
    return ep.name in allowed or dist_name in allowed


def _strict() -> bool:
    return os.environ.get("OASR_STRICT_PLUGINS", "").lower() in ("1", "true", "yes")


def _fail(record: PluginRecord, exc: BaseException, stage: str) -> None:
    record.error = f"{stage}: {type(exc).__name__}: {exc}"
    message = f"OASR plugin {record.name!r} from distribution {record.distribution!r} was skipped ({record.error})"
    if _strict():
        raise PluginLoadError(message, distribution=record.distribution) from exc
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _register_plugin_object(plugin: Any, record: PluginRecord) -> None:
    """Run every registration hook of one plugin with callbacks bound to its distribution.

    Registrations are staged and committed only if every hook of the plugin ran cleanly, so a plugin
    that fails half-way leaves nothing behind; a name clash is settled per entry (see the module doc).
    """
    staged: list[tuple[str, str, Any, dict[str, Any]]] = []

    def make_register(kind: str) -> Callable[..., None]:
        if kind == "extractors":
            def register(spec: Any) -> None:
                staged.append((kind, spec.kind, spec, {}))
        elif kind == "models":
            def register(name: str, *, model: str, config: str, converter: str | None = None,
                         description: str = "") -> None:
                staged.append((kind, name, model, {"config": config, "converter": converter,
                                                   "description": description}))
        elif kind == "aliases":
            def register(name: str, *, resolver: str, description: str = "", default: bool = False) -> None:
                staged.append((kind, name, resolver, {"description": description, "default": default}))
        else:
            def register(name: str, target: Any) -> None:
                staged.append((kind, name, target, {}))
        return register

    name = _state.pm.get_name(plugin) or record.name
    try:
        for kind, hook_name in HOOKS.items():
            for impl in getattr(_state.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is plugin:
                    impl.function(register=make_register(kind))
    except Exception as exc:  # a broken plugin must not take the others down
        _state.pm.unregister(plugin, name=name)
        _fail(record, exc, "registration failed")
        return
    commit = []
    for kind, entry_name, target, meta in staged:
        holder = _state.registries[kind].find(entry_name)
        if holder is not None and holder.distribution != record.distribution:
            entry_name = _settle_clash(record, kind, entry_name, holder.distribution)
            if entry_name is None:
                continue
        commit.append((kind, entry_name, target, meta))
    for kind, entry_name, target, meta in commit:
        _state.registries[kind].add(entry_name, target, distribution=record.distribution, **meta)
        record.registered.append((kind, entry_name))


def _settle_clash(record: PluginRecord, kind: str, name: str, holder: str) -> str | None:
    """The name an entry clashing with ``holder``'s is kept under, or None when it is refused."""
    label = LABELS[kind]
    if kind == "decoders":
        qualified = f"{record.distribution}:{name}"
        note = f"{label} {name!r} is taken by {holder!r}: kept as {qualified!r} for {record.distribution!r}'s models"
        record.clashes.append((kind, name, note))
        warnings.warn(f"OASR plugin {record.name!r}: {note}", RuntimeWarning, stacklevel=5)
        return qualified
    note = f"{label} {name!r} refused: already registered by {holder!r}"
    record.clashes.append((kind, name, note))
    message = f"OASR plugin {record.name!r} from distribution {record.distribution!r}: {note}"
    if _strict():
        raise PluginLoadError(message, distribution=record.distribution)
    warnings.warn(message, RuntimeWarning, stacklevel=5)
    return None


def resolve_decoder(method: str, distribution: str | None = None) -> Entry:
    """The decode strategy registered as ``method``, preferring ``distribution``'s own namespaced one."""
    decoders = registry("decoders")
    if distribution is not None and f"{distribution}:{method}" in decoders:
        return decoders.get(f"{distribution}:{method}")
    return decoders.get(method)


def _load_builtins() -> None:
    from oasr import _builtins

    record = PluginRecord("oasr-core", CORE_DISTRIBUTION, _version(CORE_DISTRIBUTION), "builtin")
    _state.pm.register(_builtins, name="oasr-core")
    _register_plugin_object(_builtins, record)
    _state.records.append(record)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _load_entry_points() -> None:
    seen: set[tuple[str, str]] = set()
    for group in ENTRY_POINT_GROUPS:
        for ep in metadata.entry_points(group=group):
            dist_name = ep.dist.name if ep.dist is not None else "unknown"
            if (ep.value, dist_name) in seen or not _allowed(ep, dist_name):
                continue
            seen.add((ep.value, dist_name))
            version = ep.dist.version if ep.dist is not None else "unknown"
            record = PluginRecord(ep.name, dist_name, version, group)
            _state.records.append(record)
            try:
                plugin = ep.load()
                _state.pm.register(plugin, name=f"{dist_name}:{ep.name}")
            except Exception as exc:
                _fail(record, exc, "import failed")
                continue
            _register_plugin_object(plugin, record)


def ensure_loaded() -> None:
    """Discover and register all plugins once (thread-safe)."""
    if _state.loaded:
        return
    with _state.lock:
        if _state.loaded:
            return
        _state.loaded = True
        try:
            _load_builtins()
            _load_entry_points()
        except BaseException:
            _state.loaded = False
            raise


def reload_plugins() -> None:
    """Forget everything and discover again (tests, and after installing a plugin at runtime)."""
    global _state
    with _state.lock:
        _state = _PluginState()
    importlib.invalidate_caches()
    ensure_loaded()


def registry(kind: str) -> Registry:
    """The registry of one component kind (``models``, ``extractors``, ``tokenizers``, ...)."""
    ensure_loaded()
    return _state.registries[kind]


def plugin_records() -> list[PluginRecord]:
    ensure_loaded()
    return list(_state.records)


def register_plugin(plugin: Any, *, name: str, distribution: str = "<runtime>") -> PluginRecord:
    """Register an in-process plugin object (module or instance with ``@hookimpl`` functions)."""
    ensure_loaded()
    record = PluginRecord(name, distribution, "runtime", "runtime")
    _state.pm.register(plugin, name=name)
    _register_plugin_object(plugin, record)
    _state.records.append(record)
    return record


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered with :func:`register_plugin` and everything it registered."""
    ensure_loaded()
    for record in [r for r in _state.records if r.name == name]:
        for kind, entry_name in record.registered:
            _state.registries[kind].remove(entry_name)
        _state.records.remove(record)
    if _state.pm.has_plugin(name):
        _state.pm.unregister(name=name)


def import_problems(record: PluginRecord) -> list[str]:
    """What each entry ``record`` registered fails to import (empty when every target imports)."""
    problems = []
    for kind, name in record.registered:
        entry = registry(kind).find(name)
        error = None if entry is None else entry.import_error()
        if error is not None:
            problems.append(error)
    return problems


def failed_plugins_hint() -> str:
    """A suffix for 'unknown X' errors listing the plugins that failed to load."""
    failed = [r for r in _state.records if r.error]
    if not failed:
        return ""
    return " (" + "; ".join(f"plugin {r.distribution!r} failed to load: {r.error}" for r in failed) + ")"
