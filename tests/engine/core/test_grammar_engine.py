"""The grammar engine over the embedded model's tokenizer: per-request matchers copied from one compiled per
spec are independent, and a batch's masks computed together on llguidance's threads equal each one alone."""

import copy

import pytest
import torch
from tokenizers import AddedToken

from vriksha.engine.core.grammar import GrammarEngine
from vriksha.engine.core.structured_outputs import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(default_tokenizer):
    eng = GrammarEngine(
        default_tokenizer, len(default_tokenizer), frozenset({default_tokenizer.eos_token_id})
    )
    yield eng
    eng.close()


def _alone(engine: GrammarEngine, matcher) -> torch.Tensor:
    buf = torch.full((1, engine.words), -1, dtype=torch.int32)
    engine.executor.unsafe_compute_mask_ptr([(matcher.inner, 0)], buf.data_ptr(), engine.words * 4, 1)
    return buf[0]


def _allowed(mask: torch.Tensor) -> list[int]:
    return [32 * w + j for w, word in enumerate(mask.tolist()) for j in range(32) if (word >> j) & 1]


def test_matchers_of_one_spec_are_independent_copies(engine, default_tokenizer):
    so = StructuredOutputsParams(json=SCHEMA)
    a, b = engine.matcher(so), engine.matcher(so)
    start = _alone(engine, b)
    for token in default_tokenizer.encode('{"name": "x', add_special_tokens=False):
        assert a.advance(token)
    assert not torch.equal(_alone(engine, a), start)  # a moved on
    assert torch.equal(_alone(engine, b), start)  # b did not
    assert torch.equal(_alone(engine, engine.matcher(so)), start)  # nor the compiled one copies come from
    assert _allowed(start) and all(
        default_tokenizer.decode([t]).lstrip().startswith("{") for t in _allowed(start)
    )


def test_a_batch_of_masks_equals_each_mask_alone(engine, default_tokenizer):
    so = StructuredOutputsParams(json=SCHEMA)
    texts = ['{"name": "', '{"name": "ab", "n": ', "{", '{"name": "abcdefgh', '{"name": "q", "n": 12']
    matchers = []
    for text in texts * 2:
        m = engine.matcher(so)
        for token in default_tokenizer.encode(text, add_special_tokens=False):
            assert m.advance(token), text
        matchers.append(m)
    batch = engine.masks(matchers)
    assert batch.shape == (len(matchers), engine.words)
    for i, m in enumerate(matchers):
        assert torch.equal(batch[i], _alone(engine, m)), texts[i % len(texts)]
    assert not torch.equal(batch[0], batch[1])


def test_an_added_token_the_tokenizer_keeps_as_text_is_written_and_accepted(default_tokenizer):
    """Qwen2.5 adds `<tool_call>` as an ordinary-text token; llguidance takes `<...>` tokens for special ones, so
    a grammar forcing the text `<tool_call>` used to force that token and then refuse it."""
    tokenizer = copy.deepcopy(default_tokenizer)
    tokenizer.add_tokens([AddedToken("<tool_call>", special=False)])
    added = tokenizer.convert_tokens_to_ids("<tool_call>")
    engine = GrammarEngine(tokenizer, len(tokenizer), frozenset({tokenizer.eos_token_id}))
    try:
        spec = StructuredOutputsParams(grammar='start: "<tool_call>" "\\n{}"')
        written = engine.matcher(spec)
        allowed = _allowed(engine.masks([written])[0])
        assert allowed and added not in allowed  # the text is written with ordinary tokens
        text = "".join(tokenizer.decode([t]) for t in allowed)
        assert all("<tool_call>".startswith(tokenizer.decode([t])) for t in allowed), text
        for token in tokenizer.encode("<", add_special_tokens=False):
            assert written.advance(token)
        model_token = engine.matcher(spec)  # the model writes the added token itself: accepted as its text
        assert model_token.advance(added) and model_token.live
        for token in tokenizer.encode("\n{}", add_special_tokens=False):
            assert model_token.advance(token)
        assert model_token.done
    finally:
        engine.close()
