"""The exceptions simfog raises on purpose.

Only the CLI turns them into exit codes; library callers catch `SimfogError`.
"""

from __future__ import annotations


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


class SimfogWarning(UserWarning):
    """Base of the warnings simfog issues on purpose: inputs that run but do not quite fit each other. The command
    line prints each as one line, "simfog: warning: ..."."""


class Infeasible(SimfogError):
    """Well-formed input asking for something impossible (e.g. rhd on 6 ranks)."""


class Handover(Exception):
    """Raised by an analytic path that finds, while running, a case it cannot make bit-exact (where SimPy's order
    of events at one instant decides); the engine then runs the event engine instead, so it never reaches a caller.
    The message says why."""
