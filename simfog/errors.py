"""The exceptions simfog raises on purpose.

Only the CLI turns them into exit codes; library callers catch `SimfogError`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


class SimfogError(Exception):
    """Base of every error simfog raises deliberately."""


class ConfigError(SimfogError, ValueError):
    """Bad input: names where (file), what (field), the value seen and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str, *, source: str | None = None):
        self.field, self.value, self.allowed, self.source = field, value, allowed, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field} = {_short_repr(value)}: {allowed}")

    def in_file(self, source: str) -> ConfigError:
        """The same error, now naming the file it came from (keeps an existing name)."""
        if self.source:
            return self
        return ConfigError(self.field, self.value, self.allowed, source=source)


def _short_repr(value: object, limit: int = 120) -> str:
    """repr(value), cut in the middle when long (a 400-digit number, a whole list) so the message stays one
    readable line; newlines are escaped by repr already."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...{text[-20:]} ({len(text)} characters)"


def did_you_mean(value: object, choices: Iterable[str], *, quote: bool = True) -> str:
    """" (did you mean 'ddp'?)" when `value` is near one of `choices` (the same but for case, - or _, else
    difflib's closest at its usual 0.6 cutoff), else "": the one phrase a typo's message gains, nothing else
    changing. `quote` False names it bare (a command-line flag: --ranks)."""
    if not isinstance(value, str) or not value:
        return ""
    choices = [c for c in choices if isinstance(c, str)]

    def plain(text: str) -> str:
        return text.lower().replace("-", "_")

    near = next((c for c in choices if plain(c) == plain(value)), None)
    if near is None:
        by_plain = {plain(c): c for c in choices}
        found = difflib.get_close_matches(plain(value), list(by_plain), n=1)
        near = by_plain[found[0]] if found else None
    if near is None or near == value:
        return ""
    return f" (did you mean {near!r}?)" if quote else f" (did you mean {near}?)"


def one_of(value: object, choices: Iterable[str]) -> str:
    """The `allowed` text of a choice: "one of a, b, c", and the nearest choice to `value` when there is one."""
    choices = list(choices)
    return f"one of {', '.join(map(str, choices))}{did_you_mean(value, map(str, choices))}"


def unknown_key(key: str, allowed: Iterable[str], what: str = "not a known key") -> str:
    """The `allowed` text of an unknown key: "not a known key (did you mean 'x'?); allowed: a, b, c"."""
    allowed = sorted(allowed)
    return f"{what}{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}"


@dataclass(frozen=True)
class Caveat:
    """A warning a prediction carries wherever it goes (a summary, every row of a table and CSV): `code` says what
    kind, in capitals ("POOR FIT", "EXTRAPOLATED"), `text` what exactly, in one short phrase. simfog.caveats gathers
    a run's; Caveat.line joins them for a table cell."""

    code: str
    text: str

    def __str__(self) -> str:
        return f"{self.code}: {self.text}"

    @staticmethod
    def line(caveats) -> str:
        """"POOR FIT: a; EXTRAPOLATED: b; c": each code once, its texts after it in order; "" for none."""
        by_code: dict[str, list[str]] = {}
        for c in caveats:
            texts = by_code.setdefault(c.code, [])
            if c.text not in texts:
                texts.append(c.text)
        return "; ".join(f"{code}: {'; '.join(texts)}" for code, texts in by_code.items())


class SimfogWarning(UserWarning):
    """Base of the warnings simfog issues on purpose: inputs that run but do not quite fit each other. The command
    line prints each as one line, "simfog: warning: ..."."""


class Infeasible(SimfogError):
    """Well-formed input asking for something impossible (e.g. rhd on 6 ranks)."""


class Handover(Exception):
    """Raised by an analytic path that finds, while running, a case it cannot make bit-exact (where SimPy's order
    of events at one instant decides); the engine then runs the event engine instead, so it never reaches a caller.
    The message says why."""
