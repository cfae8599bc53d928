"""Speculative decoding on one replica: the tokens one iteration yields and what the draft costs.

A draft proposes ``k`` tokens; the target verifies them with the next one in a single iteration
that processes ``k + 1`` tokens per sequence. Each proposed token is accepted with probability
``a``, independently (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"), so one iteration yields ``(1 - a^(k+1)) / (1 - a)`` tokens per sequence.

Two drafts (``serving.speculative.draft``):

- ``model``: a separate draft (a small model, n-gram, EAGLE), whose ``k`` and ``a`` the user gives;
  its cost defaults to :data:`DRAFT_MODEL_COST_FRACTION` of an iteration. Where the user names the
  draft model (``draft_model``), its cost is ``k`` of its decode passes, each its active weight bytes over
  the target's (:func:`draft_model_cost_fraction`), and its weights and KV take memory
  (:func:`draft_memory`).
- ``mtp``: the served model's own multi-token-prediction modules. ``k`` defaults to the number of
  modules, ``a`` to :data:`MTP_ACCEPTANCE_RATE`, and the cost is that of running one module per
  draft token: a transformer layer plus the shared output head (:func:`mtp_draft_cost_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from apmw.arch import Architecture, load_architecture
from apmw.errors import ApmwError
from apmw.perf.step import StepModel
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
    # MTP modules the replica holds beside the model (their weights and KV take memory: draft_memory)
    held_mtp_modules: int = 0
    # the separate draft model where the spec names it, and the dtype its checkpoint stores
    draft_arch: Architecture | None = None
    draft_weight_dtype: str = "bf16"

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


def draft_model_cost_fraction(draft: Architecture, draft_dtype: str, target: Architecture, weight_dtype: str,
                              expert_dtype: str | None, draft_tokens: int) -> float:
    """``k`` decode passes of a separate draft model, each priced as its active weight bytes over the target's:
    a decode step streams weights, so its time goes with the bytes it reads (ASSUMPTION, as for MTP; the
    draft's KV reads and its kernel launches are left out)."""
    return draft_tokens * draft.active_weight_bytes(draft_dtype) / target.active_weight_bytes(weight_dtype, expert_dtype)


def _draft_model(name: str, target: Architecture) -> tuple[Architecture, str]:
    """The named draft model's architecture and the dtype its checkpoint stores (its name's or its config's
    ``quantization_config``, else bf16), refused where it cannot draft for ``target``."""
    from apmw.catalog.models import checkpoint_weight_dtype, config_weight_dtype

    field = "serving.speculative.draft_model"
    try:
        draft = load_architecture(name)
    except ApmwError as exc:
        raise ApmwError(f"{field}: {exc}") from None
    if draft.vocab_size != target.vocab_size:
        raise ApmwError(f"{field}: {draft.name} has a vocabulary of {draft.vocab_size:,} tokens and {target.name} "
                        f"one of {target.vocab_size:,}; a draft proposes the target's tokens, so it must share its "
                        "vocabulary")
    return draft, checkpoint_weight_dtype(name) or config_weight_dtype(name) or "bf16"


def draft_memory(sd: SpeculativeDecoding | None, step: StepModel) -> tuple[float, float]:
    """(weight bytes the replica holds for the draft, the KV bytes a token costs the draft, in the target's
    units: over the target's KV replication). The engines cache the draft's KV in as many tokens as the
    target's (apmw.perf.memory). A separate draft model runs at the target's tensor parallelism (vLLM's and
    SGLang's default), so it is placed on a plain tensor-parallel replica only."""
    if sd is None:
        return 0.0, 0.0
    if sd.held_mtp_modules:
        m = sd.held_mtp_modules
        return m * step.held_mtp_module_bytes, m * step.arch.mtp_kv_bytes_per_token(step.kv_dtype)
    draft = sd.draft_arch
    if draft is None:
        return 0.0, 0.0
    lay = step.parallel
    if not lay.is_tensor_parallel:
        raise ApmwError(f"serving.speculative.draft_model: apmw places a separate draft model on a tensor-parallel "
                        f"replica only (the engines run it at the target's tensor parallelism), and this one is laid "
                        f"out as {lay.describe()}; leave draft_model out to price the draft by draft_cost_fraction")
    if draft.num_heads % lay.tp:
        raise ApmwError(f"serving.speculative.draft_model: {draft.name}'s {draft.num_heads} attention heads do not "
                        f"divide over the target's tensor parallelism of {lay.tp}, at which the engines run the draft")
    per_token = draft.kv_bytes_per_token(step.kv_dtype) * lay.kv_replication(draft) / step.kv_replication
    return draft.weight_bytes(sd.draft_weight_dtype), per_token


def speculative_decoding(spec: Speculative | None, arch: Architecture, weight_dtype: str = "bf16",
                         expert_dtype: str | None = None) -> SpeculativeDecoding | None:
    """The figures of ``serving.speculative`` for ``arch`` served in ``weight_dtype`` (``expert_dtype`` for its
    routed experts), or None without speculative decoding."""
    if spec is None:
        return None
    if spec.draft == "model":
        assert spec.draft_tokens is not None and spec.acceptance_rate is not None   # the spec requires them
        if spec.draft_model is None:
            cost = DRAFT_MODEL_COST_FRACTION if spec.draft_cost_fraction is None else spec.draft_cost_fraction
            return SpeculativeDecoding(spec.draft_tokens, spec.acceptance_rate, cost)
        draft, dtype = _draft_model(spec.draft_model, arch)
        cost = (draft_model_cost_fraction(draft, dtype, arch, weight_dtype, expert_dtype, spec.draft_tokens)
                if spec.draft_cost_fraction is None else spec.draft_cost_fraction)
        return SpeculativeDecoding(spec.draft_tokens, spec.acceptance_rate, cost, draft_arch=draft,
                                   draft_weight_dtype=dtype)
    if arch.mtp_modules < 1:
        raise ApmwError(f"serving.speculative: draft: mtp needs a model with a multi-token-prediction head, and "
                        f"{arch.name} has none (num_nextn_predict_layers is 0); give draft: model with its "
                        "draft_tokens and acceptance_rate instead")
    k = spec.draft_tokens or arch.mtp_modules
    a = MTP_ACCEPTANCE_RATE if spec.acceptance_rate is None else spec.acceptance_rate
    cost = mtp_draft_cost_fraction(arch, k) if spec.draft_cost_fraction is None else spec.draft_cost_fraction
    # the engines load every module the checkpoint ships, however many tokens are drafted with them
    return SpeculativeDecoding(k, a, cost, held_mtp_modules=arch.mtp_modules)
