"""One registry per kind of thing (collective, merge policy, algorithm, topology, importer).

The experiment file, the CLI (`simfog list`) and the docs all read the registries, so adding a thing is one
function or class and one decorator line.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Generic, TypeVar

from simfog.errors import ConfigError, one_of

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = item
            return item
        return add

    def get(self, name: object, *, field: str | None = None, source: str | None = None) -> T:
        """The item called `name`; ConfigError listing the allowed names otherwise."""
        if not isinstance(name, str) or name not in self._items:
            raise ConfigError(field or self.kind, name, one_of(name, self.names()), source=source)
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def describe(self) -> list[tuple[str, str]]:
        """(name, first line of its docstring) for every entry, sorted by name."""
        return [(n, (inspect.getdoc(self._items[n]) or "").splitlines()[0] if inspect.getdoc(self._items[n])
                 else "") for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._items
