"""One replica as a continuous-batching engine, iteration by iteration (vLLM V1's scheduler).

Each iteration (docs.vllm.ai, "Optimization and Tuning: chunked prefill"; vLLM V1
``Scheduler.schedule``):

1. **Running sequences first**, in admission order. Each asks for the tokens it
   still has to compute (a decode asks for 1, a prefill for the rest of its prompt)
   capped by what is left of the token budget ``max_batched_tokens`` (chunked
   prefill). Its KV blocks are allocated for those tokens; when the pool cannot
   supply them, the most recently admitted running sequence is **preempted**
   (recompute: its blocks are freed, with their full blocks left in the prefix
   cache, and it goes back to the front of the waiting queue), until the
   allocation fits or the sequence itself was preempted.
2. **Then waiting sequences**, first come first served, if nothing was preempted,
   while budget is left and fewer than ``max_batch`` sequences run. A sequence
   first reuses its cached prefix (the shared system prompt, its own history if it
   survived in the LRU prefix cache, its pinned context under ``retain``/``ttl``,
   or its host copy under ``offload``) and is admitted only if the blocks for its
   first chunk are available; otherwise the queue waits (head-of-line, as vLLM).
3. The iteration's time is the shared step-time model
   (:meth:`apmw.perf.StepModel.iteration_time_s`, the same function ``apmw plan``
   uses) for its decode sequences, prefill tokens, KV bytes read and attention FLOPs.

**Fast path.** Between scheduling events the batch is fixed: every running
sequence decodes one token per iteration, so its context, and hence the KV bytes
and attention FLOPs of iteration ``j``, grow linearly in ``j``. When every running
sequence is decoding and nobody can be admitted, :meth:`Engine._fast_forward`
finds how many iterations ``k`` pass before the next event (a sequence finishes,
the KV pool would run out, an arrival that could be admitted, a TTL expiry, a
measurement boundary), computes all ``k`` iteration times in one numpy call and
applies them at once. The result equals the plain loop (``fast=False``) up to
floating-point rounding; ``tests/sim/test_fast_path.py`` checks it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from apmw.perf import IterationLoad, Replica
from apmw.sim.kvcache import BlockPool
from apmw.spec import Serving

# vLLM's default KV block size in tokens (--block-size, CacheConfig.block_size = 16).
BLOCK_TOKENS = 16
# Longest fast-forward in one numpy call (bounds the arrays' size; a segment simply resumes).
MAX_SEGMENT_ITERATIONS = 1 << 16


class Seq:
    """One model call inside the engine."""

    __slots__ = ("agent", "ctx", "total", "kv_len", "own", "generated", "out", "prefill", "ready_s", "first_s",
                 "host_tokens", "retained")

    def __init__(self, agent: int, ctx: int, prompt: int, out: int, ready_s: float, host_tokens: int = 0):
        self.agent = agent
        self.ctx = ctx                 # prefix-cache key: the agent's task context
        self.total = prompt            # tokens known (prompt + generated); KV is needed for all but the last
        self.kv_len = 0                # tokens whose KV is computed and held
        self.own = 0                   # blocks held beyond the shared system-prompt blocks
        self.generated = 0
        self.out = out
        self.prefill = True            # in a prefill (first or after preemption), not yet generating
        self.ready_s = ready_s
        self.first_s = -1.0
        self.host_tokens = host_tokens  # history reloadable from host memory (offload)
        self.retained = False          # holds pinned blocks while queued (retain/ttl)


@dataclass
class Stats:
    """Counters and time integrals over the measurement window."""

    iterations: int = 0
    busy_s: float = 0.0
    decode_batch_s: float = 0.0      # integral of decoding sequences over time
    running_batch_s: float = 0.0
    kv_tokens_s: float = 0.0         # integral of resident KV tokens over time
    prefill_tokens: int = 0          # over the whole run
    decode_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    lookup_tokens: int = 0           # prompt tokens looked up in the prefix cache at admission
    hit_tokens: int = 0              # ... of which found cached
    spills: int = 0                  # pinned contexts released to break a memory deadlock
    rejected_calls: int = 0          # calls whose context cannot fit in the whole KV pool
    max_blocks_used: int = 0
    samples: list = field(default_factory=list)   # (t_s, decode_batch, kv_tokens)


class Engine:
    """The scheduler, KV pool and clock of one replica; a driver feeds it calls."""

    def __init__(self, replica: Replica, serving: Serving, shared_tokens: int, driver, *, fast: bool = True,
                 window: tuple[float, float] = (0.0, float("inf")), sample_dt_s: float = float("inf"),
                 check: bool = False):
        step = replica.step
        self.step = step
        self.arch = step.arch
        self.kv_dtype = step.kv_dtype
        self.max_batch = serving.max_batch
        self.max_tokens = serving.max_batched_tokens
        self.caching = serving.prefix_caching
        kv_block_bytes = step.kv_bytes_per_token * BLOCK_TOKENS
        self.pool = BlockPool(int(replica.kv_capacity_bytes // kv_block_bytes), self.caching)
        # Full blocks of the shared system prompt: held once, always resident (hot: some agent uses them always).
        self.sb = shared_tokens // BLOCK_TOKENS if self.caching else 0
        self.shared = self.sb * BLOCK_TOKENS
        if self.sb > self.pool.capacity:
            self.sb = 0
            self.shared = 0
        self.pool.take(self.sb)
        self.kv_tokens = self.shared      # resident KV tokens: shared prefix + every held context beyond it
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        self.arrivals: list = []          # heap of (time, n, seq)
        self.expiries: list = []          # heap of (time, n, agent, token)
        self.pinned: OrderedDict[int, tuple] = OrderedDict()   # agent -> (ctx, kv_len, own), oldest pin first
        self._n = 0
        self.now = 0.0
        self.driver = driver
        self.fast = fast
        self.check = check
        self.window = window
        self.sample_dt_s = sample_dt_s
        self._next_sample = window[0]
        self.stats = Stats()
        # contexts below this many tokens make KV bytes / attention FLOPs non-linear (sliding window, top-k)
        self.linear_from = max(self.arch.sliding_window or 0, self.arch.attention_topk or 0)
        self._boundaries = sorted(b for b in window if np.isfinite(b))

    # ---- what drivers call -------------------------------------------------------------------------------
    def submit(self, seq: Seq, at_s: float) -> None:
        self._n += 1
        heapq.heappush(self.arrivals, (at_s, self._n, seq))

    def pin(self, agent: int, seq: Seq, expire_at_s: float | None) -> None:
        """Keep a finished call's context in HBM while its agent waits for tools."""
        self._n += 1
        self.pinned[agent] = (seq.ctx, seq.kv_len, seq.own, self._n)
        if expire_at_s is not None:
            heapq.heappush(self.expiries, (expire_at_s, self._n, agent, self._n))

    def unpin_into(self, agent: int, seq: Seq) -> None:
        """The agent's next call takes over its pinned context (if still pinned)."""
        held = self.pinned.pop(agent, None)
        if held is not None:
            seq.kv_len, seq.own = held[1], held[2]
            seq.retained = True

    def release(self, seq: Seq) -> None:
        """Free a call's blocks; its full blocks stay in the prefix cache under its context."""
        self._free(seq.ctx, seq.kv_len, seq.own)
        seq.kv_len = seq.own = 0
        seq.retained = False

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_TOKENS) - self.sb

    # ---- internals ------------------------------------------------------------------------------------
    def _free(self, ctx: int, kv_len: int, own: int) -> None:
        if own or kv_len:
            self.pool.release(own, ctx, kv_len // BLOCK_TOKENS - self.sb)
            self.kv_tokens -= kv_len - self.shared

    def _unpin(self, agent: int) -> None:
        ctx, kv_len, own, _ = self.pinned.pop(agent)
        self._free(ctx, kv_len, own)

    def _process_events(self) -> None:
        now = self.now
        while self.expiries and self.expiries[0][0] <= now:
            _, _, agent, token = heapq.heappop(self.expiries)
            held = self.pinned.get(agent)
            if held is not None and held[3] == token:
                self._unpin(agent)
        while self.arrivals and self.arrivals[0][0] <= now:
            seq = heapq.heappop(self.arrivals)[2]
            self.driver.on_arrival(seq)
            self.waiting.append(seq)

    def _admission(self, seq: Seq, budget: int):
        """(kv_len after the hit, cached blocks reused, new blocks, tokens this iteration), or None."""
        if seq.retained:
            kv, reuse = seq.kv_len, 0
        else:
            kv, reuse = self.shared, 0
            if self.caching:
                limit = (seq.total - 1) // BLOCK_TOKENS - self.sb
                reuse = min(self.pool.cached_of(seq.ctx), max(limit, 0))
                kv = (self.sb + reuse) * BLOCK_TOKENS
            if seq.host_tokens > kv:
                kv = min(seq.host_tokens, seq.total - 1)
        n = min(seq.total - kv, budget)
        new = self.blocks_for(kv + n) - (seq.own if seq.retained else reuse)
        if new > self.pool.capacity - self.pool.used - reuse:
            return None
        return kv, reuse, new, n

    def _admit(self, seq: Seq, plan) -> int:
        kv, reuse, new, n = plan
        st = self.stats
        if not seq.retained:
            st.lookup_tokens += seq.total
            st.hit_tokens += min(kv, (self.sb + reuse) * BLOCK_TOKENS) if self.caching else 0
            if self.caching:
                self.pool.reclaim(seq.ctx, reuse)
            seq.kv_len = kv
            seq.own = reuse
            self.kv_tokens += kv - self.shared
        self.pool.take(new)
        seq.own += new
        seq.retained = False
        return n

    def _preempt(self, seq: Seq) -> None:
        self.release(seq)
        seq.prefill = True
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def _in_window(self) -> bool:
        return self.window[0] <= self.now < self.window[1]

    def _account(self, t: float, decode: int, running: int, kv_tokens_s: float) -> None:
        st = self.stats
        st.iterations += 1
        if self._in_window():
            st.busy_s += t
            st.decode_batch_s += decode * t
            st.running_batch_s += running * t
            st.kv_tokens_s += kv_tokens_s
        if self.pool.used > st.max_blocks_used:
            st.max_blocks_used = self.pool.used

    def _sample(self) -> None:
        if self.now >= self._next_sample and self.now < self.window[1]:
            decode = sum(1 for s in self.running if not s.prefill)
            self.stats.samples.append((self.now, decode, self.kv_tokens))
            self._next_sample = self.now + self.sample_dt_s

    def _loads(self, kv: np.ndarray, n: np.ndarray, prefill: np.ndarray):
        arch = self.arch
        kv_bytes = float(np.sum(arch.kv_bytes_for_context(kv, self.kv_dtype)))
        attn = float(np.sum(n * arch.attention_flops_per_token(kv + np.where(prefill, n / 2.0, 0.0))))
        return kv_bytes, attn

    def step_once(self) -> bool:
        """One iteration by the rules above; False when nothing could be scheduled."""
        pool, running = self.pool, self.running
        budget = self.max_tokens
        sched: list[tuple[Seq, int]] = []
        preempted = False
        i = 0
        while i < len(running):
            seq = running[i]
            n = min(seq.total - seq.kv_len, budget)
            if n <= 0:
                break
            need = self.blocks_for(seq.kv_len + n) - seq.own
            while need > pool.capacity - pool.used:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                pool.take(need)
                seq.own += need
                sched.append((seq, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:
            while self.waiting and budget > 0 and len(running) < self.max_batch:
                plan = self._admission(self.waiting[0], budget)
                if plan is None:
                    break
                seq = self.waiting.popleft()
                n = self._admit(seq, plan)
                running.append(seq)
                sched.append((seq, n))
                budget -= n
        if not sched:
            return False
        self._sample()
        kv = np.fromiter((s.kv_len for s, _ in sched), float, len(sched))
        n_arr = np.fromiter((n for _, n in sched), float, len(sched))
        pre = np.fromiter((s.prefill for s, _ in sched), bool, len(sched))
        kv_bytes, attn = self._loads(kv, n_arr, pre)
        decode = int(len(sched) - pre.sum())
        prefill_tokens = int(n_arr[pre].sum())
        t = float(self.step.iteration_time_s(IterationLoad(decode, prefill_tokens, kv_bytes, attn)))
        self._account(t, decode, len(sched), t * self.kv_tokens)
        self.now += t
        st = self.stats
        st.prefill_tokens += prefill_tokens
        st.decode_tokens += decode
        done = []
        for seq, n in sched:
            seq.kv_len += n
            self.kv_tokens += n
            if seq.kv_len == seq.total:
                seq.generated += 1
                seq.total += 1
                st.generated_tokens += 1
                if seq.prefill:
                    seq.prefill = False
                    if seq.first_s < 0:
                        seq.first_s = self.now
                if seq.generated == seq.out:
                    done.append(seq)
        self._finish(done)
        return True

    def _finish(self, done: list[Seq]) -> None:
        if not done:
            return
        gone = set(map(id, done))
        self.running = [s for s in self.running if id(s) not in gone]
        for seq in done:
            self.driver.on_done(seq, self.now)

    def _stop_time(self) -> float:
        """The earliest time at which the plain loop would do something other than decode."""
        t = self.driver.stop_time_s
        if self.expiries:
            t = min(t, self.expiries[0][0])
        if self.arrivals and not self.waiting and len(self.running) < self.max_batch:
            t = min(t, self.arrivals[0][0])
        for b in self._boundaries:
            if b > self.now:
                t = min(t, b)
                break
        if self.now < self._next_sample:
            t = min(t, self._next_sample)
        return t

    def _fast_forward(self) -> bool:
        """Advance many all-decode iterations in one step; False when the plain step must run."""
        running = self.running
        b = len(running)
        if b == 0 or b > self.max_tokens or any(s.prefill for s in running):
            return False
        budget = self.max_tokens - b
        if self.waiting and b < self.max_batch and budget > 0 and self._admission(self.waiting[0], budget):
            return False
        kv = np.fromiter((s.kv_len for s in running), np.int64, b)
        k = int(min(s.out - s.generated for s in running))
        k = min(k, MAX_SEGMENT_ITERATIONS)
        blocks_now = -(-kv // BLOCK_TOKENS)
        avail = self.pool.capacity - self.pool.used

        def demand(j: int) -> int:
            return int((-(-(kv + j) // BLOCK_TOKENS) - blocks_now).sum())

        if demand(k) > avail:                   # largest k with demand(k) <= avail (demand rises with k)
            lo, hi = 0, k
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if demand(mid) <= avail:
                    lo = mid
                else:
                    hi = mid
            k = lo
        if k == 0:
            return False
        kvf = kv.astype(float)
        lowest = int(kv.min())
        j = np.arange(k, dtype=float)
        arch = self.arch
        if lowest < self.linear_from:           # sliding window / top-k: evaluate exactly, up to the linear part
            k = min(k, self.linear_from - lowest)
            j = j[:k]
            ctx = kvf[None, :] + j[:, None]
            kv_bytes = arch.kv_bytes_for_context(ctx, self.kv_dtype).sum(axis=1)
            attn = arch.attention_flops_per_token(ctx).sum(axis=1)
        else:
            f0 = arch.kv_bytes_for_context(kvf, self.kv_dtype)
            f1 = arch.kv_bytes_for_context(kvf + 1.0, self.kv_dtype)
            g0 = arch.attention_flops_per_token(kvf)
            g1 = arch.attention_flops_per_token(kvf + 1.0)
            kv_bytes = float(np.sum(f0)) + j * float(np.sum(f1 - f0))
            attn = float(np.sum(g0)) + j * float(np.sum(g1 - g0))
        t = np.asarray(self.step.iteration_time_s(IterationLoad(float(b), 0.0, kv_bytes, attn)), dtype=float)
        t = np.broadcast_to(t, j.shape)
        ends = np.cumsum(np.concatenate(([self.now], t)))[1:]
        stop = self._stop_time()
        first = int(np.searchsorted(ends, stop, side="left"))
        k = min(k, first + 1)
        t = t[:k]
        self._sample()
        total_t = float(t.sum())
        kv_tokens_s = float((t * (self.kv_tokens + b * j[:k])).sum())
        st = self.stats
        if self._in_window():
            st.busy_s += total_t
            st.decode_batch_s += b * total_t
            st.running_batch_s += b * total_t
            st.kv_tokens_s += kv_tokens_s
        st.iterations += k
        self.pool.take(demand(k))
        st.max_blocks_used = max(st.max_blocks_used, self.pool.used)
        self.now = float(ends[k - 1])
        st.decode_tokens += b * k
        st.generated_tokens += b * k
        self.kv_tokens += b * k
        done = []
        for seq in running:
            seq.kv_len += k
            seq.total += k
            seq.generated += k
            seq.own = self.blocks_for(seq.kv_len)
            if seq.generated == seq.out:
                done.append(seq)
        self._finish(done)
        return True

    def _break_deadlock(self) -> bool:
        """Nothing runs and the queue head cannot be admitted: release pinned contexts, oldest first.

        Under ``retain``/``ttl`` contexts of agents in tool waits can fill the pool so
        that no call can start; a real engine must then drop some. Spilled contexts
        go to the prefix cache (they may still hit). A call that cannot fit even in an
        empty pool is rejected and its task ended (counted in ``rejected_calls``).
        """
        if self.pinned:
            self._unpin(next(iter(self.pinned)))
            self.stats.spills += 1
            return True
        for seq in reversed(self.waiting):
            if seq.retained:
                self.release(seq)
                self.stats.spills += 1
                return True
        head = self.waiting.popleft()
        self.release(head)
        self.stats.rejected_calls += 1
        self.driver.on_rejected(head, self.now)
        return True

    def check_invariants(self) -> None:
        """Block and token accounting agree (tests run with ``check=True``; raises AssertionError)."""
        pool = self.pool
        held = [s for s in self.running] + [s for s in self.waiting if s.retained]
        own = sum(s.own for s in held) + sum(p[2] for p in self.pinned.values())
        assert 0 <= pool.used <= pool.capacity, (pool.used, pool.capacity)
        assert 0 <= pool.cached_blocks and pool.used + pool.cached_blocks <= pool.capacity
        assert pool.cached_blocks == sum(pool.cached.values())
        assert pool.used == self.sb + own, (pool.used, self.sb, own)
        tokens = self.shared + sum(s.kv_len - self.shared for s in held if s.kv_len) + sum(
            p[1] - self.shared for p in self.pinned.values())
        assert tokens == self.kv_tokens, (tokens, self.kv_tokens)
        for s in held:
            assert s.own == self.blocks_for(s.kv_len) or (s.prefill and s.own >= self.blocks_for(s.kv_len)), \
                (s.own, s.kv_len)
            assert s.kv_len < s.total and 0 <= s.generated <= s.out

    def run(self, progress=None) -> None:
        """Run until the driver says stop; ``progress(now_s)`` is called now and then."""
        tick = 0
        while True:
            self._process_events()
            if self.check:
                self.check_invariants()
            if self.driver.finished(self.now):
                break
            tick += 1
            if progress is not None and tick % 2048 == 0:
                progress(self.now)
            if self.running:
                if not (self.fast and self._fast_forward()):
                    self.step_once()
                continue
            if self.waiting:
                if self.step_once():
                    continue
                self._break_deadlock()
                continue
            nxt = min(self.arrivals[0][0] if self.arrivals else np.inf,
                      self.expiries[0][0] if self.expiries else np.inf)
            if self.driver.stop_time_s > self.now:
                nxt = min(nxt, self.driver.stop_time_s)
            if not np.isfinite(nxt):
                break
            self._idle_until(max(self.now, nxt))

    def _idle_until(self, t: float) -> None:
        """No iteration runs until ``t``: pinned and shared KV still count as resident."""
        lo, hi = max(self.now, self.window[0]), min(t, self.window[1])
        if hi > lo:
            self.stats.kv_tokens_s += (hi - lo) * self.kv_tokens
        self.now = t
