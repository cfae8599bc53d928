"""How long a new prompt waits at a busy engine before its first iteration starts.

Prompts that follow completions (a closed loop) land anywhere in an iteration and wait half of
one on average; Poisson arrivals land in an iteration picked by length and wait out its residual
(the inspection paradox). Either way they then wait the iterations the engine has already
scheduled (:mod:`apmw.perf.serving_policy`). The serving benchmark's spread-out, prefill-first
and lock-step models (:mod:`apmw.capacity.benchmark`, :mod:`apmw.capacity.benchmark_waves`) all
charge this wait.
"""

from __future__ import annotations

from apmw.perf.serving_policy import busy_arrival_wait_s


def arrival_wait_s(t_iter_s: float, running: int, ahead: float = 0.0, recv_interval: int = 1) -> float:
    """How long a new prompt waits before its first iteration starts.

    With other requests running it arrives anywhere in an iteration: it waits half of one on
    average (half of ``recv_interval`` iterations where the scheduler polls for new requests only
    that often: ``apmw.spec.Serving.scheduler_recv_interval``), and then the ``ahead``
    iterations whose batches the engine had already formed (1 under overlap or async scheduling:
    :func:`apmw.perf.serving_policy.iterations_scheduled_ahead`). A lone client's prompt finds the
    engine idle (its previous request has ended), so it starts at once.
    """
    return 0.0 if running <= 1 else busy_arrival_wait_s(t_iter_s, ahead, recv_interval)


def poisson_wait_s(share: float, t_prompt: float, t_decode: float, ahead: float,
                   recv_interval: int = 1) -> tuple[float, float]:
    """A Poisson arrival's wait before its first iteration, and the residual part of it.

    It lands in an iteration picked by length, so it waits out ``E[T^2] / 2E[T]`` of it (the
    inspection paradox; ``share`` of the iterations carry prompts and take ``t_prompt``), then the
    rest of the scheduler's poll span (``recv_interval - 1`` decode iterations, half of them on average:
    an iteration with a prompt ends the span) and the ``ahead`` iterations already scheduled, of mean
    length ``E[T]``.
    """
    t_bar = share * t_prompt + (1 - share) * t_decode
    residual = (share * t_prompt ** 2 + (1 - share) * t_decode ** 2) / (2 * t_bar)
    return residual + (recv_interval - 1) / 2 * t_decode + ahead * t_bar, residual
