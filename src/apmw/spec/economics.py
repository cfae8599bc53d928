"""The spec's ``power``, ``cost`` and ``fleet`` sections: what a replica draws, what it costs, and the
demand it serves."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from apmw.spec.section import FieldError, Section

# Bounds that keep every figure apmw derives finite, each far past anything real: a PUE of 10 (data
# centres run 1.1-2), 100 kW per GPU for its host or nameplate (an NVL72 rack is about 1.9 kW per GPU all
# in), $1,000 a kWh (retail power is well under $1) and $100,000 a GPU-hour (rentals are a few dollars).
MAX_PUE = 10.0
MAX_WATTS_PER_GPU = 1e5
MAX_USD_PER_KWH = 1e3
MAX_GPU_HOUR_USD = 1e5
# A busy GPU draws at least this: below it agents per MW run off to absurd figures (a datacentre GPU
# idles at 60-130 W; the smallest accelerators draw a few watts busy).
MIN_BUSY_WATTS = 1.0


class Power(Section):
    pue: float = Field(default=1.3, ge=1.0, le=MAX_PUE, description="facility / IT power")
    host_power_w_per_gpu: float = Field(
        default=125.0,
        ge=0, le=MAX_WATTS_PER_GPU,
        description="modelled draw of CPUs, DRAM, NICs and fans per GPU: 1.0 kW per 8-GPU node, checked against "
        "MLPerf node power (docs/accuracy.md)",
    )
    host_nameplate_w_per_gpu: float = Field(
        default=575.0,
        ge=0, le=MAX_WATTS_PER_GPU,
        description="host nameplate per GPU for provisioned power: (10.2 kW DGX H100 max - 8 x 700 W GPUs) / 8, "
        "NVIDIA DGX H100 datasheet",
    )
    provisioned_kw_per_gpu: float | None = Field(
        default=None, gt=0, le=MAX_WATTS_PER_GPU / 1e3, description="all-in facility kW budgeted per GPU (nameplate incl. host and cooling)"
    )
    gpu_idle_power_w: float | None = Field(default=None, ge=0, le=MAX_WATTS_PER_GPU, description="overrides the catalogue")
    gpu_busy_power_w: float | None = Field(default=None, ge=MIN_BUSY_WATTS, le=MAX_WATTS_PER_GPU,
                                           description="overrides the catalogue")


class ApiPrice(Section):
    """A per-token API's list price, to set a self-served task against: USD per million tokens."""

    input: float = Field(ge=0, le=1e4, description="USD per million prompt tokens that miss the API's cache")
    cached_input: float | None = Field(default=None, ge=0, le=1e4,
                                       description="USD per million prompt tokens read from its cache (default: input)")
    output: float = Field(ge=0, le=1e4, description="USD per million output tokens")

    @model_validator(mode="after")
    def _cache_not_dearer(self) -> "ApiPrice":
        if self.cached_input is not None and self.cached_input > self.input:
            raise FieldError("cached_input", f"{self.cached_input:g} is above input ({self.input:g}): an API prices "
                             "the prompt tokens it reads from its cache at or below the others; check that the two "
                             "are not swapped")
        return self


# Hours in a year of 365.25 days: what a capex is amortised over, year by year.
HOURS_PER_YEAR = 365.25 * 24
# Tasks an hour of fleet.tasks_per_hour may start: a billion, far past any fleet's (each is a sampled session).
MAX_TASKS_PER_HOUR = 1e9


# A purchase amortised over less than a month is a unit slip (months or days given as years), not a plan.
MIN_CAPEX_YEARS = 1 / 12


class Capex(Section):
    """The price of owning the GPUs, paid once and amortised straight-line over ``years``: per GPU, or per
    system (a node or rack: its price over the GPUs in it)."""

    usd_per_gpu: float | None = Field(default=None, gt=0, le=1e7, description="purchase price of one GPU, its "
                                      "share of the host and network included")
    usd_per_system: float | None = Field(default=None, gt=0, le=1e10, description="purchase price of one system "
                                         "(an HGX node, an NVL72 rack), with gpus_per_system")
    gpus_per_system: int | None = Field(default=None, ge=1, le=100_000, description="GPUs in that system")
    years: float = Field(gt=0, le=30, description="years the purchase is amortised over (straight line; at least "
                         "a month, 1/12)")

    @model_validator(mode="after")
    def _one_price(self) -> "Capex":
        if self.years < MIN_CAPEX_YEARS:
            raise FieldError("years", f"{self.years:g} years is under a month: a purchase is amortised over years "
                             "(3 to 6 for GPUs); give the period in years (18 months is 1.5)")
        if (self.usd_per_gpu is None) == (self.usd_per_system is None):
            raise ValueError("give either usd_per_gpu or usd_per_system (with gpus_per_system), not "
                             + ("both" if self.usd_per_gpu is not None else "neither"))
        if (self.usd_per_system is None) != (self.gpus_per_system is None):
            raise ValueError("usd_per_system and gpus_per_system go together: the system's price and the GPUs in it")
        return self

    @property
    def per_gpu_usd(self) -> float:
        if self.usd_per_gpu is not None:
            return self.usd_per_gpu
        assert self.usd_per_system is not None and self.gpus_per_system is not None     # _one_price
        return self.usd_per_system / self.gpus_per_system

    @property
    def gpu_hour_usd(self) -> float:
        """One GPU's purchase spread over every hour of its amortisation."""
        return self.per_gpu_usd / (self.years * HOURS_PER_YEAR)


class Cost(Section):
    """Prices have no defaults: they differ by site and contract, and a silent guess would be a wrong answer."""

    electricity_usd_per_kwh: float = Field(ge=0, le=MAX_USD_PER_KWH)
    gpu_hour_usd: float = Field(ge=0, le=MAX_GPU_HOUR_USD, description="price of one GPU-hour as billed (rental, or all-in owned); "
                                "required unless capex is given, which then sets it to the amortised purchase alone")
    capex: Capex | None = Field(default=None, description="the purchase price of the GPUs and the years it is "
                                "amortised over: the owned fleet's cost beside the hourly price (apmw fleet)")
    api_usd_per_million_tokens: ApiPrice | None = Field(
        default=None, description="the API the fleet would replace, for $ per task against it")

    @model_validator(mode="before")
    @classmethod
    def _hourly_from_capex(cls, data: object) -> object:
        """Without an hourly price, a GPU-hour costs its amortised purchase (capex's own errors are its field's)."""
        if not isinstance(data, dict) or data.get("gpu_hour_usd") is not None:
            return data
        if data.get("capex") is None:
            raise ValueError("give gpu_hour_usd (the price of one GPU-hour as billed) or capex ({usd_per_gpu, years}: "
                             "the purchase, amortised), or both")
        try:
            capex = Capex.model_validate(data["capex"])
        except ValidationError:     # capex's own error is reported; no hourly price is missing beside it
            return {**data, "gpu_hour_usd": 0.0}
        return {**data, "gpu_hour_usd": capex.gpu_hour_usd}


class Fleet(Section):
    """The fleet the replicas make up: a constant concurrency (``target_agents``), or a day of
    demand (``tasks_per_hour``, 24 values from hour 0) that ``apmw fleet`` turns into replicas,
    megawatts and dollars hour by hour."""

    target_agents: int | None = Field(
        default=None, ge=1, le=10**9, description="concurrent agents the fleet serves (at most a billion: past "
        "that the figure is a typo)")
    tasks_per_hour: list[float] | None = Field(
        default=None,
        description="tasks started in each hour, hour 0 first: a day (24 values) or a week from Monday 00:00 "
        "(168 values), each 0 to a billion; the period repeats")
    headroom: float = Field(default=0.0, ge=0, le=10, description="spare share of capacity kept above the demand "
                            "(0.1: replicas for 10 % more agents than the hour needs)")
    min_replicas: int = Field(default=1, ge=0, le=10**6, description="replicas kept up in the quietest hour")
    power_cap_mw: float | None = Field(default=None, gt=0, le=1e4, description="the hall's power: the fleet's "
                                       "provisioned (nameplate) facility power must fit in it every hour")
    scale_up_s: float = Field(default=0.0, ge=0, le=3600, description="from starting a replica to its serving "
                              "(provisioning, weight load, warm-up): replicas for the next hour start this early")
    scale_down_delay_s: float = Field(default=0.0, ge=0, le=86400, description="a replica no longer needed stays up "
                                      "this long (hysteresis)")
    routing: Literal["affinity", "least_loaded", "random"] = Field(
        default="affinity", description="how a router spreads each agent's calls over the replicas: affinity "
        "(every call of a task to the replica that holds its context: sticky sessions, KV-aware routers), "
        "least_loaded or random (a call finds its own context only where it lands on the replica that holds it; "
        "docs/fleet.md, Routing)")
    routing_replicas: int | None = Field(
        default=None, ge=1, le=10**6, description="replicas a least_loaded or random router spreads calls over, "
        "for apmw plan (apmw fleet uses the day's peak replica count); unset: 1 for apmw plan")

    @field_validator("tasks_per_hour")
    @classmethod
    def _rates_are_counts(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and len(v) not in (24, 168):
            raise ValueError(f"{len(v)} values; give 24 (a day, hour 0 first) or 168 (a week from Monday 00:00)")
        if v is not None:
            bad = [i for i, x in enumerate(v) if not 0 <= x <= MAX_TASKS_PER_HOUR]
            if bad:
                raise FieldError((bad[0],), f"{v[bad[0]]:g} tasks in hour {bad[0]}; each hour needs 0 to {MAX_TASKS_PER_HOUR:,.0f} tasks")
        return v
