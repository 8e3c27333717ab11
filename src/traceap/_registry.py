"""A registry of classes by name: the one shape behind `traceap.detectors.registry` and
`traceap.classify.registry`.

A module registers its class under a name (`Registry.register`); callers build it by name.  The
built-in names are known before their modules are imported (`builtin`: name -> the module that
registers it when imported), so an optional one ("model", "llm") is imported only when asked
for, and a missing one is a clear `TraceapError`.  Patterns have a registry of their own
(`traceap.patterns._registry`): they register instances with pieces, not classes.

Plumbing (the leading underscore): it imports only `traceap.errors`, so both stages can read it
(tests/test_architecture.py places it just above the bottom layer).  Building an instance stays
with each stage's `make_*`, which knows its constructor's options and how it crosses to worker
processes (`traceap.parallel.buildable`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import TraceapError


@dataclass(frozen=True)
class Entry:
    """A registered class, and whether its whole state comes from its constructor's options
    (nothing learnt afterwards), so it can be rebuilt from (name, options) in a worker."""

    cls: type
    built_from_options: bool = False


class Registry:
    """Classes of one kind ("detector", "classifier") by name, built-in ones first."""

    def __init__(self, kind: str, builtin: Mapping[str, str]):
        self.kind = kind
        self.builtin = builtin
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, cls: type, *, built_from_options: bool = False) -> type:
        """Register `cls` under `name`; returns it.  The same class again (a module reloaded)
        replaces it; another class under a taken name is refused."""
        old = self._entries.get(name)
        if old is not None and old.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"{self.kind} name {name!r} is registered twice "
                             f"({old.cls!r}, {cls!r})")
        self._entries[name] = Entry(cls, built_from_options)
        return cls

    def unregister(self, name: str) -> None:
        """Forget `name` (for tests that register a toy)."""
        self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """Every name: the built-in ones, then any registered later."""
        return tuple(self.builtin) + tuple(n for n in self._entries if n not in self.builtin)

    def entry(self, name: str) -> Entry:
        """The entry of `name`, importing its built-in module first if need be; a clear
        `TraceapError` for a name nobody registered or a built-in whose module is missing."""
        if name not in self._entries and name in self.builtin:
            module = self.builtin[name]
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name and module.startswith(exc.name):
                    raise TraceapError(f"the {name!r} {self.kind} is not available in this "
                                       f"installation ({module} is missing)") from None
                raise
        if name not in self._entries:
            raise TraceapError(f"unknown {self.kind} {name!r}; choose one of "
                               f"{', '.join(self.names())}")
        return self._entries[name]


__all__ = ["Entry", "Registry"]
