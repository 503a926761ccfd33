"""Small GGUF files in the real layout for tests: Transformers' Qwen2 names as GGUF's, and the embedded model's
BPE tokenizer cut to a small vocabulary."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# where each GGML block format keeps its fp16 scales: random bytes there would make NaNs and infinities
SCALE_HALVES = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}

# Transformers' names -> GGUF's, per layer (Qwen2: biases on q, k, v; no rotary permutation, unlike Llama)
QWEN2_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
QWEN2_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def random_blocks(type_name: str, rows: int, blocks_a_row: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, blocks_a_row * bytes a block] in a GGML block format: random codes, and small normal fp16
    scales."""
    from vriksha.loading.ggml_blocks import BLOCKS

    rng = np.random.default_rng(seed)
    size = BLOCKS[type_name][1]
    data = rng.integers(0, 256, (rows, blocks_a_row * size), dtype=np.uint8)
    blocks = data.reshape(-1, size)
    for offset in SCALE_HALVES[type_name]:
        half = (rng.standard_normal(blocks.shape[0]) * 0.05).astype(np.float16)
        blocks[:, offset : offset + 2] = half.view(np.uint8).reshape(-1, 2)
    return data


def tiny_qwen2_config(hidden_size: int, intermediate_size: int, **overrides):
    """A two-layer Qwen2 config over the embedded tokenizer's first 1024 tokens, untied head."""
    import transformers as T

    fields = dict(
        vocab_size=1024,  # the embedded tokenizer's first 1024 tokens: a small BPE to convert
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return T.Qwen2Config(**(fields | overrides))


def qwen2_gguf_name(name: str) -> str:
    """The GGUF tensor name of a Transformers Qwen2 parameter."""
    if name in QWEN2_GLOBAL:
        return QWEN2_GLOBAL[name]
    _, _, index, rest = name.split(".", 3)
    return f"blk.{index}.{QWEN2_LAYER[rest]}"


def copy_tokenizer(writer, vocab: int) -> None:
    """The embedded model's BPE tokenizer cut to its first `vocab` tokens and the merges among them."""
    import gguf

    from vriksha.loading.loader import default_gguf_path

    reader = gguf.GGUFReader(str(default_gguf_path()))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    known = set(tokens)
    merges = [m for m in reader.fields["tokenizer.ggml.merges"].contents() if m.replace(" ", "", 1) in known]
    writer.add_tokenizer_model(reader.fields["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(reader.fields["tokenizer.ggml.pre"].contents())
    writer.add_token_list(tokens)
    writer.add_token_types(reader.fields["tokenizer.ggml.token_type"].contents()[:vocab])
    writer.add_token_merges(merges)
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        writer.add_uint32(f"tokenizer.ggml.{key}", int(reader.fields[f"tokenizer.ggml.{key}"].contents()))
    writer.add_chat_template(reader.fields["tokenizer.chat_template"].contents())


def qwen2_writer(path: Path, cfg, name: str = "tiny-qwen2", tokenizer: bool = True):
    """A GGUFWriter for a Qwen2 model of config `cfg`, its metadata and (unless not wanted: it takes seconds to
    read from the embedded model) tokenizer written; add the tensors, then `finish(writer)`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name(name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if tokenizer:
        copy_tokenizer(writer, cfg.vocab_size)
    return writer


def finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
