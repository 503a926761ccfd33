"""Penalties, logit bias, token restrictions, grammar constraints and prompt log-probs in the engine: each test
fails if the engine ignores the parameter."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha import LLM, SamplingParams
from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.errors import InvalidRequestError


@pytest.fixture(scope="module")
def llm():
    tok = embedded_tokenizer()
    model = tiny_llama(tok, initializer_range=0.2).eval()
    return LLM.from_module(model, tok, max_model_len=512, kv_cache_memory_gb=0.05)


def gen(llm, prompt="Hello there, how are you", **kw):
    return llm.generate([prompt], SamplingParams(**kw))[0]


def test_logit_bias_plus_100_makes_a_token_the_only_output(llm):
    out = gen(llm, temperature=1.0, seed=0, max_tokens=12, logit_bias={1234: 100}, ignore_eos=True)
    assert out.outputs[0].token_ids == [1234] * 12
    baseline = gen(llm, temperature=1.0, seed=0, max_tokens=12, ignore_eos=True)
    assert baseline.outputs[0].token_ids != [1234] * 12


def test_logit_bias_minus_100_bans_the_greedy_token(llm):
    first = gen(llm, temperature=0, max_tokens=1, ignore_eos=True).outputs[0].token_ids[0]
    out = gen(llm, temperature=0, max_tokens=1, ignore_eos=True, logit_bias={first: -100})
    assert out.outputs[0].token_ids[0] != first


A, B = 1000, 2000  # two tokens the tests choose between, A favoured by a bias


def _ab(llm, **kw):
    """Greedy over {A, B} only, A ahead of B by 1.5 in logit: without a penalty only A comes."""
    params = dict(
        temperature=0, max_tokens=16, ignore_eos=True, allowed_token_ids=[A, B], logit_bias={A: 21.5, B: 20.0}
    )
    return gen(llm, **params, **kw).outputs[0].token_ids


def test_without_a_penalty_the_favoured_token_repeats(llm):
    assert _ab(llm) == [A] * 16


@pytest.mark.parametrize(
    "penalty", [{"presence_penalty": 2.0}, {"frequency_penalty": 1.0}, {"repetition_penalty": 1.2}]
)
def test_each_penalty_stops_the_repeated_token(llm, penalty):
    ids = _ab(llm, **penalty)
    assert ids[0] == A and ids[1] == B  # A is penalised once seen
    if "frequency_penalty" in penalty:  # keeps growing with every A: B keeps coming
        assert ids.count(B) >= 4


def test_repetition_penalty_covers_the_prompt(llm):
    prompt = llm.tokenizer.decode([A] * 4)
    assert gen(
        llm,
        prompt,
        temperature=0,
        max_tokens=1,
        allowed_token_ids=[A, B],
        logit_bias={A: 21.5, B: 20.0},
        repetition_penalty=1.2,
    ).outputs[0].token_ids == [B]


def test_penalties_apply_per_request_in_one_batch(llm):
    kw = dict(
        temperature=0, max_tokens=16, ignore_eos=True, allowed_token_ids=[A, B], logit_bias={A: 21.5, B: 20.0}
    )
    plain, penalised = llm.generate(
        ["Hello there, how are you"] * 2, [SamplingParams(**kw), SamplingParams(frequency_penalty=1.0, **kw)]
    )
    assert plain.outputs[0].token_ids == [A] * 16
    assert B in penalised.outputs[0].token_ids


def test_allowed_token_ids_and_bad_words(llm):
    out = gen(llm, temperature=1.0, seed=3, max_tokens=10, allowed_token_ids=[100, 200, 300], ignore_eos=True)
    assert set(out.outputs[0].token_ids) <= {100, 200, 300}
    base = gen(llm, temperature=0, max_tokens=8, ignore_eos=True)
    word = llm.tokenizer.decode(base.outputs[0].token_ids[:1])
    out = gen(llm, temperature=0, max_tokens=8, ignore_eos=True, bad_words=[word])
    assert base.outputs[0].token_ids[0] not in out.outputs[0].token_ids


@pytest.mark.parametrize(
    "field,value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3.0),
        ("repetition_penalty", 0.0),
        ("logit_bias", {5: 101}),
    ],
)
def test_out_of_range_values_are_refused_by_name(field, value):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})


def test_token_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        gen(llm, logit_bias={10**7: 1.0})


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": -5, "maximum": 5},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}


def test_json_schema_constrains_every_sample(llm):
    so = StructuredOutputsParams(json=SCHEMA)
    out = gen(llm, temperature=1.0, seed=1, n=3, max_tokens=80, structured_outputs=so)
    for c in out.outputs:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)


def test_regex_choice_and_grammar(llm):
    out = gen(
        llm,
        temperature=1.0,
        seed=2,
        max_tokens=20,
        structured_outputs=StructuredOutputsParams(regex="[0-9]{3}-[a-c]{2}"),
    )
    text = out.outputs[0].text
    assert len(text) == 6 and text[:3].isdigit() and text[3] == "-" and set(text[4:]) <= set("abc")
    out = gen(
        llm,
        temperature=1.0,
        seed=2,
        max_tokens=20,
        structured_outputs=StructuredOutputsParams(choice=["red", "green"]),
    )
    assert out.outputs[0].text in ("red", "green")
    lark = 'start: "x" ("y" | "z")+ "!"'
    out = gen(
        llm, temperature=1.0, seed=2, max_tokens=20, structured_outputs=StructuredOutputsParams(grammar=lark)
    )
    t = out.outputs[0].text
    assert t.startswith("x") and t.endswith("!") and set(t[1:-1]) <= {"y", "z"}


def test_unsatisfiable_and_invalid_schemas_are_refused_with_the_reason(llm):
    bad = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 2}},
        "required": ["a"],
    }
    with pytest.raises(InvalidRequestError, match="nsatisfiable"):
        gen(llm, structured_outputs=StructuredOutputsParams(json=bad))
    with pytest.raises(InvalidRequestError, match="strin"):
        gen(llm, structured_outputs=StructuredOutputsParams(json={"type": "strin"}))
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])


def test_prompt_logprobs_equal_the_models_forward(llm):
    prompt = "The quick brown fox jumps"
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    gen(llm, prompt, temperature=0, max_tokens=2)  # put the prompt in the prefix cache first
    out = gen(llm, prompt, temperature=0, max_tokens=1, prompt_logprobs=2)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    with torch.no_grad():
        ref = torch.log_softmax(llm.model(torch.tensor([ids])).logits[0].float(), -1)
    for p in range(1, len(ids)):
        entry = out.prompt_logprobs[p]
        assert entry[ids[p]] == pytest.approx(ref[p - 1, ids[p]].item(), abs=1e-3)
        assert len(entry) >= 2
