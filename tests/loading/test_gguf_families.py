"""A non-Llama family from a GGUF file: a tiny random Qwen2 written in the real GGUF layout (tensor names,
architecture keys, the embedded model's BPE tokenizer) loads through `LLM(model=file.gguf)` and decodes as
the model it was written from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")

# Transformers' names -> GGUF's, per layer (Qwen2: biases on q, k, v; no rotary permutation, unlike Llama)
_LAYER = {
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
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}


def _gguf_name(name: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    if name == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = name.split(".", 3)
    return f"blk.{index}.{_LAYER[rest]}"


def _copy_tokenizer(writer, reader, vocab: int) -> None:
    """The embedded model's BPE tokenizer cut to its first `vocab` tokens and the merges among them."""
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


def _write_qwen2_gguf(model, path: Path) -> None:
    from vriksha.loading.loader import default_gguf_path

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny-qwen2")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _copy_tokenizer(writer, gguf.GGUFReader(str(default_gguf_path())), cfg.vocab_size)
    for name, tensor in model.state_dict().items():
        writer.add_tensor(_gguf_name(name), tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
def test_qwen2_gguf_decodes_as_the_model_it_was_written_from(tmp_path, monkeypatch):
    import transformers as T

    from vriksha import LLM, SamplingParams

    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = T.Qwen2Config(
        vocab_size=1024,  # the embedded tokenizer's first 1024 tokens: a small BPE to convert
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    model = T.Qwen2ForCausalLM(config).eval()
    path = tmp_path / "tiny-qwen2.gguf"
    _write_qwen2_gguf(model, path)

    llm = LLM(model=str(path), max_num_seqs=2, fast_linear=False, kv_cache_memory_gb=0.05)
    assert llm.engine.model.config.model_type == "qwen2"
    prompts = ["The capital of France is", "def fibonacci(n):"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    tokenizer = llm.tokenizer
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
        assert out.outputs[0].token_ids == ref[0, ids.shape[1] :].tolist(), prompt
