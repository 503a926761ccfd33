"""No silent grammar failures: a spec that is unsatisfiable, too wide, too large, or past llguidance's limits
at its start is refused when the request is added, naming the problem; one that fails mid-generation ends
its request with finish_reason "error" and the reason, never with "stop" and output that breaks it."""

from __future__ import annotations

import json

import pytest

from tests.tiny_llama import embedded_tokenizer, tiny_llama
from vriksha import LLM, SamplingParams
from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.errors import InvalidRequestError

RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def _objects(n: int, required: bool = True) -> dict:
    branches = []
    for i in range(n):
        branch = {"type": "object", "properties": {f"k{i}": {"type": "integer"}}}
        if required:
            branch["required"] = [f"k{i}"]
        branches.append(branch)
    return {"anyOf": branches}


def _wide_lark(n: int) -> str:
    """A free first token, then a row of `n` alternatives: past llguidance's 2,000 items in one row only
    once generation reaches it."""
    rules = "\n".join(f'r{i}: "k{i}" "=" "{i}"' for i in range(n))
    return 'start: ("a" | "b") "{" (' + " | ".join(f"r{i}" for i in range(n)) + ') "}"\n' + rules


@pytest.fixture(scope="module")
def llm():
    tok = embedded_tokenizer()
    llm = LLM.from_module(
        tiny_llama(tok, initializer_range=0.2).eval(), tok, max_model_len=256, kv_cache_memory_gb=0.02
    )
    yield llm
    llm.close()


def _generate(llm: LLM, spec: StructuredOutputsParams, **kw):
    params = SamplingParams(
        **{"max_tokens": 16, "temperature": 1.0, "seed": 3, **kw}, structured_outputs=spec
    )
    return llm.generate(["Give me JSON"], params)[0].outputs


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (StructuredOutputsParams(regex="(a{1000}){1000}"), "regex cannot be used: lexer error"),
        (StructuredOutputsParams(json=RECURSIVE), "json cannot be used"),
        (StructuredOutputsParams(json=_objects(5000)), "5000 alternatives.*--grammar-max-branches"),
        (StructuredOutputsParams(choice=[f"c{i}" for i in range(1001)]), "1001 alternatives"),
    ],
    ids=["exploding-regex", "recursive-ref", "anyof-5000", "choice-1001"],
)
def test_specs_that_cannot_work_are_refused_when_added(llm, spec, match):
    with pytest.raises(InvalidRequestError, match=match):
        _generate(llm, spec)
    assert not llm.engine.has_unfinished


def test_a_grammar_past_the_size_limit_is_refused_naming_it():
    tok = embedded_tokenizer()
    small = LLM.from_module(
        tiny_llama(tok).eval(), tok, max_model_len=256, kv_cache_memory_gb=0.02, grammar_max_bytes=2000
    )
    try:
        schema = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(200)}}
        with pytest.raises(
            InvalidRequestError, match=r"bytes; the server takes at most 2000 \(--grammar-max-bytes"
        ):
            _generate(small, StructuredOutputsParams(json=schema))
    finally:
        small.close()


def test_a_grammar_failing_mid_generation_ends_the_request_as_an_error(llm):
    spec = StructuredOutputsParams(grammar=_wide_lark(3000))
    llm.engine.grammar_engine().compile(spec)  # passes the checks at the start: the first token is free
    for seed in range(3):
        (out,) = _generate(llm, spec, seed=seed)
        assert out.finish_reason == "error", (out.text, out.finish_reason)
        assert "Current row has 3001 items" in out.error and "at its token 2" in out.error
    assert not llm.engine.has_unfinished


def test_a_grammar_within_the_limits_still_constrains(llm):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tag": {"enum": ["x", "y"]}},
        "required": ["n", "tag"],
        "additionalProperties": False,
    }
    outs = _generate(llm, StructuredOutputsParams(json=schema), max_tokens=40, n=3)
    for out in outs:
        assert out.finish_reason == "stop" and out.error is None
        value = json.loads(out.text)
        assert set(value) == {"n", "tag"} and value["tag"] in ("x", "y")
    (out,) = _generate(llm, StructuredOutputsParams(json=_objects(900)), max_tokens=40)
    assert out.finish_reason in ("stop", "length") and out.error is None  # 900 branches: within the limit
