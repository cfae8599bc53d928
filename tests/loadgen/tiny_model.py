"""Write a tiny Llama-architecture GGUF (random weights) and its HF config.json.

Nothing can be downloaded from a model hub in CI, so the tests make their own
model: 2 layers, a SentencePiece-style vocabulary of byte tokens plus a few
hundred whole words (so that ``" word"`` is one token and prompt lengths are easy
to hit), random weights from a fixed seed. The weights are meaningless; the
server still runs the full llama.cpp compute graph for every token, which is
what a load test measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# Shape of the tiny model. Small enough to load in well under a second and to
# decode thousands of tokens/s on two CPU cores; big enough that a batch of
# requests costs measurably more than one.
N_LAYERS = 4
N_EMBD = 512
N_HEADS = 8
N_KV_HEADS = 4
N_FF = 1536
N_CTX = 4096
N_WORDS = 240          # whole-word tokens (each with every prefix in the vocabulary, as SentencePiece merges need)

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
FIRST_WORD_TOKEN = 3 + 256 + 1        # after <unk> <s> </s>, 256 byte tokens and "▁"


def vocabulary_words() -> list[str]:
    """Deterministic distinct lower-case words of 2-3 letters (one token each)."""
    words = []
    for a in _LETTERS:
        for b in "aeiou":
            words.append(a + b)
            if len(words) >= N_WORDS:
                return words
        for b in "aeiou":
            words.append(a + b + "n")
            if len(words) >= N_WORDS:
                return words
    return words


def _tokens() -> tuple[list[str], list[float], list[int]]:
    import gguf

    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [
        gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        toks.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    toks.append("\u2581")                     # the SentencePiece space on its own
    scores.append(-1.0)
    types.append(gguf.TokenType.NORMAL)
    # SentencePiece (llama.cpp's "llama" tokenizer) merges adjacent pieces only when the merged
    # piece is in the vocabulary, so every prefix of a word must be a token: "▁b", "▁ba", "▁ban".
    for i, w in enumerate(_LETTERS):
        toks.append("\u2581" + w)
        scores.append(-1.5)
        types.append(gguf.TokenType.NORMAL)
    for i, w in enumerate(vocabulary_words()):
        toks.append("\u2581" + w)             # "▁word": a word with its leading space
        scores.append(-2.0 - i * 1e-3)
        types.append(gguf.TokenType.NORMAL)
    return toks, scores, [int(t) for t in types]


def write_tiny_llama(directory: Path, seed: int = 0, weights: str = "q8_0") -> tuple[Path, Path]:
    """Write ``tiny-llama.gguf`` and ``config.json`` into ``directory``; return both paths.

    ``weights`` is ``"q8_0"`` (8-bit blocks; llama.cpp's CPU kernels batch these well, so
    concurrent sequences share each weight read as on a GPU) or ``"f16"``.
    """
    import gguf
    from gguf import quants

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tiny-llama.gguf"
    toks, scores, types = _tokens()
    n_vocab = len(toks)
    head_dim = N_EMBD // N_HEADS
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("apmw-tiny-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV_HEADS)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if weights == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    rng = np.random.default_rng(seed)

    def put(name: str, a: np.ndarray) -> None:
        if weights == "q8_0":
            w.add_tensor(name, quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a.astype(np.float16))

    def t(name: str, *shape: int) -> None:
        put(name, rng.standard_normal(shape) * 0.05)

    t("token_embd.weight", n_vocab, N_EMBD)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    # Output rows: zero for control and byte tokens, large for word tokens, so that sampling
    # almost always picks whole words (a byte token alone is invalid UTF-8, which the server
    # holds back and which would blur the time-to-first-token measurement).
    out = rng.standard_normal((n_vocab, N_EMBD)) * 0.5
    out[: FIRST_WORD_TOKEN] = 0.0
    put("output.weight", out)
    for i in range(N_LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_k.weight", N_KV_HEADS * head_dim, N_EMBD)
        t(f"blk.{i}.attn_v.weight", N_KV_HEADS * head_dim, N_EMBD)
        t(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "_name_or_path": "apmw-tiny-llama",
        "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS, "num_key_value_heads": N_KV_HEADS, "head_dim": head_dim,
        "vocab_size": n_vocab, "max_position_embeddings": N_CTX, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "int8" if weights == "q8_0" else "float16",
    }
    cfg = directory / "config.json"
    cfg.write_text(json.dumps(config, indent=2))
    return path, cfg
