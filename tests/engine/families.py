"""Tiny random configs of the decoder families the engine is tested on (one place; test_families.py runs them).

Each is a few layers of width 64 with grouped-query attention where the family has it; the entries name what the
family brings to the engine's attention or KV layout beyond plain causal attention.
"""

from __future__ import annotations

import transformers as T

VOCAB = 512
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    initializer_range=0.2,
)
PAD = dict(pad_token_id=0)  # families whose default pad id lies outside the tiny vocabulary
MOE = dict(num_experts_per_tok=2)


def _gemma3():
    return T.Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
    )


FAMILY_CONFIGS = {
    "llama": lambda: T.LlamaConfig(**COMMON, tie_word_embeddings=True),
    "qwen2": lambda: T.Qwen2Config(**COMMON, tie_word_embeddings=False),
    "qwen3": lambda: T.Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True),
    "gemma3": _gemma3,  # sliding-window layers beside full ones
    "mistral": lambda: T.MistralConfig(**COMMON, sliding_window=8),
    "gemma": lambda: T.GemmaConfig(**COMMON, head_dim=16),
    "gemma2": lambda: T.Gemma2Config(
        **COMMON, head_dim=16, sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=2.0
    ),  # soft-capping
    "phi3": lambda: T.Phi3Config(**COMMON, **PAD),
    "phi": lambda: T.PhiConfig(**COMMON, partial_rotary_factor=0.5),  # partial rotary
    "gpt_neox": lambda: T.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=1024,
        rotary_pct=0.25,
        initializer_range=0.2,
        pad_token_id=0,
    ),  # partial rotary, fused QKV
    "stablelm": lambda: T.StableLmConfig(**COMMON, partial_rotary_factor=0.25),
    "olmo2": lambda: T.Olmo2Config(**COMMON),  # norms on q and k
    "cohere": lambda: T.CohereConfig(**COMMON),
    "granite": lambda: T.GraniteConfig(**COMMON),
    "starcoder2": lambda: T.Starcoder2Config(**COMMON),
    "gpt2": lambda: T.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=1024, pad_token_id=0
    ),
    "gptj": lambda: T.GPTJConfig(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=1024
    ),
    "exaone4": lambda: T.Exaone4Config(
        **COMMON, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
    ),
    "glm4": lambda: T.Glm4Config(**COMMON, **PAD, head_dim=16),
    "smollm3": lambda: T.SmolLM3Config(**COMMON, **PAD),
    "deepseek_v3": lambda: T.DeepseekV3Config(
        **COMMON,
        **MOE,
        n_routed_experts=4,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        n_group=1,
        topk_group=1,
    ),  # multi-head latent attention (K and V sizes differ from the hidden size's split), MoE
    "gpt_oss": lambda: T.GptOssConfig(
        **COMMON,
        **MOE,
        head_dim=16,
        num_local_experts=4,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),  # attention sinks, MoE
    "mixtral": lambda: T.MixtralConfig(**COMMON, **MOE, num_local_experts=4),  # MoE
    "qwen2_moe": lambda: T.Qwen2MoeConfig(
        **COMMON, **MOE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64
    ),  # MoE with a shared expert
    "qwen3_moe": lambda: T.Qwen3MoeConfig(
        **COMMON, **MOE, head_dim=16, num_experts=4, moe_intermediate_size=32
    ),
    "olmoe": lambda: T.OlmoeConfig(**COMMON, **MOE, num_experts=4),
}

MOE_FAMILIES = ["deepseek_v3", "gpt_oss", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]

# families whose attention lives in their own code, not behind Transformers' AttentionInterface: refused at load
REFUSED_CONFIGS = {
    "bloom": lambda: T.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4),
    "falcon": lambda: T.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        new_decoder_architecture=True,
    ),
}
