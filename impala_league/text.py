"""Words for counts in the lines the project prints: `plural(1, "game")` is '1 game', `plural(200, "game")`
'200 games'. Imports nothing: every layer may use it."""

from __future__ import annotations


def plural(n: int | None, word: str, words: str | None = None) -> str:
    """`n` and `word` ('1 game'), else `words` (default `word` + 's': '0 games', '10 games'); None prints
    as '?' (a record without the count)."""
    return f"{'?' if n is None else n} {word if n == 1 else words or word + 's'}"
