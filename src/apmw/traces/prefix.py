"""Prefix reuse from block hashes (Mooncake ``hash_ids``: one id per 512-token block).

A request's blocks that lead its list and were already seen in an earlier
request are the prefix an infinite prefix cache would serve: the cached share
reported for Mooncake-style traces. Memory grows with the number of distinct
blocks (one Python int each), not with the file.
"""

from __future__ import annotations

from itertools import islice, takewhile

# Mooncake FAST'25 traces hash 512-token blocks (kvcache-ai/Mooncake
# FAST25-release/traces README; len(hash_ids) == ceil(input_length/512) holds
# for every row of the bundled traces, ../shared/data/README.md).
MOONCAKE_BLOCK_TOKENS = 512


class PrefixCache:
    """An infinite prefix cache over block ids, and the session-parent lookup that rides on it."""

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
        self.block_tokens = block_tokens
        self.seen: set[int] = set()
        # last full block id -> (session key, first block id, number of full blocks) of the latest
        # request whose full-block list ends there; a later request extending that list is its child
        self.ends: dict[int, tuple[object, int, int]] = {}

    def hit_tokens(self, hash_ids: list, input_tokens: float) -> float:
        """Tokens of this request's leading blocks already seen; records its blocks as seen."""
        seen = self.seen
        n = len(list(takewhile(seen.__contains__, hash_ids)))  # leading run, tested in C
        seen.update(hash_ids)
        return min(n * self.block_tokens, input_tokens)

    def parent_session(self, hash_ids: list, input_tokens: float, new_key: object) -> object:
        """The session this request continues, else ``new_key``.

        Parent: the latest earlier request whose full-block list is a prefix of this
        one's and reaches past block 0 (which every request shares: the system
        prompt). Mooncake's ids hash each block with its prefix, so equal last ids
        mean equal prefixes; the first id and the length are checked as well.
        """
        full = min(int(input_tokens // self.block_tokens), len(hash_ids))
        session = new_key
        first = hash_ids[0] if hash_ids else None
        for k in range(full - 1, 0, -1):
            end = self.ends.get(hash_ids[k])
            if end is not None and end[1] == first and end[2] == k + 1:
                session = end[0]
                break
        if full >= 2:
            self.ends[hash_ids[full - 1]] = (session, first, full)
        return session

    def observe(self, hash_ids: list, input_tokens: float, new_key: object) -> tuple[object, float]:
        """:meth:`parent_session` and :meth:`hit_tokens` in one pass (the Mooncake fast path).

        The parent's full blocks are this request's leading blocks and were all seen,
        so only the blocks after them are tested and added to the set.
        """
        block = self.block_tokens
        full = min(int(input_tokens // block), len(hash_ids))
        session, known = new_key, 0
        first = hash_ids[0] if hash_ids else None
        ends = self.ends
        for k in range(full - 1, 0, -1):
            end = ends.get(hash_ids[k])
            if end is not None and end[1] == first and end[2] == k + 1:
                session, known = end[0], k + 1
                break
        if full >= 2:
            ends[hash_ids[full - 1]] = (session, first, full)
        seen = self.seen
        n = known + len(list(takewhile(seen.__contains__, islice(hash_ids, known, None))))
        seen.update(islice(hash_ids, n, None))
        return session, min(n * block, input_tokens)

