"""The packaged Qwen2.5-Coder-0.5B-Instruct (six packages, opt-in: `make models`): it joins into the pinned
GGUF, decodes Transformers' greedy tokens from the same file, and its chat template's tool calls parse."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from tests.packaged_models import QWEN_CODER as MODEL
from tests.packaged_models import WEATHER_TOOL as WEATHER
from tests.packaged_models import require_packaged

CHATS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "What does `git rebase` do? Answer in one sentence."}],
    [
        {"role": "system", "content": "You are a careful code reviewer."},
        {"role": "user", "content": "Fix the bug:\ndef add(a, b):\n    return a - b"},
    ],
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_path():
    from vriksha.loading.registry import find_packaged, packaged_gguf

    require_packaged(MODEL)
    return packaged_gguf(find_packaged(MODEL))


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    from vriksha.loading import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(MODEL))


def test_the_parts_join_into_the_file_described(gguf_path):
    from vriksha.loading.digest import file_sha256
    from vriksha.loading.gguf_index import read_gguf_index

    assert file_sha256(gguf_path) == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    index = read_gguf_index(gguf_path)
    assert index.metadata["general.architecture"] == "qwen2"
    assert index.metadata["general.name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
    assert index.metadata["qwen2.block_count"] == 24 and index.metadata["qwen2.embedding_length"] == 896
    assert Counter(t.type_name for t in index.tensors) == {
        "Q5_0": 133,
        "F32": 121,
        "Q8_0": 13,
        "Q6_K": 12,
        "Q4_K": 12,
    }
    assert "<tool_call>" in index.metadata["tokenizer.chat_template"]


def test_greedy_tokens_equal_transformers_on_the_same_gguf(gguf_path):
    """Transformers reads the file through `gguf`'s own numpy dequantizer; vriksha converted it through torch."""
    from transformers import AutoModelForCausalLM

    from vriksha import LLM, SamplingParams

    params = SamplingParams(max_tokens=32, temperature=0.0)
    with LLM(model=MODEL, dtype="float32", quantization="none", kv_cache_memory_gb=0.25) as llm:
        prompts = [llm.apply_chat_template(c) for c in CHATS]
        got = [o.outputs[0].token_ids for o in llm.chat(CHATS, params)]
    reference = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    for chat, ids, tokens in zip(CHATS, prompts, got, strict=True):
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([ids]), max_new_tokens=32, do_sample=False, top_k=None, top_p=None
            )
        assert tokens == out[0, len(ids) :].tolist(), chat[-1]["content"]


def test_the_chat_templates_tool_calls_parse(tokenizer):
    from vriksha.toolcalls import get_parser, parser_for_template

    name = parser_for_template(tokenizer.chat_template)
    assert name == "qwen"
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    }
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tools=[WEATHER], tokenize=False)
    assert "get_weather" in rendered.split("<|im_start|>user")[0]  # the template lists the tools itself
    reply = rendered.rsplit("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0]
    content, calls = get_parser(name, [WEATHER]).parse(reply)
    assert content.strip() == ""
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert json.loads(calls[0].arguments_json) == {"city": "Paris", "unit": "celsius"}
