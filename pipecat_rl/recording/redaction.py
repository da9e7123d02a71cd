"""Caller PII removed before anything is written: phone numbers, emails, card numbers, names.

A live call is redacted by default (`recording_redactor`): the eligibility query trains only
live calls whose every turn went through the redactor, because token ids spell the same PII the
text does. Simulated and gate sessions (scripted callers, invented facts) are redacted only when
asked, so that a scenario's phone number still matches the world's records.
"""

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
# 13-19 digits, optionally grouped by spaces or dashes; kept only if the Luhn check passes.
_CARD = re.compile(r"\b\d(?:[ -]?\d){12,18}\b")
# International or North-American style numbers with at least 7 digits.
_PHONE = re.compile(
    r"(?<![\w])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?)?\d{2,4}(?:[ .-]?\d{2,4}){1,3}\b"
)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


class Redactor(BaseModel):
    """Replaces PII with placeholders such as `[PHONE]`; applied to every string of a record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: list[str] = Field(default_factory=list)
    """Names to remove wherever they appear (case-insensitive, whole words)."""
    phones: bool = True
    emails: bool = True
    cards: bool = True

    def text(self, s: str) -> str:
        """Redact one string."""
        if self.emails:
            s = _EMAIL.sub("[EMAIL]", s)
        if self.cards:
            s = _CARD.sub(
                lambda m: "[CARD]" if _luhn(re.sub(r"\D", "", m.group())) else m.group(), s
            )
        if self.phones:
            s = _PHONE.sub(
                lambda m: "[PHONE]" if len(re.sub(r"\D", "", m.group())) >= 7 else m.group(), s
            )
        for name in self.names:
            s = re.sub(rf"\b{re.escape(name)}\b", "[NAME]", s, flags=re.IGNORECASE)
        return s

    def value(self, obj: Any) -> Any:
        """Redact every string inside nested dicts and lists."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


def recording_redactor(
    source: str, *, redactor: Redactor | None = None, redact: bool = True
) -> Redactor | None:
    """The redactor a recorder of a `source` session uses: `redactor` if given, else the default.

    The default is `Redactor()` for a live call unless `redact` is False, and none for a
    simulated or gate session.
    """
    if redactor is not None:
        return redactor
    return Redactor() if redact and source == "live" else None
