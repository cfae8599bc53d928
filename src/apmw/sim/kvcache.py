"""The KV cache of one replica, in blocks, with an LRU prefix cache (vLLM V1's KVCacheManager).

vLLM splits the KV cache into fixed-size blocks (16 tokens by default, the
``--block-size`` default of vLLM; docs.vllm.ai "Automatic Prefix Caching" /
"design/prefix_caching"). A block is in one of three states:

* **in use**: referenced by a running sequence, or pinned for an agent in a tool
  wait (``retain``, ``ttl`` policies; this pinning is apmw's model of a
  session-retaining engine, vLLM itself only has the prefix cache);
* **cached**: freed, but its content is kept and can be hit by a later request
  with the same prefix; cached blocks are evicted least-recently-freed first;
* **free**: empty.

Only full blocks are cached (vLLM hashes full blocks only). vLLM frees a
request's blocks in reverse order, so the tail of a context is evicted before
its head; a context's cached prefix therefore shrinks from its end, which is what
:meth:`BlockPool.evict` does. Cached blocks are tracked per context (an agent's
task), not per block: a hit is the run of cached blocks at the start of the
context, which is what the hash chain of vLLM's prefix cache allows.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """Block accounting: used, cached (LRU per context) and free blocks."""

    __slots__ = ("capacity", "used", "cached", "cached_blocks", "caching", "evicted_blocks")

    def __init__(self, capacity_blocks: int, caching: bool):
        self.capacity = int(capacity_blocks)
        self.used = 0
        self.cached: OrderedDict[int, int] = OrderedDict()   # context id -> cached full blocks, LRU first
        self.cached_blocks = 0
        self.caching = caching
        self.evicted_blocks = 0

    @property
    def available(self) -> int:
        """Blocks an allocation may take: free plus evictable cached blocks."""
        return self.capacity - self.used

    @property
    def free(self) -> int:
        return self.capacity - self.used - self.cached_blocks

    def take(self, n: int) -> None:
        """Allocate ``n`` blocks, evicting LRU cached blocks when the free ones run out."""
        if n <= 0:
            return
        if n > self.capacity - self.used:
            raise RuntimeError(f"KV pool overdrawn: {n} blocks wanted, {self.available} available")
        short = n - self.free
        if short > 0:
            self.evict(short)
        self.used += n

    def evict(self, n: int) -> None:
        """Drop ``n`` cached blocks, least recently freed first, each context from its tail."""
        self.evicted_blocks += n
        self.cached_blocks -= n
        cached = self.cached
        while n > 0:
            key = next(iter(cached))
            b = cached[key]
            if b <= n:
                del cached[key]
                n -= b
            else:
                cached[key] = b - n
                n = 0

    def release(self, used_blocks: int, key: int | None = None, cached_blocks: int = 0) -> None:
        """Return ``used_blocks`` blocks; ``cached_blocks`` of them (full, leading) stay cached under ``key``."""
        self.used -= used_blocks
        if self.caching and key is not None and cached_blocks > 0:
            old = self.cached.pop(key, 0)     # a newer copy of the same context supersedes the old one
            self.cached_blocks += cached_blocks - old
            self.cached[key] = cached_blocks

    def cached_of(self, key: int) -> int:
        return self.cached.get(key, 0)

    def reclaim(self, key: int, blocks: int) -> None:
        """A hit: ``blocks`` leading cached blocks of ``key`` go back into use, the rest are dropped."""
        have = self.cached.pop(key, 0)
        self.cached_blocks -= have
        self.used += blocks

    def drop(self, key: int) -> None:
        """Forget a context's cached blocks (they become free)."""
        self.cached_blocks -= self.cached.pop(key, 0)
