"""Which tokens a decoding call keeps under speculative decoding, in the simulator (:mod:`apmw.sim.engine`).

A call that computes its pending token and ``k`` drafts, each accepted with probability ``a``, keeps
``y = (1 - a^(k+1)) / (1 - a)`` tokens an iteration on average (:mod:`apmw.perf.speculative`). The
simulator keeps exactly that mean, deterministically: a call's output is cut into iterations at
``floor(j y)`` (:func:`cut`), and each iteration keeps the tokens up to the next cut (:func:`kept_tokens`).
So every call decodes in the expected number of iterations, as the analytic model prices it, without the
step-to-step variance of real acceptance (over a call of a few hundred tokens that variance moves its
decode time by about a percent). The engine's fast path puts a call ``j`` iterations ahead at
``cut(m + j - 1)`` from its next cut ``m`` (:func:`next_cut`); the plain step reaches the same place one
iteration at a time, because both use these functions (``tests/sim/test_speculative.py``).
"""

from __future__ import annotations

import numpy as np


def tokens_per_iteration(acceptance: float, computed: np.ndarray) -> np.ndarray:
    """``y = (1 - a^c) / (1 - a)``: the tokens an iteration that computes a sequence's pending token and
    ``c - 1`` drafts yields on average (one numpy expression, so the plain step and the fast path agree to
    the last bit)."""
    return (1.0 - np.power(acceptance, np.asarray(computed, dtype=float))) / (1.0 - acceptance)


def cut(j: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where a call's ``j``-th iteration ends in its output: ``floor(j y)`` (the 1e-9 keeps a product that
    should be whole from falling a unit short)."""
    return np.floor(j * y + 1e-9).astype(np.int64)


def next_cut(generated: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The index ``j`` of the first cut past ``generated`` tokens: the least ``j`` with ``cut(j, y) >
    generated``, found from its estimate by stepping with :func:`cut` itself (at most twice), so that a
    call at a cut always finds the next one (``y >= 1``)."""
    j = np.floor((generated + 1) / y) - 1.0
    for _ in range(3):
        j = np.where(cut(j, y) <= generated, j + 1.0, j)
    return j


def kept_tokens(generated: np.ndarray, computed: np.ndarray, acceptance: float) -> np.ndarray:
    """Tokens a decoding sequence keeps from an iteration that computed ``computed`` of its tokens (its
    pending one and ``computed - 1`` drafts, each accepted with probability ``acceptance``), having generated
    ``generated`` so far. Deterministic (module docstring): the output is cut into iterations at
    ``floor(j y)`` (:func:`cut`), ``y`` the tokens such an iteration yields on average
    (:func:`tokens_per_iteration`), so the mean over a call is ``y``. Between 1 and ``computed``."""
    y = tokens_per_iteration(acceptance, computed)
    return np.clip(cut(next_cut(generated, y), y) - generated, 1, computed)
