"""llama.cpp's per-slot prompt cache: which slot a call takes, and how much of its prompt it finds there.

llama.cpp's server runs ``--parallel`` slots. A slot keeps the tokens of the last request it ran
after that request ends, and a new request reuses the longest common prefix of its prompt with
its slot's tokens (``cache_prompt``, on by default). Which idle slot a request takes
(``server_context::get_available_slot``, tools/server/server-context.cpp):

1. the idle slot with the highest similarity, the common prefix as a share of the new prompt,
   if it is above ``--slot-prompt-similarity`` (0.1 by default; the first slot wins a tie, the
   comparison being strict);
2. otherwise the least recently used idle slot (the last slot wins a tie, ``<=``).

So an agent's next call finds its context only if its slot is idle and still holds it. Prompts
that share only the system prompt are equally similar to every slot that holds one, so a call
whose own slot is gone takes the first such slot, which may be another waiting agent's.

The cache is keyed by context (an agent's task): two contexts share the system prompt's tokens
and nothing else; a context shares all of its slot's tokens with its own next call. A request
always computes at least its prompt's last token. The host-memory prompt cache of newer servers
(``--cache-ram``) is not modelled (:mod:`apmw.perf.serving_policy`).
"""

from __future__ import annotations

# --slot-prompt-similarity default (common_params.slot_prompt_similarity = 0.1f).
SLOT_PROMPT_SIMILARITY = 0.1


class SlotPromptCache:
    """The slots of one llama.cpp server: which context each holds, how many tokens, and when last used."""

    __slots__ = ("ctx", "tokens", "last_used", "busy", "shared", "similarity", "_clock")

    def __init__(self, slots: int, shared_tokens: int, similarity: float = SLOT_PROMPT_SIMILARITY):
        self.ctx = [-1] * slots           # context whose tokens the slot holds (-1: empty)
        self.tokens = [0] * slots
        self.last_used = [-1] * slots     # order of release; -1 never used (llama.cpp's t_last_used)
        self.busy = [False] * slots
        self.shared = shared_tokens       # the system prompt every context starts with
        self.similarity = similarity
        self._clock = 0

    def _common(self, i: int, ctx: int, prompt_tokens: int) -> int:
        held = self.tokens[i]
        common = held if self.ctx[i] == ctx else min(held, self.shared)
        return min(common, prompt_tokens)

    def choose(self, ctx: int, prompt_tokens: int) -> tuple[int, int]:
        """(slot a request for ``ctx`` with ``prompt_tokens`` prompt tokens takes, tokens it reuses there)."""
        best, best_sim = -1, 0.0
        for i in range(len(self.busy)):
            if self.busy[i] or self.tokens[i] == 0:
                continue
            sim = self._common(i, ctx, prompt_tokens) / prompt_tokens
            if sim > best_sim and sim > self.similarity:
                best, best_sim = i, sim
        if best < 0:
            oldest = None
            for i in range(len(self.busy)):
                if not self.busy[i] and (oldest is None or self.last_used[i] <= oldest):
                    best, oldest = i, self.last_used[i]
        if best < 0:
            raise RuntimeError("no idle llama.cpp slot: the engine admitted more calls than it has slots")
        return best, min(self._common(best, ctx, prompt_tokens), prompt_tokens - 1)

    def take(self, ctx: int, prompt_tokens: int) -> tuple[int, int]:
        """The request starts in the slot :meth:`choose` picks: it is busy until :meth:`release`."""
        slot, reused = self.choose(ctx, prompt_tokens)
        self.busy[slot] = True
        return slot, reused

    def release(self, slot: int, ctx: int, tokens: int) -> None:
        """The request in ``slot`` ended (or was preempted) holding ``tokens`` tokens of ``ctx``."""
        self._clock += 1
        self.busy[slot] = False
        self.ctx[slot], self.tokens[slot], self.last_used[slot] = ctx, tokens, self._clock
