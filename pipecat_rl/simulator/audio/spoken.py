"""How the caller reads codes aloud: character by character, in the groups they are written in.

A caller reading a confirmation number ("DX-48213-77065") or a phone number says each letter
and digit ("D X 4 8 2 1 3 7 7 0 6 5"), not the cardinal numbers a TTS makes of the digits
("forty-eight thousand two hundred thirteen"), which no caller says and which an STT writes
back as "48,213". The persona's TTS speaks through `read_codes_aloud` (a Pipecat
`text_transforms` entry); the transcript keeps the line as written. Years, times and ISO dates
are left to the TTS.
"""

import re

CODE = re.compile(r"\b(?:[A-Z]{1,4}-?)?\d[\d-]{3,}\d\b")
"""Capitals, then five or more digits and dashes (or just those): a code, a long number."""
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _aloud(code: str) -> str:
    if ISO_DATE.fullmatch(code):
        return code
    prefix = re.match(r"[A-Za-z]*", code).group(0)  # type: ignore[union-attr]
    groups = [g for g in re.split(r"[- ]+", code[len(prefix) :]) if g]
    spoken = [" ".join(prefix.upper())] if prefix else []
    return " ".join(spoken + [" ".join(g) for g in groups])  # no commas: no pauses to endpoint on


async def read_codes_aloud(text: str, text_type: object = None) -> str:
    """`text` with every code or long number spelled out (Pipecat's TextTransform signature)."""
    del text_type
    return CODE.sub(lambda m: _aloud(m.group(0)), text)
