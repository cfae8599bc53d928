"""One replica as a continuous-batching engine, iteration by iteration (vLLM V1's scheduler).

Each iteration (docs.vllm.ai, "Optimization and Tuning: chunked prefill"; vLLM V1
``Scheduler.schedule``; rules 1 and 2 are :class:`apmw.sim.scheduler.Scheduler`'s):

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
   uses) for its decode sequences, prefill tokens, KV bytes read and attention FLOPs
   (:mod:`apmw.sim.pricing` asks it, or reads the answer it gave before).

**Attention data-parallel ranks** (``serving.parallelism.dp_attention``): each rank is a scheduler of its
own (:mod:`apmw.sim.scheduler`: its queue, its share of the KV pool, its batch limit and token budget),
an agent's calls always go to its rank, and every rank's iteration runs together, priced as one at the
pace of the rank whose attention reads the most (:meth:`Engine._busiest_rank_loads`).

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

**Polling for new calls** (``serving.scheduler_recv_interval``, SGLang's ``--scheduler-recv-interval``):
a busy scheduler takes in the calls that arrived only every ``recv_interval`` decode iterations, and
right after any iteration that carried prompt tokens; the ones in between wait for that poll.

**Speculative decoding** (``serving.speculative``, :mod:`apmw.perf.speculative`): a decoding sequence
computes its pending token and ``k`` draft tokens (``k + 1`` of the budget and of KV), each iteration's
time is the step model's times ``1 + draft_cost_fraction``, and the sequence keeps as many tokens as the
drafts accepted plus one, deterministically (:mod:`apmw.sim.drafts`: every call keeps the expected tokens
an iteration). The KV of rejected drafts is freed at once. The fast
path has its own form for it (:mod:`apmw.sim.fast_forward`).

**Fast path** (:mod:`apmw.sim.fast_forward`): where every running sequence decodes and nobody can be
admitted, many iterations are priced and applied at once, up to the next event; a replica with one
scheduler only.

The engine owns the clock and the arrivals; each scheduler its queue and batch. Where the KV blocks go (shared prefix, held
contexts, pins and their spills) is :class:`apmw.sim.kv_ledger.KvLedger`'s account, what an
iteration costs is :class:`apmw.sim.pricing.Pricer`'s (the step model's times, asked as seldom
as possible), and what the run measures is :class:`apmw.sim.stats.Meter`'s.
"""


from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from apmw.errors import ApmwError
from apmw.perf import IterationLoad, Replica
from apmw.perf.parallelism import at_busiest_rank
from apmw.sim.batch import Batch, Seq
from apmw.sim.fast_forward import fast_forward
from apmw.sim.kv_ledger import BLOCK_TOKENS, KvLedger
from apmw.sim.pricing import pricer_for
from apmw.sim.scheduler import Scheduler, tokens_at_end
from apmw.sim.slots import SlotPromptCache
from apmw.sim.stats import Meter
from apmw.spec import Serving

__all__ = ["BLOCK_TOKENS", "Batch", "Engine", "Seq"]

# Calls rejected one after another with none finishing between them: the agents' calls do not fit the KV pool
# at all (each rejected task is followed at once by the agent's next, whose call does not fit either, so the
# simulated clock stands still). A workload where only some calls are too large passes this many in a row
# with a chance of (their share) ** 1000.
MAX_REJECTIONS_IN_A_ROW = 1000


class Engine:
    """The clock of one replica and its schedulers (one, or one per attention data-parallel rank), with their
    KV ledgers and the meter; a driver feeds it calls."""

    def __init__(self, replica: Replica, serving: Serving, shared_tokens: int, driver, *, fast: bool = True,
                 window: tuple[float, float] = (0.0, float("inf")), sample_dt_s: float = float("inf"),
                 check: bool = False):
        step = replica.step
        self.step = step
        self.arch = step.arch
        self.kv_dtype = step.kv_dtype
        policy = replica.policy
        self.prefill_first = not policy.mixed_prefill
        self.ahead = policy.iterations_ahead
        # speculative decoding: tokens a decoding sequence computes per iteration (its pending token and the
        # drafts), each draft's acceptance, and what the draft multiplies an iteration's time by
        sd = replica.speculative
        self.verify = sd.verified_tokens if sd else 1
        self.acceptance = sd.acceptance_rate if sd else 0.0
        self.draft_factor = sd.time_factor if sd else 1.0
        self._last_start_s = 0.0          # when the iteration that ended last began
        # the scheduler's polls for new calls (SGLang --scheduler-recv-interval): every recv_interval decode
        # iterations and after every iteration that carried prompt tokens
        self.recv_interval = policy.recv_interval
        self._received_s = 0.0            # arrivals up to this time have been taken in
        self._decodes_since_poll = 0
        slots = (SlotPromptCache(policy.max_batch, shared_tokens)
                 if policy.slot_prompt_cache and serving.prefix_caching else None)
        self.arrivals: list = []          # heap of (time, n, seq)
        self._n = 0
        self.now = 0.0
        self.driver = driver
        self.fast = fast
        self.check = check
        # iteration times, decode segments from tables (apmw.sim.pricing)
        self.pricer = pricer_for(step, policy.token_budget + policy.max_batch, policy.max_batch)
        self.meter = Meter(step.compute_share, window, sample_dt_s, self.pricer.decode_shares)
        self.stats = self.meter.stats
        # contexts below this many tokens make KV bytes / attention FLOPs non-linear (sliding window, top-k)
        self.linear_from = self.pricer.linear_from
        # one scheduler, or one per attention data-parallel rank with its share of the pool, the batch limit
        # and the token budget (the policy's are the replica's totals: apmw.perf.serving_policy)
        ranks = step.parallel.dp
        self.ranks = [Scheduler(KvLedger(replica.kv_capacity_bytes / ranks, step.kv_bytes_per_token,
                                         serving.prefix_caching, shared_tokens, slots),
                                policy.max_batch // ranks, policy.token_budget // ranks, self.verify,
                                policy.reserved_output_share, serving.engine == "sglang", self.stats,
                                self._admitted)
                      for _ in range(ranks)]
        self._batches = [sched.running for sched in self.ranks]     # each scheduler keeps its batch object
        self.kv_bytes_per_token = step.kv_bytes_per_token
        self._rejected_in_a_row = 0                                   # calls rejected since one last finished
        self._only = self.ranks[0] if ranks == 1 else None           # the one scheduler, without ranks

    # Told of every admission (seq, plan) before it is made: None, or a method of a subclass (apmw.sim.fleet).
    _admitted = None

    @property
    def running(self) -> Batch:
        """The running batch of the replica's scheduler (rank 0's under attention data parallelism)."""
        return self.ranks[0].running

    @property
    def waiting(self) -> deque[Seq]:
        """The waiting queue of the replica's scheduler (rank 0's under attention data parallelism)."""
        return self.ranks[0].waiting

    @property
    def ledger(self) -> KvLedger:
        """The KV ledger of the replica's scheduler (rank 0's under attention data parallelism)."""
        return self.ranks[0].ledger

    def scheduler_for(self, seq: Seq) -> Scheduler:
        """The scheduler a call goes to: under attention data parallelism, its agent's rank, so that an agent's
        calls find its context where they left it (ASSUMPTION: session-affine routing, as ``apmw plan``
        prices it; a benchmark's independent requests go round the ranks in turn)."""
        if self._only is not None:
            return self._only
        ranks = self.ranks
        return ranks[seq.agent % len(ranks)] if seq.agent >= 0 else ranks[(-seq.ctx - 1) % len(ranks)]

    def ledger_for(self, seq: Seq) -> KvLedger:
        """The KV ledger holding ``seq``'s context (:meth:`scheduler_for`)."""
        return self.scheduler_for(seq).ledger

    def kv_tokens(self) -> int:
        """Resident KV tokens over every rank's pool."""
        if self._only is not None:
            return self._only.ledger.kv_tokens
        return sum(s.ledger.kv_tokens for s in self.ranks)

    def used_blocks(self) -> int:
        if self._only is not None:
            return self._only.ledger.pool.used
        return sum(s.ledger.pool.used for s in self.ranks)

    # ---- what drivers call -------------------------------------------------------------------------------
    def submit(self, seq: Seq, at_s: float) -> None:
        self._n += 1
        heapq.heappush(self.arrivals, (at_s, self._n, seq))

    # ---- internals ------------------------------------------------------------------------------------
    def _process_events(self) -> None:
        for sched in self.ranks:
            sched.ledger.expire(self.now)
        cutoff = self._arrival_cutoff_s()
        while self.arrivals and self.arrivals[0][0] <= cutoff:
            seq = heapq.heappop(self.arrivals)[2]
            sched = self.scheduler_for(seq)
            self.driver.on_arrival(seq)
            sched.ledger.queued(seq)
            if sched.never_fits(seq):
                sched.reject(seq)
                self._end_rejected(sched, seq)
                continue
            sched.waiting.append(seq)

    def _busy(self) -> bool:
        if self._only is not None:
            return bool(self._only.running.seqs)
        return any(sched.running.seqs for sched in self.ranks)

    def _arrival_cutoff_s(self) -> float:
        """Arrivals up to this time can join the next iteration. A busy engine that schedules
        ahead formed that iteration's batch when the one just ended began; otherwise, now. (The
        idle case is also what keeps the loop live: with nothing running, no iteration would
        ever move the cutoff past an arrival.) A busy scheduler that polls for new calls every
        ``recv_interval`` decode iterations keeps the cutoff of its last poll until the next one."""
        busy = self._busy()
        if self.recv_interval > 1 and busy and self._decodes_since_poll < self.recv_interval:
            return self._received_s
        self._decodes_since_poll = 0
        self._received_s = self._last_start_s if self.ahead and busy else self.now
        return self._received_s

    def step_once(self) -> bool:
        """One iteration by the rules above, every rank's together; False when nothing could be scheduled."""
        computed = decode = running = decode_tokens = 0
        kv_bytes = attn = 0.0
        parts = []
        priced: tuple[list, list, list] = ([], [], [])      # each rank's active sequences: contexts, tokens, prefilling
        for sched in self.ranks:
            if self.prefill_first:
                # SGLang: a batch of prompts (continued chunks, then the queue) whenever there is one,
                # decoding only when there is none (apmw.perf.serving_policy)
                n = sched.schedule(decodes=False)
                if not np.count_nonzero(n):
                    n = sched.schedule(prompts=False, admit=False)
            else:
                n = sched.schedule()
            r = sched.running
            if sched.all_decoding and self.verify == 1:
                # the common case: every running sequence decodes one token, so there are no masks to take
                c = decode_r = rank_decode_tokens = len(n)
                kv, n_act, pre, active, decoding = r.kv, n, r.pre, None, None
            else:
                c = int(n.sum())
                if not c:
                    continue
                active = n > 0
                if int(np.count_nonzero(active)) == len(n):      # every running sequence computes
                    kv, n_act, pre = r.kv, n, r.pre
                else:
                    kv, n_act, pre = r.kv[active], n[active], r.pre[active]
                decode_r = int(len(kv) - np.count_nonzero(pre))
                decoding = active & ~r.pre
                # a decoding sequence computes one token, or its pending token and the drafts
                rank_decode_tokens = int(n[decoding].sum()) if self.verify > 1 else decode_r
            computed += c
            if self._only is not None:
                kv_bytes, attn = self.pricer.loads(kv, n_act, pre)
            else:
                for held, part in zip(priced, (kv, n_act, pre)):
                    held.append(part)
            if decode_r:
                sched.decay_share(1)
            decode_tokens += rank_decode_tokens
            decode += decode_r
            running += len(kv)
            parts.append((sched, n, active, decoding, decode_r))
        if not computed:
            return False
        kv_tokens = self.kv_tokens()
        self.meter.sample(self.now, self._batches, kv_tokens)
        prefill_tokens = computed - decode_tokens
        # SGLang weighs an iteration with prompt tokens past any interval: the next loop polls
        self._decodes_since_poll = self.recv_interval if prefill_tokens else self._decodes_since_poll + 1
        if self._only is None:
            kv_by_rank, attn_by_rank = self.pricer.loads_by_rank(*priced)
            kv_bytes, attn = self._busiest_rank_loads(decode_tokens, list(kv_by_rank), list(attn_by_rank))
        load = IterationLoad(decode_tokens, prefill_tokens, kv_bytes, attn)
        t = self.pricer.time_s(load) * self.draft_factor
        self.meter.iteration(self.now, t, decode, running, t * kv_tokens, self.used_blocks(), load)
        self._last_start_s = self.now
        self.now += t
        self.stats.prefill_tokens += prefill_tokens
        for sched, n, active, decoding, decode_r in parts:
            self._advance(sched, n, active, decoding, decode_r)
        return True

    def _busiest_rank_loads(self, decode_seqs: int, kv_by_rank: list[float], attn_by_rank: list[float]
                            ) -> tuple[float, float]:
        """(KV bytes read, attention FLOPs) to price an iteration of attention data-parallel ranks by: every
        rank waits for the busiest in the MoE layers, so its attention sets the pace. The step model prices a
        replica's load with the busiest rank's share of an even split of ``decode_seqs``
        (:func:`apmw.perf.parallelism.busiest_rank_share`, what the step model can know); here the ranks'
        own loads are known, so the load handed to it makes that share the busiest rank's (:func:`at_busiest_rank`)."""
        lay = self.step.parallel       # a rank that computed nothing this iteration is not in the lists
        return (float(at_busiest_rank(lay, decode_seqs, max(kv_by_rank))),
                float(at_busiest_rank(lay, decode_seqs, max(attn_by_rank))))

    def _advance(self, sched: Scheduler, n: np.ndarray, active: np.ndarray | None, decoding: np.ndarray | None,
                 decode: int) -> None:
        """``sched``'s sequences after an iteration that computed ``n`` tokens each: prompts that finished
        their prefill emit their first token, decodes theirs (or what their drafts kept), and finished calls
        go back to the driver."""
        r, st = sched.running, self.stats
        if active is None:
            # every running sequence decoded one token (step_once's common case): a decoding sequence holds its
            # pending token's place in total, so the token just computed is generated
            r.kv += 1
            if self.check:
                assert (r.kv == r.total).all(), "a decoding sequence's total is not one past its KV"
            sched.ledger.computed(decode)
            r.gen += 1
            r.total += 1
            st.decode_tokens += decode
            st.generated_tokens += decode
            done = r.gen == r.out
            if np.count_nonzero(done):
                self._finish(sched, done)
            return
        if self.verify > 1 and decode:
            n = sched.keep_accepted(n, decoding, self.acceptance)
        else:
            st.decode_tokens += decode
        r.kv += n
        sched.ledger.computed(int(n.sum()))
        gen = active & (r.kv == r.total)          # a prompt's last chunk, or a decode step without drafts
        r.gen += gen
        r.total += gen
        st.generated_tokens += int(np.count_nonzero(gen))
        first = gen & r.pre
        if np.count_nonzero(first):
            for i in np.flatnonzero(first).tolist():
                seq = r.seqs[i]
                if seq.first_s < 0:
                    seq.first_s = self.now
            r.pre = r.pre & ~first
        done = (gen | decoding) & (r.gen == r.out)
        if np.count_nonzero(done):
            self._finish(sched, done)

    def _finish(self, sched: Scheduler, done: np.ndarray) -> None:
        if not np.count_nonzero(done):
            return
        self._rejected_in_a_row = 0
        for seq in sched.running.remove(done):
            self.driver.on_done(seq, self.now)

    def _break_deadlock(self, sched: Scheduler) -> None:
        """Nothing runs on ``sched`` and its queue head cannot be admitted even with every pin spilled
        (:meth:`Scheduler.break_deadlock`); a call that cannot fit even in an empty pool is rejected and its
        task ended."""
        head = sched.break_deadlock()
        if head is not None:
            self._end_rejected(sched, head)

    def _end_rejected(self, sched: Scheduler, seq: Seq) -> None:
        """End the task of a call the pool can never hold; stop the run where no call fits at all."""
        self._rejected_in_a_row += 1
        if self._rejected_in_a_row >= MAX_REJECTIONS_IN_A_ROW:
            raise ApmwError(self._nothing_fits(sched, seq))
        self.driver.on_rejected(seq, self.now)

    def _nothing_fits(self, sched: Scheduler, head: Seq) -> str:
        """Why the simulation cannot go on: the agents' calls do not fit the KV pool, empty."""
        per_rank = f" of each of its {len(self.ranks)} attention-DP ranks" if len(self.ranks) > 1 else ""
        tokens = tokens_at_end(head)
        block_bytes = self.kv_bytes_per_token * BLOCK_TOKENS
        return (f"no call fits: {self._rejected_in_a_row:,} calls in a row were rejected at {self.now:,.1f} s of "
                f"simulated time, none finishing between them; the last needs the KV of {tokens:,} tokens by its last "
                f"one, prompt and output ({tokens * self.kv_bytes_per_token / 1e9:.2f} GB), more than the replica's whole KV pool"
                f"{per_rank} holds ({sched.ledger.pool.capacity * block_bytes / 1e9:.2f} GB). Use more GPUs per "
                "replica, a smaller kv_dtype, or shorter contexts (summarisation); apmw plan refuses a spec's workload "
                "for the same reason")

    def check_invariants(self) -> None:
        """Block and token accounting agree (tests run with ``check=True``; raises AssertionError)."""
        for sched in self.ranks:
            sched.check_invariants()

    def run(self, progress=None) -> None:
        """Run until the driver says stop; ``progress(now_s)`` is called now and then."""
        tick = 0
        ranks = self.ranks
        while True:
            self._process_events()
            if self.check:
                self.check_invariants()
            if self.driver.finished(self.now):
                break
            tick += 1
            if progress is not None and tick % 2048 == 0:
                progress(self.now)
            if len(ranks) == 1:
                sched = ranks[0]
                if sched.running.seqs:
                    if not (self.fast and fast_forward(self)):
                        self.step_once()
                    continue
                if sched.waiting:
                    if not self.step_once():
                        self._break_deadlock(sched)
                    continue
            elif any(sched.running.seqs or sched.waiting for sched in ranks):
                self.step_once()
                for sched in ranks:       # a rank left idle with a queue: its head cannot be admitted
                    if sched.waiting and not sched.running.seqs:
                        self._break_deadlock(sched)
                continue
            nxt = min(self.arrivals[0][0] if self.arrivals else np.inf,
                      min(sched.ledger.next_expiry_s() for sched in ranks))
            if self.driver.stop_time_s > self.now:
                nxt = min(nxt, self.driver.stop_time_s)
            if not np.isfinite(nxt):
                break
            self._idle_until(max(self.now, nxt))
        self.meter.flush()

    def _idle_until(self, t: float) -> None:
        """No iteration runs until ``t``: pinned and shared KV still count as resident."""
        self.meter.idle(self.now, t, self.kv_tokens())
        self.now = t
