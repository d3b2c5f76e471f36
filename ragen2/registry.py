"""A tiny name -> object registry, used only where users pick by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ragen2.errors import UnknownNameError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; refuses duplicates and lists valid names on a miss."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}."
                + did_you_mean(name, self._items)
            )
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
