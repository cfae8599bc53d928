"""Where one replica's KV blocks go: the shared prefix, every held context, and the pins.

The blocks themselves, and the LRU prefix cache of freed ones, are vLLM's block pool
(:class:`apmw.sim.kvcache.BlockPool`, blocks of ``BLOCK_TOKENS`` tokens). The ledger keeps
what the pool does not know:

* **The shared system prompt.** Its full blocks are held once per replica and always
  resident (some agent always uses them), so a context's own blocks are counted beyond them.
* **Pins.** Under ``retain`` and ``ttl`` a finished call's context stays in HBM while its
  agent waits for tools (apmw's model of a session-retaining engine; vLLM itself only has the
  prefix cache). A ``ttl`` pin expires from a heap of expiry times. The agent's next call takes
  the pinned context over and holds it while queued (``retained_waiting`` counts those calls).
* **Spills.** Pins are kept only while memory allows: an engine that let idle sessions block
  running or admissible calls would collapse under load, so the scheduler spills them to the
  prefix cache (where they may still hit) before it preempts or stalls.
* **Resident KV tokens.** The shared prefix plus every held context beyond it, the quantity
  whose time average is ``kv_tokens_resident_mean``.
* **Slots** (llama.cpp): with a :class:`~apmw.sim.slots.SlotPromptCache` the pool caches nothing;
  a call finds what its slot still holds, and its slot keeps its tokens when it ends.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque

import numpy as np

from apmw.sim.batch import Batch, Seq
from apmw.sim.kvcache import BlockPool
from apmw.sim.slots import SlotPromptCache

# vLLM's default KV block size in tokens (--block-size, CacheConfig.block_size = 16).
BLOCK_TOKENS = 16


def _blocks(tokens: np.ndarray) -> np.ndarray:
    """Blocks that contexts of ``tokens`` tokens fill, the shared prefix's included."""
    return -(-tokens // BLOCK_TOKENS)


class KvLedger:
    """The KV blocks of one replica: the pool, the shared prefix, the pins and the resident tokens."""

    __slots__ = ("pool", "caching", "sb", "shared", "kv_tokens", "pinned", "expiries", "retained_waiting", "_n",
                 "slots")

    def __init__(self, kv_capacity_bytes: float, kv_bytes_per_token: float, caching: bool, shared_tokens: int,
                 slots: SlotPromptCache | None = None):
        self.slots = slots
        caching = caching and slots is None      # with slots, the slots are the only prompt cache
        self.caching = caching
        kv_block_bytes = kv_bytes_per_token * BLOCK_TOKENS
        self.pool = BlockPool(int(kv_capacity_bytes // kv_block_bytes), caching)
        self.sb = shared_tokens // BLOCK_TOKENS if caching else 0    # full blocks of the shared prefix
        self.shared = self.sb * BLOCK_TOKENS
        if self.sb > self.pool.capacity:
            self.sb = 0
            self.shared = 0
        self.pool.take(self.sb)
        self.kv_tokens = self.shared      # resident KV tokens: shared prefix + every held context beyond it
        self.pinned: OrderedDict[int, tuple] = OrderedDict()   # agent -> (ctx, kv_len, own, token), oldest first
        self.expiries: list = []          # heap of (time, n, agent, token)
        self.retained_waiting = 0         # queued calls holding their pinned context
        self._n = 0

    # ---- blocks ------------------------------------------------------------------------------------------
    def blocks_for(self, tokens):
        """Blocks a context of ``tokens`` tokens holds beyond the shared prefix (an int or an array)."""
        return -(-tokens // BLOCK_TOKENS) - self.sb

    def fits(self, blocks: int) -> bool:
        """Whether the pool can supply ``blocks`` more (free or evictable from the prefix cache)."""
        return blocks <= self.pool.capacity - self.pool.used

    def take(self, blocks: int) -> None:
        self.pool.take(blocks)

    def give_back(self, blocks: int) -> None:
        """Return ``blocks`` taken for tokens whose KV is not kept (rejected draft tokens)."""
        if blocks:
            self.pool.release(blocks)

    def computed(self, tokens: int) -> None:
        """``tokens`` more tokens' KV was computed and is now held."""
        self.kv_tokens += tokens

    def reserved_blocks(self, running: Batch, share: float) -> int:
        """Blocks the running sequences will still take for ``share`` of their remaining output."""
        if not len(running):
            return 0
        ahead = (share * (running.out - running.gen)).astype(np.int64)
        return int(np.maximum(self.blocks_for(running.total + ahead) - running.own, 0).sum())

    def decode_room(self, kv: np.ndarray, k: int) -> int:
        """Most all-decode iterations, up to ``k``, whose new blocks the pool can supply, for sequences
        whose contexts are ``kv`` tokens (each grows a token an iteration)."""
        blocks_now = _blocks(kv)
        avail = self.pool.capacity - self.pool.used

        def demand(j: int) -> int:
            return int((_blocks(kv + j) - blocks_now).sum())

        if demand(k) <= avail:
            return k
        lo, hi = 0, k                  # largest k with demand(k) <= avail (demand rises with k)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if demand(mid) <= avail:
                lo = mid
            else:
                hi = mid
        return lo

    def take_decode(self, kv: np.ndarray, k: int) -> None:
        """Take the blocks that ``k`` more tokens each need, for contexts of ``kv`` tokens."""
        self.pool.take(int((_blocks(kv + k) - _blocks(kv)).sum()))

    # ---- admission -----------------------------------------------------------------------------------------
    def cached_prefix(self, seq: Seq) -> tuple[int, int]:
        """(tokens whose KV a queued call finds at admission, cached blocks of its context it reuses).

        A call that retained its context has all of it; otherwise it finds the shared prefix,
        the run of its context's cached blocks (all but its last token), or its host copy.
        """
        if seq.retained:
            return seq.kv_len, 0
        if self.slots is not None:
            return self.slots.choose(seq.ctx, seq.total)[1], 0
        kv, reuse = self.shared, 0
        if self.caching:
            limit = (seq.total - 1) // BLOCK_TOKENS - self.sb
            reuse = min(self.pool.cached_of(seq.ctx), max(limit, 0))
            kv = (self.sb + reuse) * BLOCK_TOKENS
        if seq.host_tokens > kv:
            kv = min(seq.host_tokens, seq.total - 1)
        return kv, reuse

    def hit_tokens(self, kv: int, reuse: int) -> int:
        """Prompt tokens found in the prefix cache (the shared prefix and reused blocks, or the slot's
        tokens; a host copy is no hit)."""
        if self.slots is not None:
            return kv
        return min(kv, (self.sb + reuse) * BLOCK_TOKENS) if self.caching else 0

    def admit(self, seq: Seq, kv: int, reuse: int, new: int) -> None:
        """A queued call starts to run holding ``kv`` tokens, ``reuse`` of its cached blocks and ``new`` blocks."""
        if self.slots is not None:
            seq.slot = self.slots.take(seq.ctx, seq.total)[0]
        if not seq.retained:
            if self.caching:
                self.pool.reclaim(seq.ctx, reuse)
            seq.kv_len = kv
            seq.own = reuse
            self.kv_tokens += kv - self.shared
        self.pool.take(new)
        seq.own += new
        if seq.retained:
            self.retained_waiting -= 1
        seq.retained = False

    def queued(self, seq: Seq) -> None:
        """A call joins the queue; one that took over its pinned context holds it while it waits."""
        self.retained_waiting += seq.retained

    # ---- pins and freeing ------------------------------------------------------------------------------------
    def pin(self, agent: int, seq: Seq, expire_at_s: float | None) -> None:
        """Keep a finished call's context in HBM while its agent waits for tools."""
        self._n += 1
        self.pinned[agent] = (seq.ctx, seq.kv_len, seq.own, self._n)
        if expire_at_s is not None:
            heapq.heappush(self.expiries, (expire_at_s, self._n, agent, self._n))

    def unpin_into(self, agent: int, seq: Seq) -> None:
        """The agent's next call takes over its pinned context (if still pinned)."""
        held = self.pinned.get(agent)
        if held is None:
            return
        if held[0] != seq.ctx:                 # a finished task's context: never reused
            self.unpin(agent)
            return
        del self.pinned[agent]
        seq.kv_len, seq.own = held[1], held[2]
        seq.retained = True

    def unpin(self, agent: int) -> None:
        ctx, kv_len, own, _ = self.pinned.pop(agent)
        self.free(ctx, kv_len, own)

    def next_expiry_s(self) -> float:
        return self.expiries[0][0] if self.expiries else float("inf")

    def expire(self, now: float) -> None:
        """Free the pins whose TTL has run out by ``now`` (a pin taken over or re-pinned since is not)."""
        while self.expiries and self.expiries[0][0] <= now:
            _, _, agent, token = heapq.heappop(self.expiries)
            held = self.pinned.get(agent)
            if held is not None and held[3] == token:
                self.unpin(agent)

    def release(self, seq: Seq) -> None:
        """Free a call's blocks; its full blocks stay in the prefix cache under its context (or its
        tokens in its slot)."""
        if seq.slot >= 0:
            assert self.slots is not None
            self.slots.release(seq.slot, seq.ctx, seq.kv_len)
            seq.slot = -1
        self.free(seq.ctx, seq.kv_len, seq.own)
        seq.kv_len = seq.own = 0
        if seq.retained:
            self.retained_waiting -= 1
        seq.retained = False

    def free(self, ctx: int, kv_len: int, own: int) -> None:
        if own or kv_len:
            self.pool.release(own, ctx, kv_len // BLOCK_TOKENS - self.sb)
            self.kv_tokens -= kv_len - self.shared

    # ---- spills ----------------------------------------------------------------------------------------------
    def spillable(self, waiting: deque[Seq]) -> bool:
        """Whether :meth:`spill_one` would release something."""
        return bool(self.pinned) or self.retained_waiting > (1 if waiting and waiting[0].retained else 0)

    def spill_one(self, waiting: deque[Seq]) -> bool:
        """Memory is short: release one pinned context to the prefix cache (it may still hit).

        The oldest pin of an agent in a tool wait goes first, then the queued calls' retained
        contexts from the back of the queue (not the head's).
        """
        if self.pinned:
            self.unpin(next(iter(self.pinned)))
            return True
        if self.retained_waiting <= (1 if waiting and waiting[0].retained else 0):
            return False
        for seq in reversed(list(waiting)[1:]):
            if seq.retained:
                self.release(seq)
                return True
        return False

    # ---- checks ----------------------------------------------------------------------------------------------
    def check_invariants(self, held: list[Seq], waiting: deque[Seq]) -> None:
        """Blocks and tokens add up over ``held`` (every call holding KV: running, or queued with its
        pin) and the pins (raises AssertionError)."""
        pool = self.pool
        own = sum(s.own for s in held) + sum(p[2] for p in self.pinned.values())
        assert 0 <= pool.used <= pool.capacity, (pool.used, pool.capacity)
        assert 0 <= pool.cached_blocks and pool.used + pool.cached_blocks <= pool.capacity
        assert pool.cached_blocks == sum(pool.cached.values())
        assert self.retained_waiting == sum(s.retained for s in waiting)
        assert pool.used == self.sb + own, (pool.used, self.sb, own)
        tokens = self.shared + sum(s.kv_len - self.shared for s in held if s.kv_len) + sum(
            p[1] - self.shared for p in self.pinned.values())
        assert tokens == self.kv_tokens, (tokens, self.kv_tokens)
        for s in held:
            assert s.own == self.blocks_for(s.kv_len) or (s.prefill and s.own >= self.blocks_for(s.kv_len)), \
                (s.own, s.kv_len)
