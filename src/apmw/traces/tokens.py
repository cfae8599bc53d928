"""Token counts for formats that carry text instead of counts.

apmw does not ship a tokenizer (the served model's tokenizer is unknown here).
Where a trace gives only text (AIPerf ``messages``/``text_input``/``turns[].text``)
the count is estimated as characters / 4 (rounded up), OpenAI's rule of thumb for English
("one token generally corresponds to ~4 characters of text",
https://help.openai.com/en/articles/4936856). The summary says when this was used.
"""

from __future__ import annotations

import math

# OpenAI help centre, "What are tokens and how to count them?" (see module docstring).
CHARS_PER_TOKEN = 4.0


def estimate_text_tokens(value: object) -> float:
    """Estimated tokens of a string, a message list or a list of strings: a whole number, as a tokenizer
    gives (a part-token of text is a token)."""
    return float(math.ceil(_chars(value) / CHARS_PER_TOKEN))


def _chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for k, v in value.items() if k in ("content", "text", "arguments", "tool_calls"))
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0
