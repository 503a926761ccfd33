"""A non-Llama family from a GGUF file: a tiny random Qwen2 written in the real GGUF layout (tensor names,
architecture keys, the embedded model's BPE tokenizer) loads through `LLM(model=file.gguf)` and decodes as
the model it was written from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")


def _write_qwen2_gguf(model, path: Path) -> None:
    from tests.gguf_files import finish, qwen2_gguf_name, qwen2_writer

    writer = qwen2_writer(path, model.config)
    for name, tensor in model.state_dict().items():
        writer.add_tensor(qwen2_gguf_name(name), tensor.detach().float().numpy())
    finish(writer)


@pytest.mark.slow
def test_qwen2_gguf_decodes_as_the_model_it_was_written_from(tmp_path, monkeypatch):
    import transformers as T

    from tests.gguf_files import tiny_qwen2_config
    from vriksha import LLM, SamplingParams

    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = tiny_qwen2_config(hidden_size=64, intermediate_size=128, initializer_range=0.2)
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
