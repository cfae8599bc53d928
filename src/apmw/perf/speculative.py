"""Speculative decoding on one replica: the tokens one iteration yields and what the draft costs.

A draft proposes ``k`` tokens; the target verifies them with the next one in a single iteration
that processes ``k + 1`` tokens per sequence. Each proposed token is accepted with probability
``a``, independently (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"), so one iteration yields ``(1 - a^(k+1)) / (1 - a)`` tokens per sequence.

Two drafts (``serving.speculative.draft``):

- ``model``: a separate draft (a small model, n-gram, EAGLE), whose ``k`` and ``a`` the user gives;
  its cost defaults to :data:`DRAFT_MODEL_COST_FRACTION` of an iteration.
- ``mtp``: the served model's own multi-token-prediction modules. ``k`` defaults to the number of
  modules, ``a`` to :data:`MTP_ACCEPTANCE_RATE`, and the cost is that of running one module per
  draft token: a transformer layer plus the shared output head (:func:`mtp_draft_cost_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from apmw.arch import Architecture
from apmw.errors import ApmwError
from apmw.spec.serving import Speculative

# ASSUMPTION, apmw's long-standing default: a small draft model's pass costs a tenth of the target's iteration.
DRAFT_MODEL_COST_FRACTION = 0.1
# DeepSeek-V3 Technical Report (arXiv 2412.19437), section 5.4.3: the acceptance rate of the second
# token predicted by its MTP module "ranges between 85% and 90%"; the low end is taken.
MTP_ACCEPTANCE_RATE = 0.85


@dataclass(frozen=True)
class SpeculativeDecoding:
    draft_tokens: int
    acceptance_rate: float
    draft_cost_fraction: float      # draft time per iteration / the target's iteration time
    # MTP modules the replica holds beside the model (their weights and KV take memory,
    # apmw.perf.replica.replica_memory); 0 for a separate draft model, which apmw does not know
    held_mtp_modules: int = 0

    @property
    def verified_tokens(self) -> int:
        """Tokens a decoding sequence runs through the target per iteration: its pending one and the drafts."""
        return self.draft_tokens + 1

    @property
    def time_factor(self) -> float:
        """What the draft multiplies an iteration's time by."""
        return 1.0 + self.draft_cost_fraction

    @property
    def tokens_per_iteration(self) -> float:
        a, k = self.acceptance_rate, self.draft_tokens
        return (1 - a ** (k + 1)) / (1 - a)


def mtp_draft_cost_fraction(arch: Architecture, draft_tokens: int) -> float:
    """One MTP module per draft token, priced as its share of the target's active parameters: a
    decode iteration streams weights, so its time goes with the bytes it reads (ASSUMPTION: the
    module's extra projection, 2 x hidden^2, is left out; DeepSeek-V3's is 0.3 % of its active
    parameters)."""
    head = arch.vocab_size * arch.hidden_size
    per_layer = (arch.active_params - head - arch.embedding_params) / arch.num_layers
    return draft_tokens * (per_layer + head) / arch.active_params


def speculative_decoding(spec: Speculative | None, arch: Architecture) -> SpeculativeDecoding | None:
    """The figures of ``serving.speculative`` for ``arch``, or None without speculative decoding."""
    if spec is None:
        return None
    if spec.draft == "model":
        assert spec.draft_tokens is not None and spec.acceptance_rate is not None   # the spec requires them
        cost = DRAFT_MODEL_COST_FRACTION if spec.draft_cost_fraction is None else spec.draft_cost_fraction
        return SpeculativeDecoding(spec.draft_tokens, spec.acceptance_rate, cost)
    if arch.mtp_modules < 1:
        raise ApmwError(f"serving.speculative: draft: mtp needs a model with a multi-token-prediction head, and "
                        f"{arch.name} has none (num_nextn_predict_layers is 0); give draft: model with its "
                        "draft_tokens and acceptance_rate instead")
    k = spec.draft_tokens or arch.mtp_modules
    a = MTP_ACCEPTANCE_RATE if spec.acceptance_rate is None else spec.acceptance_rate
    cost = mtp_draft_cost_fraction(arch, k) if spec.draft_cost_fraction is None else spec.draft_cost_fraction
    # the engines load every module the checkpoint ships, however many tokens are drafted with them
    return SpeculativeDecoding(k, a, cost, held_mtp_modules=arch.mtp_modules)
