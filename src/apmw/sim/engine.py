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

**Prefill first** (SGLang's default, ``serving.engine: sglang`` unless
``serving.mixed_prefill``): an iteration carries either prompts (rule 1 for sequences still
prefilling, then rule 2, the whole budget theirs) or, only when no prompt can run, every
decode; never both (:mod:`apmw.perf.serving_policy`).

**Reserved output** (:mod:`apmw.perf.serving_policy`): rule 2 admits a sequence only if the pool
can also hold a share of every running sequence's remaining output, and of its own.
TensorRT-LLM (``GUARANTEED_NO_EVICT``) reserves all of it, so nothing is ever preempted;
vLLM nothing; SGLang its ``new_token_ratio``: 0.7 at the start, a step lower every decode
iteration down to 0.098, and reset after each preemption (retraction) to what the running
sequences have decoded so far, plus 20 steps each, over their output lengths.

**Scheduled ahead** (:mod:`apmw.perf.serving_policy`; ``serving.overlap_scheduling``): vLLM's
async scheduling and SGLang's and TensorRT-LLM's overlap schedulers form the next iteration's
batch while the current one runs, so a busy engine's iteration takes only the sequences that
had arrived when the iteration before it started; an idle engine takes an arrival at once.

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
from apmw.perf.serving_policy import (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO,
                                  SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_RETRACT_DECODE_STEPS,
                                  reserved_output_share)
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


class Batch:
    """The running sequences, in admission order, with their hot fields as numpy arrays.

    While a sequence runs, ``kv``, ``total``, ``own``, ``gen`` and ``pre`` here are
    authoritative and the :class:`Seq` object's copies are stale; :meth:`pop_last`
    and :meth:`remove` write them back when a sequence leaves the batch.
    """

    __slots__ = ("seqs", "kv", "total", "own", "gen", "out", "pre")

    def __init__(self):
        self.seqs: list[Seq] = []
        z = np.zeros(0, dtype=np.int64)
        self.kv, self.total, self.own, self.gen, self.out = z, z, z, z, z
        self.pre = np.zeros(0, dtype=bool)

    def __len__(self) -> int:
        return len(self.seqs)

    def append(self, seq: Seq) -> None:
        self.seqs.append(seq)
        self.kv = np.append(self.kv, seq.kv_len)
        self.total = np.append(self.total, seq.total)
        self.own = np.append(self.own, seq.own)
        self.gen = np.append(self.gen, seq.generated)
        self.out = np.append(self.out, seq.out)
        self.pre = np.append(self.pre, seq.prefill)

    def _sync(self, i: int) -> Seq:
        seq = self.seqs[i]
        seq.kv_len, seq.total, seq.own = int(self.kv[i]), int(self.total[i]), int(self.own[i])
        seq.generated, seq.prefill = int(self.gen[i]), bool(self.pre[i])
        return seq

    def sync_all(self) -> None:
        for i in range(len(self.seqs)):
            self._sync(i)

    def pop_last(self) -> Seq:
        seq = self._sync(len(self.seqs) - 1)
        self.seqs.pop()
        self.kv, self.total, self.own = self.kv[:-1], self.total[:-1], self.own[:-1]
        self.gen, self.out, self.pre = self.gen[:-1], self.out[:-1], self.pre[:-1]
        return seq

    def remove(self, mask: np.ndarray) -> list[Seq]:
        idx = np.flatnonzero(mask)
        gone = [self._sync(int(i)) for i in idx]
        keep = ~mask
        self.seqs = [s for s, k in zip(self.seqs, keep.tolist()) if k]
        self.kv, self.total, self.own = self.kv[keep], self.total[keep], self.own[keep]
        self.gen, self.out, self.pre = self.gen[keep], self.out[keep], self.pre[keep]
        return gone


@dataclass
class Stats:
    """Counters and time integrals over the measurement window."""

    iterations: int = 0
    busy_s: float = 0.0
    compute_bound_s: float = 0.0     # busy time weighted by the roofline's compute-bound share (power)
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
        policy = replica.policy
        self.max_batch = policy.max_batch
        self.max_tokens = policy.token_budget
        self.prefill_first = not policy.mixed_prefill
        # the share of the running sequences' remaining output kept back at admission; SGLang's
        # adapts (new_token_ratio): from 0.7 down a step per decode iteration, reset on retraction
        self.adaptive_share = serving.engine == "sglang"
        self.reserved_share = reserved_output_share(serving.engine)
        if self.adaptive_share:
            self.share_decay = (SGLANG_INIT_NEW_TOKEN_RATIO - SGLANG_MIN_NEW_TOKEN_RATIO) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self.ahead = policy.iterations_ahead
        self._last_start_s = 0.0          # when the iteration that ended last began
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
        self.running = Batch()
        self.waiting: deque[Seq] = deque()
        self.arrivals: list = []          # heap of (time, n, seq)
        self.expiries: list = []          # heap of (time, n, agent, token)
        self.pinned: OrderedDict[int, tuple] = OrderedDict()   # agent -> (ctx, kv_len, own), oldest pin first
        self.retained_waiting = 0         # queued calls holding their pinned context
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
        held = self.pinned.get(agent)
        if held is None:
            return
        if held[0] != seq.ctx:                 # a finished task's context: never reused
            self._unpin(agent)
            return
        del self.pinned[agent]
        seq.kv_len, seq.own = held[1], held[2]
        seq.retained = True

    def release(self, seq: Seq) -> None:
        """Free a call's blocks; its full blocks stay in the prefix cache under its context."""
        self._free(seq.ctx, seq.kv_len, seq.own)
        seq.kv_len = seq.own = 0
        if seq.retained:
            self.retained_waiting -= 1
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
        cutoff = self._arrival_cutoff_s()
        while self.arrivals and self.arrivals[0][0] <= cutoff:
            seq = heapq.heappop(self.arrivals)[2]
            self.driver.on_arrival(seq)
            self.retained_waiting += seq.retained
            self.waiting.append(seq)

    def _arrival_cutoff_s(self) -> float:
        """Arrivals up to this time can join the next iteration. A busy engine that schedules
        ahead formed that iteration's batch when the one just ended began; otherwise, now. (The
        idle case is also what keeps the loop live: with nothing running, no iteration would
        ever move the cutoff past an arrival.)"""
        if self.ahead and len(self.running):
            return self._last_start_s
        return self.now

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
        held = seq.own if seq.retained else reuse
        new = self.blocks_for(kv + n) - held
        free = self.pool.capacity - self.pool.used - reuse
        if new > free:
            return None
        share = self.reserved_share
        if share and (self.blocks_for(seq.total + int(share * (seq.out - seq.generated))) - held
                      + self._reserved_blocks(share) > free):
            return None         # TensorRT-LLM, SGLang: room kept back for the running sequences' output
        return kv, reuse, new, n

    def _reserved_blocks(self, share: float) -> int:
        """Blocks the running sequences will still take for ``share`` of their remaining output."""
        r = self.running
        if not len(r):
            return 0
        ahead = (share * (r.out - r.gen)).astype(np.int64)
        return int(np.maximum(self._blocks_vec(r.total + ahead) - r.own, 0).sum())

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
        if seq.retained:
            self.retained_waiting -= 1
        seq.retained = False
        return n

    def _preempt(self, seq: Seq) -> None:
        self.release(seq)
        seq.prefill = True
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def _in_window(self) -> bool:
        return self.window[0] <= self.now < self.window[1]

    def _account(self, t: float, decode: int, running: int, kv_tokens_s: float,
                 load: IterationLoad | None = None) -> None:
        st = self.stats
        st.iterations += 1
        if self._in_window():
            st.busy_s += t
            if load is not None:        # the roofline's compute-bound share, priced only when it counts
                st.compute_bound_s += float(self.step.compute_share(load)) * t
            st.decode_batch_s += decode * t
            st.running_batch_s += running * t
            st.kv_tokens_s += kv_tokens_s
        if self.pool.used > st.max_blocks_used:
            st.max_blocks_used = self.pool.used

    def _sample(self) -> None:
        if self.now >= self._next_sample and self.now < self.window[1]:
            decode = int(len(self.running) - self.running.pre.sum())
            self.stats.samples.append((self.now, decode, self.kv_tokens))
            self._next_sample = self.now + self.sample_dt_s

    def _loads(self, kv: np.ndarray, n: np.ndarray, prefill: np.ndarray):
        arch = self.arch
        kv_bytes = float(np.sum(arch.kv_bytes_for_context(kv, self.kv_dtype)))
        attn = float(np.sum(n * arch.attention_flops_per_token(kv + np.where(prefill, n / 2.0, 0.0))))
        return kv_bytes, attn

    def _blocks_vec(self, tokens: np.ndarray) -> np.ndarray:
        return -(-tokens // BLOCK_TOKENS) - self.sb

    def _schedule_running(self, budget: int, prompts: bool = True, decodes: bool = True
                          ) -> tuple[np.ndarray, int, bool]:
        """Tokens each running sequence computes this iteration (in order, within the budget), its blocks
        allocated; spills pins, then preempts from the back, when the pool runs short. ``prompts`` and
        ``decodes`` say which running sequences this iteration may carry (both when mixed)."""
        r, pool = self.running, self.pool
        want = np.where(r.pre, r.total - r.kv if prompts else 0, 1 if decodes else 0)
        before = np.cumsum(want) - want
        n = np.clip(budget - before, 0, want)
        need = np.where(n > 0, self._blocks_vec(r.kv + n) - r.own, 0)
        total_need = int(need.sum())
        if total_need <= pool.capacity - pool.used:       # the common case: everything fits
            pool.take(total_need)
            r.own += need
            return n, budget - int(n.sum()), False
        preempted = False                                  # memory is short: vLLM's sequential loop
        i = 0
        n = np.zeros(len(r), dtype=np.int64)
        while i < len(r):
            if (r.pre[i] and not prompts) or (not r.pre[i] and not decodes):
                i += 1
                continue
            ni = min(int(r.total[i] - r.kv[i]), budget)
            if ni <= 0:
                break
            need_i = self.blocks_for(int(r.kv[i]) + ni) - int(r.own[i])
            while need_i > pool.capacity - pool.used:
                if self._spill_one():
                    continue
                last = len(r) - 1
                self._preempt(r.pop_last())
                preempted = True
                if last == i:
                    break
            else:
                pool.take(need_i)
                r.own[i] += need_i
                n[i] = ni
                budget -= ni
                i += 1
                continue
            break
        if preempted and self.adaptive_share and len(r):
            # SGLang's retract_decode: reserve what the survivors have shown they decode
            self.reserved_share = min(1.0, float(r.gen.sum() + SGLANG_RETRACT_DECODE_STEPS * len(r))
                                      / max(float(r.out.sum()), 1.0))
        return n[:len(r)], budget, preempted

    def _schedule(self, prompts: bool = True, decodes: bool = True, admit: bool = True) -> np.ndarray:
        """Tokens per running sequence this iteration (rule 1), then admissions (rule 2) appended."""
        r = self.running
        budget = self.max_tokens
        n, budget, preempted = (self._schedule_running(budget, prompts, decodes) if len(r)
                                else (np.zeros(0, np.int64), budget, False))
        if not preempted and admit:
            added = []
            while self.waiting and budget > 0 and len(r) < self.max_batch:
                plan = self._admission(self.waiting[0], budget)
                while plan is None and self._spill_one():
                    plan = self._admission(self.waiting[0], budget)
                if plan is None:
                    break
                seq = self.waiting.popleft()
                ni = self._admit(seq, plan)
                r.append(seq)
                added.append(ni)
                budget -= ni
            if added:
                n = np.concatenate((n, np.array(added, dtype=np.int64)))
        return n

    def step_once(self) -> bool:
        """One iteration by the rules above; False when nothing could be scheduled."""
        r = self.running
        if self.prefill_first:
            # SGLang: a batch of prompts (continued chunks, then the queue) whenever there is
            # one, decoding only when there is none (apmw.perf.serving_policy)
            n = self._schedule(decodes=False)
            if not (n > 0).any():
                n = self._schedule(prompts=False, admit=False)
        else:
            n = self._schedule()
        active = n > 0
        if not active.any():
            return False
        self._sample()
        kv = r.kv[active].astype(float)
        n_act = n[active].astype(float)
        pre = r.pre[active]
        kv_bytes, attn = self._loads(kv, n_act, pre)
        decode = int(len(kv) - pre.sum())
        if decode:
            self._decay_share(1)
        prefill_tokens = int(n_act[pre].sum())
        load = IterationLoad(decode, prefill_tokens, kv_bytes, attn)
        t = float(self.step.iteration_time_s(load))
        self._account(t, decode, len(kv), t * self.kv_tokens, load)
        self._last_start_s = self.now
        self.now += t
        st = self.stats
        st.prefill_tokens += prefill_tokens
        st.decode_tokens += decode
        r.kv += n
        self.kv_tokens += int(n.sum())
        gen = active & (r.kv == r.total)
        r.gen += gen
        r.total += gen
        st.generated_tokens += int(gen.sum())
        first = gen & r.pre
        if first.any():
            for i in np.flatnonzero(first).tolist():
                seq = r.seqs[i]
                if seq.first_s < 0:
                    seq.first_s = self.now
            r.pre = r.pre & ~first
        self._finish(gen & (r.gen == r.out))
        return True

    def _finish(self, done: np.ndarray) -> None:
        if not done.any():
            return
        for seq in self.running.remove(done):
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

    def _decay_share(self, steps: int) -> None:
        """SGLang's new_token_ratio falls a step per decode iteration, to its floor."""
        if self.adaptive_share:
            self.reserved_share = max(self.reserved_share - steps * self.share_decay, SGLANG_MIN_NEW_TOKEN_RATIO)

    def _fast_forward(self) -> bool:
        """Advance many all-decode iterations in one step; False when the plain step must run."""
        r = self.running
        b = len(r)
        if b == 0 or b > self.max_tokens or r.pre.any():
            return False
        if self.adaptive_share and self.waiting and self.reserved_share > SGLANG_MIN_NEW_TOKEN_RATIO:
            return False    # the share falls every iteration, so the queue head may fit at any one
        budget = self.max_tokens if self.prefill_first else self.max_tokens - b
        if self.waiting and b < self.max_batch and budget > 0 and (
                self._admission(self.waiting[0], budget) or self._spillable()):
            return False
        kv = r.kv
        k = int((r.out - r.gen).min())
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
        load = IterationLoad(float(b), 0.0, kv_bytes, attn)
        t = np.asarray(self.step.iteration_time_s(load), dtype=float)
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
            share = np.broadcast_to(np.asarray(self.step.compute_share(load), dtype=float), j.shape)
            st.compute_bound_s += float((share[:k] * t).sum())
            st.decode_batch_s += b * total_t
            st.running_batch_s += b * total_t
            st.kv_tokens_s += kv_tokens_s
        st.iterations += k
        self._decay_share(k)
        self.pool.take(demand(k))
        st.max_blocks_used = max(st.max_blocks_used, self.pool.used)
        self.now = float(ends[k - 1])
        self._last_start_s = self.now - float(t[k - 1])
        st.decode_tokens += b * k
        st.generated_tokens += b * k
        self.kv_tokens += b * k
        r.kv = r.kv + k
        r.total = r.total + k
        r.gen = r.gen + k
        r.own = self._blocks_vec(r.kv)
        self._finish(r.gen == r.out)
        return True

    def _spillable(self) -> bool:
        return bool(self.pinned) or self.retained_waiting > (1 if self.waiting and self.waiting[0].retained else 0)

    def _spill_one(self) -> bool:
        """Memory is short: release one pinned context to the prefix cache (it may still hit).

        Pinned contexts (``retain``, ``ttl``) are kept only while memory allows: an
        engine that let idle sessions block running or admissible calls would
        collapse under load. Oldest pin of an agent in a tool wait goes first, then
        the queued calls' retained contexts from the back of the queue (not the head's).
        """
        if self.pinned:
            self._unpin(next(iter(self.pinned)))
            self.stats.spills += 1
            return True
        if self.retained_waiting <= (1 if self.waiting and self.waiting[0].retained else 0):
            return False
        for seq in reversed(list(self.waiting)[1:]):
            if seq.retained:
                self.release(seq)
                self.stats.spills += 1
                return True
        return False

    def _break_deadlock(self) -> bool:
        """Nothing runs and the queue head cannot be admitted even with every pin spilled.

        Its own retained context is released first (it may still hit); a call that
        cannot fit even in an empty pool is rejected and its task ended (counted in
        ``rejected_calls``).
        """
        if self._spill_one():
            return True
        head = self.waiting[0]
        if head.retained:
            self.release(head)
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
        self.running.sync_all()
        held = list(self.running.seqs) + [s for s in self.waiting if s.retained]
        own = sum(s.own for s in held) + sum(p[2] for p in self.pinned.values())
        assert 0 <= pool.used <= pool.capacity, (pool.used, pool.capacity)
        assert 0 <= pool.cached_blocks and pool.used + pool.cached_blocks <= pool.capacity
        assert pool.cached_blocks == sum(pool.cached.values())
        assert self.retained_waiting == sum(s.retained for s in self.waiting)
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
