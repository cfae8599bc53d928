"""Quantities that vary from call to call or session to session.

A workload field takes either a plain number (a constant) or a distribution:

* ``{mean: 226, p95: 780}`` -- a lognormal with that mean and 95th percentile;
* ``{p50: 118, p95: 780}`` -- a lognormal with that median and 95th percentile;
* ``{quantiles: {0.5: 118, 0.9: 400, 0.95: 780, 0.99: 1500}}`` -- an empirical
  distribution, piecewise linear in the quantile function between the given
  points (``apmw fit`` writes this form from a trace).

Lognormals are the usual fit for token counts and tool latencies (heavy right
tail, positive support). Every distribution samples with a caller-supplied
``numpy.random.Generator`` so that a seed fixes the output.
"""

from __future__ import annotations

import math
from typing import Annotated, Union

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from apmw.spec.section import FieldError, named_field, refuse_yes_or_no

# z-score of the 95th percentile of a standard normal (scipy.stats.norm.ppf(0.95)).
Z95 = 1.6448536269514722


class Constant(BaseModel):
    """A quantity with no variation."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_yes_or_no(cls, data: object) -> object:
        return refuse_yes_or_no(data)

    value: float = Field(ge=0)

    @model_serializer
    def _as_written(self) -> float:
        """A constant is written as its number, as a spec gives it, so a dumped spec loads again."""
        return self.value

    @property
    def mean(self) -> float:
        return self.value

    def quantile(self, q: float) -> float:
        return self.value

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return np.full(size, self.value, dtype=float)

    def at(self, u: np.ndarray) -> np.ndarray:
        """The quantile function at each of ``u``."""
        return np.full(np.shape(u), self.value, dtype=float)

    def scaled(self, factor: float) -> "Constant":
        """The same quantity multiplied by ``factor`` (used by elasticities and levers)."""
        return Constant(value=self.value * factor)


# The widest lognormal modelled: sigma 10 puts the p95 14 million times the median (the bundled
# traces' widest, tool waits, are about 4x) and keeps its mean, exp(mu + sigma^2 / 2), a finite
# number (a sigma of 40 overflows it).
MAX_LOG_SPREAD = 10.0


class Lognormal(BaseModel):
    """A lognormal given by its mean (or median) and its 95th percentile."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_yes_or_no(cls, data: object) -> object:
        return refuse_yes_or_no(data)

    mean_: float | None = Field(default=None, alias="mean", gt=0)
    p50: float | None = Field(default=None, gt=0)
    p95: float = Field(gt=0)

    @model_validator(mode="after")
    def _one_centre(self) -> "Lognormal":
        if (self.mean_ is None) == (self.p50 is None):
            raise ValueError("give exactly one of 'mean' or 'p50' together with 'p95'")
        centre = self.mean_ if self.mean_ is not None else self.p50
        if self.p95 < centre:
            raise ValueError(
                f"p95 ({self.p95:g}) is below the {'mean' if self.mean_ else 'p50'} ({centre:g}); "
                "a right-skewed quantity has p95 above its centre -- check the numbers, or use a constant"
            )
        if self.mean_ is not None and math.log(self.p95 / self.mean_) > Z95**2 / 2:
            raise ValueError(
                f"p95/mean = {self.p95 / self.mean_:.2f} exceeds {math.exp(Z95**2 / 2):.2f}, the largest ratio a "
                "lognormal reaches; give 'p50' and 'p95' instead, or a 'quantiles' table"
            )
        if self.sigma > MAX_LOG_SPREAD:
            raise ValueError(
                f"p95 is {self.p95 / centre:.3g} times the {'mean' if self.mean_ else 'p50'}: a lognormal that wide "
                f"(sigma {self.sigma:.1f}) has a mean and tail no measured workload shows; at most p95/p50 = "
                f"{math.exp(MAX_LOG_SPREAD * Z95):.2g} is modelled (give a 'quantiles' table for a bounded tail)"
            )
        return self

    @property
    def sigma(self) -> float:
        if self.p50 is not None:
            return math.log(self.p95 / self.p50) / Z95
        # ln(p95/mean) = Z95*s - s^2/2; take the smaller root (the less dispersed fit).
        r = math.log(self.p95 / self.mean_)
        return Z95 - math.sqrt(Z95**2 - 2 * r)

    @property
    def mu(self) -> float:
        if self.p50 is not None:
            return math.log(self.p50)
        return math.log(self.mean_) - self.sigma**2 / 2

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)

    def quantile(self, q: float) -> float:
        return float(self.at(np.asarray(q, dtype=float)))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size)

    def at(self, u: np.ndarray) -> np.ndarray:
        """The quantile function at each of ``u`` (0 at ``u`` = 0)."""
        from scipy.special import ndtri

        return np.exp(self.mu + self.sigma * ndtri(u))

    def scaled(self, factor: float) -> "Lognormal":
        centre = {"mean": self.mean_ * factor} if self.mean_ is not None else {"p50": self.p50 * factor}
        return Lognormal.model_validate({**centre, "p95": self.p95 * factor})


class Empirical(BaseModel):
    """An empirical quantile function: ``{quantile: value}`` points, linear between them.

    Below the lowest given quantile the value of that quantile is used, above the
    highest the value of the highest (no extrapolation into the tail).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_yes_or_no(cls, data: object) -> object:
        return refuse_yes_or_no(data)

    quantiles: dict[float, float]

    @field_validator("quantiles", mode="before")
    @classmethod
    def _each_quantile_once(cls, v: object) -> object:
        """Keys are read as numbers, so 0.5 and '0.5' would become one point silently."""
        if isinstance(v, dict):
            seen: dict[float, object] = {}
            for key in v:
                try:
                    q = float(key)
                except (TypeError, ValueError):
                    continue        # pydantic names a key that is not a number
                if q in seen:
                    raise ValueError(f"quantile {q:g} is given twice (as {seen[q]!r} and {key!r}): keep one")
                seen[q] = key
        return v

    @field_validator("quantiles")
    @classmethod
    def _ordered(cls, v: dict[float, float]) -> dict[float, float]:
        if len(v) < 2:
            raise ValueError("give at least two quantile points, e.g. {0.5: 100, 0.95: 400}")
        qs = sorted(v)
        if qs[0] < 0 or qs[-1] > 1:
            raise ValueError("quantile keys must lie in [0, 1]")
        vals = [v[q] for q in qs]
        if any(x < 0 for x in vals):
            raise ValueError("quantile values must be >= 0")
        if any(b < a for a, b in zip(vals, vals[1:])):
            raise ValueError("quantile values must not decrease as the quantile rises")
        return {q: v[q] for q in qs}

    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(list(self.quantiles)), np.array(list(self.quantiles.values()))

    @property
    def mean(self) -> float:
        """The integral of the quantile function over (0, 1): flat below the first quantile and above the last
        (as ``at`` holds them), linear between, so every step counts by its width, however narrow."""
        qs, vals = self._points()
        between = float(np.sum(np.diff(qs) * (vals[1:] + vals[:-1]) / 2))
        return float(qs[0] * vals[0] + between + (1 - qs[-1]) * vals[-1])

    def quantile(self, q: float) -> float:
        return float(self.at(np.asarray(q, dtype=float)))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return self.at(rng.random(size))

    def at(self, u: np.ndarray) -> np.ndarray:
        """The quantile function at each of ``u``."""
        qs, vals = self._points()
        return np.interp(u, qs, vals)

    def scaled(self, factor: float) -> "Empirical":
        return Empirical(quantiles={q: v * factor for q, v in self.quantiles.items()})


# A lognormal has no largest value; the planner and the simulator draw up to about a million values of one, so
# this quantile stands for the largest a run meets.
ONE_IN_A_RUN = 1.0 - 1e-6


def reach(d: "Constant | Lognormal | Empirical") -> float:
    """The largest value a run draws from ``d``: a constant's value, an empirical table's top point, a lognormal's
    one-in-a-million quantile (:data:`ONE_IN_A_RUN`)."""
    if isinstance(d, Empirical):
        return float(max(d.quantiles.values()))
    return d.quantile(ONE_IN_A_RUN) if isinstance(d, Lognormal) else d.mean


def sample_whole(d: "Constant | Lognormal | Empirical", rng: np.random.Generator, size: int,
                 minimum: int = 0) -> np.ndarray:
    """Whole counts (steps, calls, tokens) drawn from ``d``, at least ``minimum``: each draw rounded to the nearest
    whole number, except that a fixed value between two whole numbers is each of them as often as keeps its
    mean (2.5 steps: 2 or 3, half the time each), where rounding would change it."""
    if _between_wholes(d):
        return whole_at(d, rng.random(size), minimum)
    return np.maximum(np.rint(d.sample(rng, size)), minimum).astype(np.int64)


def _between_wholes(d: "Constant | Lognormal | Empirical") -> bool:
    return isinstance(d, Constant) and d.value != np.floor(d.value)


def stratified_uniforms(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` uniforms on (0, 1), the midpoint of each of ``size`` equal strata, in random order: median Latin
    hypercube sampling of one variable (McKay, Beckman and Conover, Technometrics 21(2), 1979, with each stratum
    at its midpoint). The values they give follow the distribution, and unlike independent draws they cover its
    quantiles evenly: a sample's mean and tails do not move with the seed, which only pairs the quantities
    differently. A heavy tail is where that counts: independent draws meet the top of a prompt-length table in
    some samples and not others, and the planner's TTFT p95 reads the queue those long prompts build (support-chat's
    analytic N* ran from 12 to 20 agents over ten seeds; ``bench/README.md``, plan_speed). A draw at random inside
    each stratum would be unbiased, but its top stratum still reaches past one in a million now and then (seed 0
    put one task of 3,001 at 226 steps where the p95 is 40), and that one task moved a plan's KV overflow two-fold;
    the midpoints leave out the top half-stratum instead (the mean of a lognormal of p95/median 4 over 1,000
    midpoints is 0.1 % under its own)."""
    return (rng.permutation(size) + 0.5) / size


def whole_at(d: "Constant | Lognormal | Empirical", u: np.ndarray, minimum: int = 0) -> np.ndarray:
    """Whole counts from ``d`` at the uniforms ``u``, as :func:`sample_whole` makes them from its own draws."""
    if _between_wholes(d):
        low = np.floor(d.value)
        x = low + (u < d.value - low)
    else:
        x = np.rint(d.at(u))
    return np.maximum(x, minimum).astype(np.int64)


def parse_distribution(v: object) -> Constant | Lognormal | Empirical:
    """Turn what a user wrote into a distribution, with a message that says how to fix it."""
    if isinstance(v, (Constant, Lognormal, Empirical)):
        return v
    if isinstance(v, bool) or v is None:
        raise ValueError(f"expected a number or a distribution such as {{mean: 200, p95: 800}}, got {v!r}")
    if isinstance(v, (int, float)):
        if v < 0:
            raise ValueError(f"must be >= 0, got {v:g}")
        return Constant(value=v)
    if not isinstance(v, dict):
        raise ValueError(f"expected a number or a mapping such as {{mean: 200, p95: 800}}, got {type(v).__name__}")
    kind = Empirical if "quantiles" in v else Lognormal
    try:
        return kind.model_validate(v)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        raise FieldError(tuple(first["loc"]) + named_field(first),
                         f"{msg} (forms: a number, {{mean: .., p95: ..}}, {{p50: .., p95: ..}}, or "
                         "{quantiles: {0.5: .., 0.95: ..}})") from None


Distribution = Annotated[Union[Constant, Lognormal, Empirical], BeforeValidator(parse_distribution)]
"""A number, ``{mean|p50, p95}`` or ``{quantiles: {...}}``."""
