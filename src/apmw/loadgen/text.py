"""Synthetic prompt text with a controlled token count.

A prompt of ``n`` tokens is ``n`` words, each of which the server's tokenizer maps to exactly
one token when preceded by a space (SentencePiece and byte-level BPE tokenizers split at
spaces, so counts add up across words). Which words qualify is asked of the server once,
through its ``/tokenize`` endpoint (llama.cpp: ``{"content"}``, vLLM/SGLang: ``{"prompt"}``).
If the server has no tokenizer endpoint the common-word list is used as-is, assuming one token
per word, and the summary says so (``token_count_method``); the measured ``prompt_tokens`` the
server reports in ``usage`` are recorded per call either way.
"""

from __future__ import annotations

import numpy as np

# Short, frequent English words: one token in the GPT-2/Llama-3/Qwen BPE vocabularies and in
# SentencePiece Llama vocabularies when written with a leading space.
CANDIDATE_WORDS = (
    "a i be he me we no so go do to of in on it is at as an by or up us my"
    " the and for are but not you all any can had her was one our out day get has him his how man new now"
    " old see two way who boy did its let put say she too use sun run ten pen den fan van win tin bin hen"
    " ban man men can con fin gun bun hut map cup dog cat box red top hot big low end set ago far few"
    " ba bo bu da de di du fa fe fi fo fu ga ge gi gu ha hi ho hu ja je ji jo ju ka ke ki ko ku la le li lo lu"
    " ma mi mo mu na ne ni nu pa pe pi po pu ra re ri ro ru sa se si su ta te ti tu va ve vi vo vu wa wi wo"
).split()
MIN_WORDS = 8


class TextMaker:
    """Makes text of an exact token count from words known to be one token each."""

    def __init__(self, words: list[str], method: str):
        self.words = np.array(words)
        self.method = method   # "tokenizer-endpoint" or "assumed-one-token-per-word"

    def text(self, tokens: int, rng: np.random.Generator) -> str:
        if tokens <= 0:
            return ""
        return " " + " ".join(self.words[rng.integers(0, len(self.words), tokens)])


def single_token_words(counts: dict[str, int]) -> list[str]:
    """The words whose ``" word"`` tokenizes to exactly one token."""
    return [w for w, n in counts.items() if n == 1]
