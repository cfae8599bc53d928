"""Which HuggingFace ``config.json`` files apmw reads exactly, and the refusal of every other one.

:mod:`apmw.arch` turns a config into parameter, FLOP and KV-cache counts family by family. A
config of another family, or one carrying a field that family does not have, is not read as its
nearest look-alike: DeepSeek-V4 read as a DeepSeek-V3 relative came out as grouped-query attention
with every layer a 128-token window and 0 KV bytes per token. So a config is read only when

- its ``model_type`` is one of :data:`FAMILIES` (each checked against its published parameter
  counts in ``tests/test_arch.py``), or a family apmw knows it cannot model yet
  (:data:`NOT_YET`) is refused with what is missing; and
- every field is one apmw reads (:data:`READ`, and :data:`FAMILY_READ` for its family) or one known
  not to change the served model's parameters, compute or KV cache (:data:`NO_COST`,
  :data:`FAMILY_NO_COST`), with the values :data:`VALUES` allows.

Anything else is refused with the fields named (:class:`apmw.errors.ConfigError`).
"""

from __future__ import annotations

import reprlib
from typing import Any

# model_type -> what apmw reads it as (the wrapper and text model of multimodal configs both listed)
FAMILIES = {
    "llama": "Llama 2 / 3 (GQA, gated SiLU MLP)",
    "llama4": "Llama 4 (chunked attention, interleaved MoE)", "llama4_text": "Llama 4 text model",
    "mixtral": "Mixtral (GQA, sparse MoE)",
    "qwen3": "Qwen3 dense (GQA, QK norm)", "qwen3_moe": "Qwen3 MoE",
    "qwen3_5_moe": "Qwen3.5 MoE (Gated DeltaNet hybrid)", "qwen3_5_moe_text": "Qwen3.5 MoE text model",
    "deepseek_v3": "DeepSeek-V3 / R1 (MLA, MoE)", "kimi_k2": "Kimi K2 (DeepSeek-V3 layout)",
    "kimi_k25": "Kimi K2.5 (DeepSeek-V3 layout)",
    "glm_moe_dsa": "GLM-5 (MLA with DSA sparse attention, MoE)",
    "gpt_oss": "gpt-oss (alternating sliding window, MoE)",
    "minimax_m2": "MiniMax-M2 (GQA, MoE)",
    "deepseek_v4": "DeepSeek-V4 (compressed sparse attention with a local window, mHC, MoE with hash-routed layers)",
}

# model_type -> what apmw does not model in it yet
NOT_YET: dict[str, str] = {}

# fields apmw.arch reads for one family only: the same name in another family is not understood there
FAMILY_READ = {
    "deepseek_v4": frozenset("compress_ratios o_groups o_lora_rank hc_mult num_hash_layers expert_dtype".split()),
}

# fields that cost nothing for one family only: DeepSeek-V4's rotary base of the compressed layers,
# hyper-connections' Sinkhorn iterations and epsilon (numerics of hc_mult's mixing, counted there)
FAMILY_NO_COST = {
    "deepseek_v4": frozenset("compress_rope_theta hc_eps hc_sinkhorn_iters".split()),
}

# fields apmw.arch reads
READ = frozenset("""
    architectures attention_bias attention_chunk_size attn_output_gate decoder_sparse_step dtype experts_per_token
    first_k_dense_replace head_dim hidden_size index_head_dim index_n_heads index_topk interleave_moe_layer_step
    intermediate_size intermediate_size_mlp kv_lora_rank layer_types linear_conv_kernel_dim linear_key_head_dim
    linear_num_key_heads linear_num_value_heads linear_value_head_dim mamba_ssm_dtype max_position_embeddings
    max_window_layers mlp_bias mlp_only_layers model_type moe_intermediate_size moe_layer_freq moe_layers
    mtp_num_hidden_layers n_routed_experts n_shared_experts no_rope_layer_interval no_rope_layers num_attention_heads
    num_experts num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts num_mtp_modules
    num_nextn_predict_layers q_lora_rank qk_nope_head_dim qk_rope_head_dim shared_expert_intermediate_size
    shared_intermediate_size sliding_window text_config tie_word_embeddings topk_method torch_dtype use_routing_bias
    use_sliding_window v_head_dim vision_config
    vocab_size""".split())

NO_COST = frozenset(
    # transformers' PretrainedConfig and generation defaults: bookkeeping, ids, decoding settings
    """return_dict output_hidden_states output_attentions torchscript use_bfloat16 tf_legacy_loss pruned_heads
    chunk_size_feed_forward is_encoder_decoder is_decoder cross_attention_hidden_size add_cross_attention
    tie_encoder_decoder finetuning_task id2label label2id tokenizer_class prefix bos_token_id pad_token_id
    eos_token_id sep_token_id decoder_start_token_id task_specific_params problem_type max_length min_length
    do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k top_p typical_p
    repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids
    num_return_sequences output_scores return_dict_in_generate forced_bos_token_id forced_eos_token_id
    remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens _name_or_path
    transformers_version use_cache auto_map _source
    """
    # training only: initialisation, dropout, auxiliary losses, tensor-parallel pretraining split
    """initializer_range attention_dropout aux_loss_alpha router_aux_loss_coef seq_aux output_router_logits
    ignore_index pretraining_tp ep_size
    """
    # numerics with no count of their own: norms' epsilon, rotary settings, routing scores and groups,
    # activation clamps, the QK-norm and its kind (head_dim weights per layer, under 0.01 % of parameters)
    """rms_norm_eps rope_theta rope_scaling rope_parameters rope_interleave rotary_dim initial_context_length
    norm_topk_prob routed_scaling_factor scoring_func n_group topk_group swiglu_limit indexer_rope_interleave
    use_qk_norm qk_norm_type qk_head_dim full_attention_interval hidden_act qkv_bias quantization_config
    """
    # the multi-token-prediction head and vision tower, which apmw leaves out and says so in the notes
    """use_mtp mtp_transformer_layers mtp_use_dedicated_embeddings image_token_id video_token_id
    media_placeholder_token_id video_placeholder vision_start_token_id vision_end_token_id use_unified_vision_chunk
    """.split())

# fields read or passed over only with these values: apmw counts a gated SiLU MLP (three matrices) and no
# QKV bias beyond attention_bias
VALUES: dict[str, tuple[Any, ...]] = {"hidden_act": ("silu",), "qkv_bias": (False, None)}


def refusal(cfg: dict[str, Any], text: dict[str, Any]) -> str | None:
    """Why apmw will not read this config (``cfg`` the whole file, ``text`` its language model), or None."""
    model_type = str(text.get("model_type", cfg.get("model_type", "")))
    malformed = next((names for names in (cfg.get("architectures"), text.get("architectures"))
                      if names is not None and not _names(names)), None)
    if malformed is not None:
        return (f"'architectures' is {reprlib.repr(malformed)}; expected a list of model class names such as "
                '["LlamaForCausalLM"]. Fix the value in the config.json')
    family = ", ".join(cfg.get("architectures") or text.get("architectures") or ["?"])
    fields = set(cfg) | set(text)
    own = FAMILY_READ.get(model_type, frozenset()) | FAMILY_NO_COST.get(model_type, frozenset())
    unknown = sorted(str(f) for f in fields - READ - NO_COST - own)
    unread = f" (fields it does not read: {', '.join(unknown)})" if unknown else ""
    if model_type in NOT_YET:
        return (f"model_type '{model_type}' ({family}) is not modelled yet: {NOT_YET[model_type]}{unread}. "
                "apmw refuses it rather than read it as its nearest family")
    if not model_type:
        archs = "" if family == "?" else f" (architectures {family})"
        return (f"the config has no model_type{archs}{unread}: a HuggingFace config.json names its family "
                f"there; apmw reads {', '.join(sorted(FAMILIES))}. Pass the model's own config.json")
    if model_type not in FAMILIES:
        return (f"model_type '{model_type}' ({family}) is not a family apmw reads exactly "
                f"({', '.join(sorted(FAMILIES))}){unread}; it refuses it rather than read it as a look-alike")
    if unknown:
        return (f"field(s) apmw does not understand for model_type '{model_type}': {', '.join(unknown)}. They may "
                "change the parameters, compute or KV cache, so apmw refuses rather than guess; if you know they do "
                "not, delete them from a copy of config.json and give its path")
    for name, allowed in VALUES.items():
        value = text.get(name, cfg.get(name))
        if name in fields and value not in allowed:
            return (f"'{name}' is {reprlib.repr(value)}; apmw models only {', '.join(map(repr, allowed))} for it (a gated SiLU "
                    "MLP and no separate QKV bias)")
    return None


def _names(value: Any) -> bool:
    """Whether ``value`` is what ``architectures`` holds: a list of class names."""
    return isinstance(value, list) and all(isinstance(name, str) for name in value)
