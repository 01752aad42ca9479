"""The validation primitives of the configuration schema: :class:`ConfigError` (one line, bounded in length) and
the per-key checks (choices, ranges, seeds) each section's ``validate`` is written in."""

from __future__ import annotations

import typing
from typing import Any

from ..choices import MAX_SEED

MAX_MESSAGE = 400  # characters of a ConfigError
MAX_VALUE = 60  # characters of a value quoted in a message


class ConfigError(ValueError):
    """A configuration problem: one line of at most ``MAX_MESSAGE`` characters naming the source and the key."""

    def __init__(self, message: str):
        line = " ".join(str(message).split())
        super().__init__(line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…")


def show_value(value: Any) -> str:
    """``repr(value)``, cut to ``MAX_VALUE`` characters."""
    text = repr(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


class Rules:
    """The checks of one section; each failure raises a :class:`ConfigError` naming ``source`` and the key."""

    def __init__(self, section: Any, source: str, prefix: str):
        self.section, self.source, self.prefix = section, source, prefix

    def fail(self, key: str, message: str) -> typing.NoReturn:
        raise ConfigError(f"{self.source}: {self.prefix}{key}: {message}")

    def choice(self, key: str, options: tuple[str, ...], what: str) -> None:
        value = getattr(self.section, key)
        if value not in options:
            self.fail(key, f"unknown {what} {show_value(value)}; expected one of {options}")

    def at_least(self, lo: int | float, *keys: str) -> None:
        for key in keys:
            if getattr(self.section, key) < lo:
                self.fail(key, f"must be ≥ {lo}")

    def within(self, key: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> None:
        v = getattr(self.section, key)
        if (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi):
            self.fail(key, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")

    def positive(self, *keys: str) -> None:
        for key in keys:
            if not getattr(self.section, key) > 0:
                self.fail(key, "must be > 0")

    def seed(self, key: str = "seed") -> None:
        if not 0 <= getattr(self.section, key) <= MAX_SEED:
            self.fail(key, f"must be in 0..{MAX_SEED}")


def top_k_of(mode: str) -> int | None:
    """k of a ``top<k>`` evaluation mode (k ≥ 1, optionally with ``+vscale``), else None."""
    mode = mode.removesuffix("+vscale")
    if mode.startswith("top") and mode[3:].isdecimal() and len(mode) < 12 and int(mode[3:]) >= 1:
        return int(mode[3:])
    return None
