"""A family of interchangeable parts by name: the built-in ones, and those a task registers
(server optimisers, accountants). One class, so every family adds, finds and refuses the
same way: a name taken twice, or a name nobody registered, is one line naming what exists."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from fedshard.errors import ConfigError

__all__ = ["Named", "Registry"]


class Named(Protocol):
    """A part with the name configs and messages call it by."""

    @property
    def name(self) -> str:
        """Its name."""
        ...


P = TypeVar("P", bound=Named)


class Registry(Mapping[str, P], Generic[P]):
    """Parts of one family by name (a read-only mapping; :meth:`register` adds one).

    ``what`` names the family in messages ("server optimiser"), ``key`` the config key that
    names a part ("training.server_optimizer.kind")."""

    def __init__(self, what: str, key: str, parts: Iterable[P] = ()) -> None:
        self.what, self.key = what, key
        self._parts: dict[str, P] = {}
        for part in parts:
            self.register(part)

    def register(self, part: P) -> None:
        """Add ``part`` (a task's own, registered before the federation runs).

        Raises
        ------
        ConfigError
            Another part of that name is already registered.
        """
        if part.name in self._parts and self._parts[part.name] is not part:
            raise ConfigError(f"a {self.what} named {part.name!r} is already registered")
        self._parts[part.name] = part

    def remove(self, name: str) -> None:
        """Forget the part named ``name`` (tests that registered one of their own)."""
        self._parts.pop(name, None)

    def get_part(self, name: str) -> P:
        """The part named ``name``.

        Raises
        ------
        ConfigError
            One line naming the parts that exist.
        """
        try:
            return self._parts[name]
        except KeyError:
            known = ", ".join(sorted(self._parts))
            raise ConfigError(f"{self.key} {name!r}: no such {self.what} ({known})") from None

    def __getitem__(self, name: str) -> P:
        return self._parts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)
