"""Counted words in the report's and the CLI's sentences, so that none reads "1 requests"."""

from __future__ import annotations


def plural(count: float, word: str, many: str | None = None, digits: int = 0) -> str:
    """`count` as shown (thousands separated, `digits` decimals) and `word` agreeing with the number shown:
    '1 request', '2 requests', '0 requests', '1.0 requests'. `many`: an irregular plural."""
    shown = f"{count:,.{digits}f}"
    return f"{shown} {word if shown == '1' else (many or word + 's')}"
