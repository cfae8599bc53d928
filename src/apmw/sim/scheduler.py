"""One scheduler's waiting queue, running batch and KV pool: rules 1 and 2 of :mod:`apmw.sim.engine`.

A replica has one scheduler, or one per attention data-parallel rank: each rank runs its own
scheduler over its own requests, its own KV pool (a ``1 / ranks`` share of the replica's, with its
own copy of the shared prefix) and its own batch limit and token budget, and the ranks meet only
in the MoE layers, so every rank's iteration starts and ends together
(:func:`apmw.perf.serving_policy.schedulers_per_limit` says which settings are per rank in each
engine; :mod:`apmw.sim.engine` prices the ranks' iterations as one).

Each iteration a scheduler gives tokens to its **running sequences first**, in admission order,
within the token budget, allocating their KV blocks; when the pool cannot supply them it spills a
pinned context, then **preempts** the most recently admitted sequence (recompute). **Then the waiting
sequences**, first come first served, while nothing was preempted, budget is left and fewer than the
batch limit run: a sequence reuses its cached prefix and is admitted only if the blocks for its first
chunk are available, and, where the engine keeps room for the running sequences' output (TensorRT-LLM,
SGLang's ``new_token_ratio``), that room too.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from apmw.perf.serving_policy import (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO,
                                      SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_RETRACT_DECODE_STEPS)
from apmw.sim.batch import Batch, Seq
from apmw.sim.drafts import kept_tokens
from apmw.sim.kv_ledger import KvLedger
from apmw.sim.stats import Stats


def tokens_at_end(seq: Seq) -> int:
    """The tokens whose KV ``seq`` holds by its last token: its prompt and every output token but the last."""
    return seq.total + seq.out - seq.generated - 1


class Scheduler:
    """The queue, running batch and KV ledger of one scheduler (module docstring)."""

    def __init__(self, ledger: KvLedger, max_batch: int, max_tokens: int, verify: int, reserved_share: float,
                 adaptive_share: bool, stats: Stats, admitted: Callable[[Seq, tuple], None] | None = None):
        self.ledger = ledger
        self.running = Batch()
        self.waiting: deque[Seq] = deque()
        self.max_batch = max_batch
        self.max_tokens = max_tokens
        # tokens a decoding sequence computes per iteration: its pending token and any drafts
        self.verify = verify
        # the share of the running sequences' remaining output kept back at admission; SGLang's
        # adapts (new_token_ratio): from 0.7 down a step per decode iteration, reset on retraction
        self.reserved_share = reserved_share
        self.adaptive_share = adaptive_share
        self.share_decay = ((SGLANG_INIT_NEW_TOKEN_RATIO - SGLANG_MIN_NEW_TOKEN_RATIO)
                            / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS) if adaptive_share else 0.0
        self.stats = stats
        # told of every admission before it is made (the fleet simulator counts them)
        self.admitted = admitted
        # whether the last schedule() had every running sequence decode and admitted none (its tokens: verify each)
        self.all_decoding = False

    # ---- rule 2: admission ----------------------------------------------------------------------------
    def admission(self, seq: Seq, budget: int):
        """(kv_len after the hit, cached blocks reused, new blocks, tokens this iteration), or None."""
        ledger = self.ledger
        kv, reuse = ledger.cached_prefix(seq)
        n = min(seq.total - kv, budget)
        held = seq.own if seq.retained else reuse
        new = ledger.blocks_for(kv + n) - held
        free = ledger.pool.available - reuse
        if new > free:
            return None
        share = self.reserved_share
        if share and (ledger.blocks_for(seq.total + int(share * (seq.out - seq.generated))) - held
                      + ledger.reserved_blocks(self.running, share) > free):
            return None         # TensorRT-LLM, SGLang: room kept back for the running sequences' output
        return kv, reuse, new, n

    def _admit(self, seq: Seq, plan) -> int:
        if self.admitted is not None:
            self.admitted(seq, plan)
        kv, reuse, new, n = plan
        if not seq.retained:
            st = self.stats
            st.lookup_tokens += seq.total
            st.hit_tokens += self.ledger.hit_tokens(kv, reuse)
        self.ledger.admit(seq, kv, reuse, new)
        return n

    def _preempt(self, seq: Seq) -> None:
        self.ledger.release(seq)
        seq.prefill = True
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def spill_one(self) -> bool:
        """Memory is short: the ledger releases one pinned context (:meth:`KvLedger.spill_one`)."""
        if self.ledger.spill_one(self.waiting):
            self.stats.spills += 1
            return True
        return False

    def decay_share(self, steps: int) -> None:
        """SGLang's new_token_ratio falls a step per decode iteration, to its floor."""
        if self.adaptive_share:
            self.reserved_share = max(self.reserved_share - steps * self.share_decay, SGLANG_MIN_NEW_TOKEN_RATIO)

    # ---- rule 1, then rule 2 ----------------------------------------------------------------------------
    def _schedule_running(self, budget: int, prompts: bool = True, decodes: bool = True
                          ) -> tuple[np.ndarray, int, bool]:
        """Tokens each running sequence computes this iteration (in order, within the budget), its blocks
        allocated; spills pins, then preempts from the back, when the pool runs short. ``prompts`` and
        ``decodes`` say which running sequences this iteration may carry (both when mixed)."""
        r, ledger = self.running, self.ledger
        b = len(r.seqs)
        v = self.verify
        if decodes and b * v <= budget and not np.count_nonzero(r.pre):
            # the common case: every running sequence decodes (a token, or its pending token and the drafts),
            # and the pool has the blocks
            need = ledger.blocks_for(r.kv + v) - r.own
            total_need = int(need.sum())
            if ledger.fits(total_need):
                ledger.take(total_need)
                r.own += need
                self.all_decoding = True
                return np.full(b, v, dtype=np.int64), budget - b * v, False
        want = np.where(r.pre, r.total - r.kv if prompts else 0, v if decodes else 0)
        before = np.cumsum(want) - want
        n = np.clip(budget - before, 0, want)
        need = np.where(n > 0, ledger.blocks_for(r.kv + n) - r.own, 0)
        total_need = int(need.sum())
        if ledger.fits(total_need):                        # the common case: everything fits
            ledger.take(total_need)
            r.own += need
            return n, budget - int(n.sum()), False
        preempted = False                                  # memory is short: vLLM's sequential loop
        i = 0
        n = np.zeros(len(r), dtype=np.int64)
        while i < len(r):
            if (r.pre[i] and not prompts) or (not r.pre[i] and not decodes):
                i += 1
                continue
            ni = min(int(r.total[i] - r.kv[i]) if r.pre[i] else v, budget)
            if ni <= 0:
                break
            need_i = ledger.blocks_for(int(r.kv[i]) + ni) - int(r.own[i])
            while not ledger.fits(need_i):
                if self.spill_one():
                    continue
                last = len(r) - 1
                self._preempt(r.pop_last())
                preempted = True
                if last == i:
                    break
            else:
                ledger.take(need_i)
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

    def schedule(self, prompts: bool = True, decodes: bool = True, admit: bool = True) -> np.ndarray:
        """Tokens per running sequence this iteration (rule 1), then admissions (rule 2) appended."""
        r = self.running
        budget = self.max_tokens
        self.all_decoding = False
        n, budget, preempted = (self._schedule_running(budget, prompts, decodes) if r.seqs
                                else (np.zeros(0, np.int64), budget, False))
        if not preempted and admit:
            added = []
            while self.waiting and budget > 0 and len(r.seqs) < self.max_batch:
                plan = self.admission(self.waiting[0], budget)
                while plan is None and self.spill_one():
                    plan = self.admission(self.waiting[0], budget)
                if plan is None:
                    break
                seq = self.waiting.popleft()
                ni = self._admit(seq, plan)
                r.append(seq)
                added.append(ni)
                budget -= ni
            if added:
                self.all_decoding = False
                n = np.concatenate((n, np.array(added, dtype=np.int64)))
        return n

    # ---- after the iteration -------------------------------------------------------------------------
    def keep_accepted(self, n: np.ndarray, decoding: np.ndarray, acceptance: float) -> np.ndarray:
        """Speculative decoding: ``n`` with each decoding sequence's computed tokens cut to the ones it keeps.
        Those sequences' generated tokens are counted here (their pending token's KV and the accepted drafts'
        are kept, so each stays one token short of its total) and the blocks of rejected drafts freed."""
        r, st = self.running, self.stats
        kept = np.minimum(kept_tokens(r.gen[decoding], n[decoding], acceptance),
                          r.out[decoding] - r.gen[decoding])
        n = n.copy()
        n[decoding] = kept
        r.gen[decoding] += kept
        r.total[decoding] += kept
        st.decode_tokens += int(kept.sum())
        st.generated_tokens += int(kept.sum())
        own = self.ledger.blocks_for(r.kv[decoding] + kept)
        self.ledger.give_back(int((r.own[decoding] - own).sum()))
        r.own[decoding] = own
        return n

    def never_fits(self, seq: Seq) -> bool:
        """Whether ``seq`` needs more blocks than the whole pool holds by its last token (its prompt and every
        output token but the last): admitted, it would grow, be preempted and computed again without end. An
        engine refuses it (vLLM will not start with a context window its KV cache cannot hold)."""
        return self.ledger.blocks_for(tokens_at_end(seq)) > self.ledger.pool.capacity - self.ledger.sb

    def break_deadlock(self) -> Seq | None:
        """Nothing runs here and the queue head cannot be admitted even with every pin spilled.

        Its own retained context is released first (it may still hit); a call that cannot fit even
        in an empty pool is taken off the queue and returned, for the engine to reject (counted in
        ``rejected_calls``); None when a release was enough.
        """
        if self.spill_one():
            return None
        head = self.waiting[0]
        if head.retained:
            self.ledger.release(head)
            self.stats.spills += 1
            return None
        head = self.waiting.popleft()
        self.reject(head)
        return head

    def reject(self, seq: Seq) -> None:
        """Take ``seq`` off the books, its context freed (:meth:`never_fits`, :meth:`break_deadlock`), counted in
        ``rejected_calls``."""
        self.ledger.release(seq)
        self.stats.rejected_calls += 1

    def check_invariants(self) -> None:
        """Block and token accounting agree (raises AssertionError)."""
        self.running.sync_all()
        held = list(self.running.seqs) + [s for s in self.waiting if s.retained]
        self.ledger.check_invariants(held, self.waiting)
        for s in held:
            assert s.kv_len < s.total and 0 <= s.generated <= s.out
