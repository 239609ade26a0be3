"""Tiny name -> function registries with errors that list the valid names."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class UnknownComponentError(KeyError, ValueError):
    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, *names: str):
        def deco(fn: F) -> F:
            for n in names:
                self._fns[n] = fn
            return fn
        return deco

    def get(self, name: str) -> F:
        try:
            return self._fns[name]
        except KeyError:
            raise UnknownComponentError(
                f"unknown {self.kind} '{name}'; valid: {', '.join(sorted(self._fns))}") from None

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: str) -> bool:
        return name in self._fns
