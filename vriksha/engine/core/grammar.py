"""Structured outputs through llguidance: a grammar per request, a token bitmask per step.

llguidance was picked over xgrammar because it installs alone (xgrammar pulls triton and a TVM runtime) and
takes Lark, GBNF, regexes and JSON schemas through one entry point; on this model's 49k vocabulary the two
measured alike (one sequence's mask about 0.02 ms each; a new JSON schema's compile plus first mask 43 ms
against 55 ms for xgrammar, on a shared 2-core CPU).

The masks for step t+1 can be computed while step t's forward runs (`grammar_overlap`, `overlap_plan`): right
after the sampled tokens are consumed they are started on a worker thread (llguidance releases the GIL, as
torch does), and sampling waits for them. That pays where the forward leaves cores idle: an accelerator, or
a CPU with cores torch does not use. Where torch's forward takes every core (the 2-core reference machine),
the mask work runs on the cores the forward uses: measured there (`benchmarks/structured_outputs.py`, idle,
median of 3), overlapping cost +11.0% against +7.9% at batch 1 and paid at batch 16 (-5.4% against +14.7%),
since one sequence's mask is too little work to hide and sixteen are not. So `auto` on such a CPU overlaps
only steps with at least `CPU_OVERLAP_MIN_BATCH` constrained sequences, on one llguidance thread; smaller
steps compute their masks just before sampling, while torch waits, on one llguidance thread per torch thread.

Sequences of one spec that consumed the same tokens are in the same state (`n > 1`, the forced start of a
JSON object): a batch computes their mask once, and a spec's start mask is computed once and kept. A request's
matcher is a copy of one compiled per distinct spec (`LLMatcher.deep_copy`, microseconds), not a new parse of
its grammar (milliseconds each, for every sequence of a batch).

A spec is checked before its request is admitted (`GrammarEngine.compile`): its grammar's size and the
widest `anyOf`/`oneOf`/`choice` against `GrammarLimits`, then compiled under llguidance's own resource limits
(lexer fuel, Earley items per step), its start mask computed and the tokens it forces at the start consumed
on a copy. A grammar that is unsatisfiable (a `$ref` to itself), too large, or that exceeds those limits at the
start is refused there with the reason. One that exceeds them later, mid-generation, puts its matcher in an
error state: the engine then ends the request as an error (`finish_reason` "error"), never as a stop.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.errors import InvalidRequestError

logger = logging.getLogger(__name__)

# compact JSON: no free whitespace, so a constrained reply cannot run on in blanks until max_tokens
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    try:
        import llguidance
        import llguidance.hf
    except ImportError:
        raise InvalidRequestError(
            "structured outputs need the package `llguidance`; install it with: pip install llguidance"
        ) from None
    return llguidance


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for a spec (not yet validated against a tokenizer)."""
    llg = _llguidance()
    m = llg.LLMatcher
    try:
        if spec.json is not None:
            return m.grammar_from_json_schema(spec.json, defaults=JSON_OPTIONS)
        if spec.json_object:
            return m.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if spec.regex is not None:
            return m.grammar_from_regex(spec.regex)
        if spec.choice is not None:
            return m.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
        assert spec.grammar is not None
        return llg.grammar_from("gbnf" if "::=" in spec.grammar else "lark", spec.grammar)
    except ValueError as e:
        raise InvalidRequestError(f"invalid structured_outputs.{spec.kind}: {e}") from None


@dataclass(slots=True, frozen=True)
class GrammarLimits:
    """What one request's grammar may cost. `max_bytes`: the compiled grammar's text; `max_branches`: the
    alternatives of one `anyOf`/`oneOf` (or `choice` list), each an Earley item at every step it is open.
    llguidance's own limits: `lexer_fuel`, the work of building the lexer's first regex states (about 50k a
    millisecond; llguidance's default is 1M, enough for a regex such as `(a{1000}){1000}` to take seconds
    before it fails), and its defaults for the rest (2,000 items in one Earley row, 50k items a step)."""

    max_bytes: int = 512 * 1024
    max_branches: int = 1000
    lexer_fuel: int = 200_000

    def parser_limits(self) -> Any:
        return _llguidance().LLParserLimits(initial_lexer_fuel=self.lexer_fuel, verbose_errors=False)


def _reason(error: str) -> str:
    """llguidance's error, its first line (the rest is a parser state dump)."""
    return error.strip().splitlines()[0] if error.strip() else "unknown error"


def _widest(value: Any) -> int:
    """The most alternatives of one `anyOf`/`oneOf` anywhere in a JSON schema."""
    widest, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("anyOf", "oneOf"):
                if isinstance(node.get(key), list):
                    widest = max(widest, len(node[key]))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return widest


def check_size(spec: StructuredOutputsParams, grammar: str, limits: GrammarLimits) -> None:
    """Raise InvalidRequestError when the spec is wider or its grammar larger than `limits` allow."""
    where = f"structured_outputs.{spec.kind}"
    branches = len(spec.choice) if spec.choice is not None else _widest(spec.json) if spec.json else 0
    if branches > limits.max_branches:
        raise InvalidRequestError(
            f"{where} has {branches} alternatives in one anyOf/oneOf/choice; the server takes at most "
            f"{limits.max_branches} (--grammar-max-branches); split the request or merge alternatives"
        )
    size = len(grammar.encode())
    if size > limits.max_bytes:
        raise InvalidRequestError(
            f"{where} compiles to a grammar of {size} bytes; the server takes at most {limits.max_bytes} "
            "(--grammar-max-bytes); simplify the schema"
        )


def check_grammar(spec: StructuredOutputsParams) -> None:
    """Raise InvalidRequestError with llguidance's reason when the spec cannot be compiled (no tokenizer needed;
    `GrammarEngine.compile` checks the rest against the engine's limits)."""
    error = _llguidance().LLMatcher.validate_grammar(grammar_text(spec))
    if error:
        raise InvalidRequestError(f"invalid structured_outputs.{spec.kind}: {_reason(error)}")


def _printable_word(text: str) -> bool:
    return bool(text) and all(33 <= ord(c) <= 126 for c in text)


def llguidance_tokenizer(tokenizer, vocab_size: int, eos_token_ids: frozenset[int]):
    """llguidance's view of `tokenizer`, with the added tokens the tokenizer marks as ordinary text kept as text.

    llguidance takes every added token shaped `<...>` for a special token, even where the tokenizer marks it as
    text (Qwen2.5's `<tool_call>` and `</tool_call>`): a grammar whose literal text the tokenizer writes as that
    token (a forced tool call) is then forced onto the token and refuses it, ending the reply there. Such tokens
    (printable ASCII without spaces, which a byte-level BPE vocabulary spells as the text itself) are handed to
    llguidance as ordinary vocabulary entries instead: the grammar's text is then written with ordinary tokens,
    and the added token, where the model writes it, is accepted as its text."""
    llg = _llguidance()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # llguidance's own error names what it needs
        return llg.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_token_ids))
    spec = json.loads(backend.to_str())
    vocab = spec.get("model", {}).get("vocab")
    if spec.get("model", {}).get("type") == "BPE" and isinstance(vocab, dict):
        kept = []
        for token in spec.get("added_tokens", []):
            content = token.get("content", "")
            text_like = not token.get("special") and content.startswith("<") and content.endswith(">")
            if text_like and _printable_word(content) and vocab.get(content, token["id"]) == token["id"]:
                vocab[content] = token["id"]
            else:
                kept.append(token)
        spec["added_tokens"] = kept
    spec["padding"] = spec["truncation"] = None
    return llg.LLTokenizer(json.dumps(spec), n_vocab=vocab_size, eos_token=sorted(eos_token_ids))


CPU_OVERLAP_MIN_BATCH = 4  # between the measured 1 (overlap loses) and 16 (overlap wins)


def overlap_plan(choice: str, on_host: bool) -> tuple[bool, int | None, int]:
    """(overlap, llguidance threads for overlapped masks, fewest constrained sequences a step overlaps) for
    the engine option `grammar_overlap` (auto, on, off).

    With an accelerator the host's cores are free while the forward runs: overlap every step on llguidance's
    default threads. On the CPU, auto overlaps every step onto cores torch's forward does not use (as many
    threads as there are such cores); where torch takes every core, only steps of at least
    `CPU_OVERLAP_MIN_BATCH` sequences, on one thread."""
    if not on_host:
        return choice != "off", None, 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    spare = cores - torch.get_num_threads()
    if choice == "on" or (choice == "auto" and spare >= 1):
        return True, max(1, spare), 1
    if choice == "auto":
        return True, 1, CPU_OVERLAP_MIN_BATCH
    return False, None, 1


class Matcher:
    """One sequence's grammar state and its next token mask (a row of a batch's mask buffer)."""

    def __init__(self, inner, words: int, spec_key: str) -> None:
        self.inner = inner
        self.spec_key = spec_key
        self.tokens: list[int] = []  # consumed so far: equal lists of one spec mean equal states
        self.history = 0  # a running hash of `tokens`
        self.buffer = torch.full((1, words), -1, dtype=torch.int32)
        self.row = 0
        self.pending: Future | None = None

    @property
    def mask(self) -> torch.Tensor:
        return self.buffer[self.row]

    def advance(self, token: int) -> bool:
        """Take a sampled token; False if the grammar cannot (it then stays in error)."""
        self.tokens.append(token)
        self.history = hash((self.history, token))
        return bool(self.inner.consume_token(token))

    @property
    def done(self) -> bool:
        """The grammar is complete and admits nothing more."""
        return bool(self.inner.is_stopped())

    @property
    def error(self) -> str | None:
        return self.inner.get_error() if self.inner.is_error() else None

    @property
    def reason(self) -> str:
        """Why the matcher is in error, in one line."""
        return _reason(self.inner.get_error())

    @property
    def live(self) -> bool:
        return not self.inner.is_stopped() and not self.inner.is_error()


class GrammarEngine:
    """Compiles request grammars once per distinct spec and computes a batch's masks on llguidance's threads.

    `overlap`: the masks of the next step are started as soon as the sequences took their tokens (`prefetch`),
    on a worker thread, so that they are computed while the next forward runs, for steps of at least
    `min_batch` sequences; else `masks` computes them when they are needed. Sequences of one spec in the same state (equal consumed tokens: `n > 1`, or the forced
    start of a JSON object) have their mask computed once per batch, and a spec's start mask once."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        overlap: bool = False,
        threads: int | None = None,
        min_batch: int = 1,
        limits: GrammarLimits | None = None,
    ) -> None:
        llg = _llguidance()
        self.limits = limits or GrammarLimits()
        self._parser_limits = self.limits.parser_limits()
        self._llg = llg
        self.tokenizer = llguidance_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.words = (vocab_size + 31) // 32
        self.overlap = overlap
        self.min_batch = max(1, min_batch)
        waiting_threads = max(1, torch.get_num_threads())  # computed while torch waits: as many as it uses
        self.waiting_executor = llg.LLExecutor(
            num_threads=threads if threads is not None and not overlap else waiting_threads
        )
        # overlapped masks: `threads` (None: llguidance's default)
        self.executor = llg.LLExecutor(num_threads=threads) if overlap else self.waiting_executor
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask") if overlap else None
        # spec key -> an LLMatcher in its start state, checked, copied for each request
        self._templates: dict[str, object] = {}
        self._start_masks: dict[str, torch.Tensor] = {}  # spec key -> its start state's mask
        self.computed = 0  # masks llguidance computed (the rest were shared or cached)

    def compile(self, spec: StructuredOutputsParams) -> object:
        """The spec's matcher in its start state, compiled once per spec and checked (see the module's notes);
        InvalidRequestError names what is wrong. Thread-safe: a server compiles off the engine's thread."""
        key = spec.key()
        template = self._templates.get(key)
        if template is None:
            template = self._checked(spec)
            if len(self._templates) > 256:
                self._templates.clear()
                self._start_masks.clear()
            self._templates[key] = template
        return template

    def _checked(self, spec: StructuredOutputsParams) -> object:
        where = f"structured_outputs.{spec.kind}"
        grammar = grammar_text(spec)
        check_size(spec, grammar, self.limits)
        template = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self._parser_limits)
        if template.is_error():
            raise InvalidRequestError(f"invalid {where}: {_reason(template.get_error())}")
        probe = template.deep_copy()  # the start and the tokens it forces, on a copy
        probe.compute_bitmask()
        if not probe.is_error():
            forced = probe.compute_ff_tokens()
            if forced and probe.consume_tokens(forced):
                probe.compute_bitmask()
        if probe.is_error():
            raise InvalidRequestError(
                f"{where} cannot be used: {_reason(probe.get_error())} (no output satisfies it, or it is past "
                "the grammar engine's limits); simplify it"
            )
        return template

    def matcher(self, spec: StructuredOutputsParams) -> Matcher:
        return Matcher(self.compile(spec).deep_copy(), self.words, spec.key())  # type: ignore[attr-defined]

    def prefetch(self, matchers: list[Matcher]) -> None:
        """Start computing the next masks of `matchers` (call right after they took their tokens); without
        overlap, `masks` computes them when they are needed."""
        if self.pool is not None and sum(m.live for m in matchers) >= self.min_batch:
            self._submit(matchers, background=True)

    def _submit(self, matchers: list[Matcher], background: bool) -> None:
        live = [m for m in matchers if m.live]
        if not live:
            return
        executor = self.executor if background else self.waiting_executor
        buf = torch.full((len(live), self.words), -1, dtype=torch.int32)
        pairs = []  # (llguidance matcher, row) of the masks to compute
        copies = []  # (row, row it equals) of sequences in a state computed in this batch
        first: dict[tuple[str, int], int] = {}
        for i, m in enumerate(live):
            start = self._start_masks.get(m.spec_key) if not m.tokens else None
            if start is not None:
                buf[i] = start
                continue
            j = first.setdefault((m.spec_key, m.history), i)
            if j != i and live[j].tokens == m.tokens:
                copies.append((i, j))
            else:
                pairs.append((m.inner, i))
        starts = [(live[i].spec_key, i) for _, i in pairs if not live[i].tokens]
        self.computed += len(pairs)

        def run() -> None:
            if pairs:
                executor.unsafe_compute_mask_ptr(pairs, buf.data_ptr(), self.words * 4, len(live))
            for i, j in copies:
                buf[i] = buf[j]
            for key, i in starts:
                self._start_masks[key] = buf[i].clone()

        future: Future = self.pool.submit(run) if background and self.pool is not None else _done(run)
        for i, m in enumerate(live):
            m.buffer, m.row, m.pending = buf, i, future

    def masks(self, matchers: list[Matcher]) -> torch.Tensor:
        """The current masks of `matchers` as int32 [len, words], waiting for any still being computed."""
        missing = [m for m in matchers if m.pending is None]
        if missing:
            self._submit(missing, background=False)
        pending = {id(m.pending): m.pending for m in matchers if m.pending is not None}
        for future in pending.values():  # one per batch that computed them
            future.result()
        for m in matchers:
            m.pending = None
        buf = matchers[0].buffer
        if buf.shape[0] == len(matchers) and all(
            m.buffer is buf and m.row == i for i, m in enumerate(matchers)
        ):
            return buf  # the batch's own buffer, in order: no copy
        return torch.stack([m.mask for m in matchers])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def _done(fn) -> Future:
    """Run `fn` now; its result as a completed future."""
    future: Future = Future()
    fn()
    future.set_result(None)
    return future
