"""The calls inside one replica's engine: a model call (:class:`Seq`) and the running batch (:class:`Batch`).

The scheduler touches every running sequence every iteration, so the batch keeps their
hot fields as numpy arrays and each iteration is a handful of vectorised operations
rather than a loop over sequences.
"""

from __future__ import annotations

import numpy as np


class Seq:
    """One model call inside the engine."""

    __slots__ = ("agent", "ctx", "total", "kv_len", "own", "generated", "out", "prefill", "ready_s", "first_s",
                 "host_tokens", "retained", "slot")

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
        self.slot = -1                 # the llama.cpp slot it runs in (apmw.sim.slots), -1 none


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
        cat = np.concatenate
        self.kv = cat((self.kv, (seq.kv_len,)))
        self.total = cat((self.total, (seq.total,)))
        self.own = cat((self.own, (seq.own,)))
        self.gen = cat((self.gen, (seq.generated,)))
        self.out = cat((self.out, (seq.out,)))
        self.pre = cat((self.pre, (seq.prefill,)))

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
        idx = np.flatnonzero(mask).tolist()
        gone = [self._sync(i) for i in idx]
        keep = ~mask
        if len(idx) == 1:
            del self.seqs[idx[0]]
        else:
            self.seqs = [s for s, k in zip(self.seqs, keep.tolist()) if k]
        self.kv, self.total, self.own = self.kv[keep], self.total[keep], self.own[keep]
        self.gen, self.out, self.pre = self.gen[keep], self.out[keep], self.pre[keep]
        return gone
