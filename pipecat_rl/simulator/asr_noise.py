"""A text-mode stand-in for speech recognition errors: confusable digits and letters, lost words.

Seeded per episode, so a run is reproducible and the gate can pair runs by seed. It only touches
what speech recognition plausibly gets wrong: spelled digits and letters (a lone character, or a
run of them), and whole words dropped.
"""

import random
import re

from pipecat_rl.scenarios.scenario import AsrNoise

DIGIT_CONFUSIONS = {
    "0": "4", "1": "9", "2": "3", "3": "2", "4": "0",
    "5": "9", "6": "7", "7": "6", "8": "3", "9": "5",
}  # fmt: skip
"""Digits that sound alike on a phone line (five/nine, six/seven, three/two, ...)."""

LETTER_CONFUSIONS = {
    "B": "D", "D": "T", "P": "B", "T": "D", "V": "B", "M": "N", "N": "M",
    "S": "F", "F": "S", "C": "Z", "Z": "C", "G": "J", "J": "G", "A": "K", "K": "A",
}  # fmt: skip
"""Letters that sound alike when spelled (B/D/P/T/V, M/N, S/F, ...)."""

_TOKEN = re.compile(r"\S+")
_SPELLED = re.compile(r"[\d\-.,]+|([A-Z][-.]?)+")


class AsrNoiseModel:
    """Applies `AsrNoise` rates to a line of text with its own seeded random stream."""

    def __init__(self, noise: AsrNoise, seed: int):
        self._noise = noise
        self._rng = random.Random(seed)

    def _confuse(self, word: str) -> str:
        chars = list(word)
        spelled = len(word.strip(".,-")) == 1 or bool(_SPELLED.fullmatch(word))
        for i, ch in enumerate(chars):
            if ch.isdigit() and self._rng.random() < self._noise.digits:
                chars[i] = DIGIT_CONFUSIONS[ch]
            elif spelled and ch.upper() in LETTER_CONFUSIONS and ch.isalpha():
                if self._rng.random() < self._noise.letters:
                    swapped = LETTER_CONFUSIONS[ch.upper()]
                    chars[i] = swapped if ch.isupper() else swapped.lower()
        return "".join(chars)

    def __call__(self, text: str) -> str:
        """The line as a noisy recogniser would transcribe it."""
        words = []
        for word in _TOKEN.findall(text):
            if self._noise.drop_words and self._rng.random() < self._noise.drop_words:
                continue
            words.append(self._confuse(word))
        return " ".join(words)
