"""Model architecture from a HuggingFace ``config.json``: parameters, bytes, KV, FLOPs.

The planner needs four numbers per model (MODEL.md section 3): weight bytes (what must
fit), active weight bytes (what a decode step reads), KV bytes per token of context
(what limits concurrency) and FLOPs per token (what limits prefill). They are counted
here from the config, layer by layer, so that MoE, MLA, sliding-window and hybrid
linear-attention models each get their own memory and traffic shape.

Supported config families (the bundled ones): Llama 3.x (GQA), Llama 4 (interleaved
MoE + shared expert, chunked local attention), Qwen3 dense/MoE, Qwen3.5 (Gated DeltaNet
hybrid, nested ``text_config``), Mixtral, MiniMax-M2, gpt-oss (sliding/full layers),
DeepSeek-V3/R1 and Kimi-K2 (MLA), GLM-5 (MLA + DeepSeek sparse-attention indexer),
DeepSeek-V4 (compressed attention: per-layer compression ratios, a top-k indexer on the
ratio-4 layers, a 128-token local window per sequence; mHC; hash-routed layers), whose
shapes follow DeepSeek's reference ``inference/model.py`` (docs/models.md).

Deliberately ignored, because serving memory and time barely depend on them or because
they are not part of the served text model:
  * vision towers / multimodal projectors (``vision_config``);
  * multi-token-prediction (MTP) layers (``num_nextn_predict_layers``,
    ``mtp_num_hidden_layers``, ``num_mtp_modules``): DeepSeek-V3's 671B excludes its
    14B MTP module; drafting with it is priced and held in memory apart
    (``Architecture.mtp_module_bytes``, :mod:`apmw.perf.speculative`);
  * q/k-norm weights, attention sinks (gpt-oss: one scalar per head), rotary tables:
    each below 0.01 % of parameters.
Every MLP and expert is assumed gated (SwiGLU: gate, up, down), true for all of them.

Modules, one concept each: ``dtypes`` (dtype names, stored bytes per weight and KV element),
``config`` (the config reader, layer kinds, what is ignored), ``attention`` (GQA/MHA, MLA, the
DSA indexer), ``compressed_attention`` (DeepSeek-V4), ``linear_attention`` (Gated DeltaNet),
``ffn`` (dense MLP, MoE, shared experts, embeddings), ``architecture`` (the Architecture and
its summary) and ``from_config`` (putting them together from a config.json).
"""

from __future__ import annotations

from apmw.arch.architecture import Architecture, summary
from apmw.arch.dtypes import canonical_dtype, weight_storage_bytes
from apmw.arch.from_config import architecture_from_config, load_architecture
from apmw.catalog.models import load_config  # bench/predict_speed.py reads the config through here

__all__ = ["Architecture", "architecture_from_config", "canonical_dtype", "load_architecture", "load_config",
           "summary", "weight_storage_bytes"]
