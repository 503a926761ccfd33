"""Structured decoding overhead and tool-call parse success, on the offline engine.

1. Overhead: the same prompts decoded under a JSON schema and unconstrained, to the same lengths (the
   unconstrained run is told each constrained output's length, with EOS ignored), at batch 1 and 16;
   reported as decode time per output token and the ratio, for each `grammar_overlap` mode (masks computed
   during the next forward, or just before sampling), every mode's run next to the same unconstrained one.
2. Tool calls: a fixed set of tool-use prompts, the tools in the system message in the parser's format
   (as the server renders them for a template without tools), greedy; how many replies parse into a call
   of a listed function whose arguments validate against its schema.

    python benchmarks/structured_outputs.py                      # the embedded model, batch 1 and 16
    python benchmarks/structured_outputs.py --model DIR --batches 1 --max-tokens 16 --prompts 2   # a smoke run
    python benchmarks/structured_outputs.py --overlap auto       # only the mode the engine picks here
"""

from __future__ import annotations

import argparse
import json
import time

import jsonschema

from vriksha import LLM, SamplingParams
from vriksha.engine.core.structured_outputs import StructuredOutputsParams
from vriksha.toolcalls import get_parser, parser_for_template

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "city": {"enum": ["Delhi", "Paris", "Lima", "Oslo"]},
    },
    "required": ["name", "age", "hobbies", "city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
]
TOOL_PROMPTS = [
    "What is the weather in Paris right now?",
    "Compute 1234 * 5678 with the calculator.",
    "Search the web for the tallest building in the world.",
    "Is it raining in Tokyo?",
    "What is 17 divided by 4?",
    "Find recent news about the Mars rover.",
    "How hot is it in Cairo today?",
    "Use the calculator: (3 + 4) * 12",
    "Look up the population of Canada.",
    "Weather forecast for London, please.",
    "What's 2 to the power of 20?",
    "Search for a pancake recipe.",
]


def person_prompt(i: int) -> str:
    return f"Describe person number {i} as JSON with name, age, hobbies and city."


def _use_overlap(llm: LLM, mode: str) -> None:
    """Rebuild the engine's grammar engine with `grammar_overlap` = mode (auto, on, off)."""
    engine = llm.engine
    if engine._grammar is not None:
        engine._grammar.close()
    engine._grammar = None
    engine.config.platform.grammar_overlap = mode


def _timed(llm: LLM, prompts: list[str], params) -> tuple[float, list]:
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - t, outs


def overhead(llm: LLM, batch: int, max_tokens: int, modes: list[str]) -> list[dict]:
    """Each grammar_overlap mode's constrained run and the unconstrained run of the same lengths, one after
    another (the plain run between them), so that all see the same machine."""
    prompts = [person_prompt(i) for i in range(batch)]
    so = StructuredOutputsParams(json=SCHEMA)
    runs = {}
    for mode in modes:
        _use_overlap(llm, mode)
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, structured_outputs=so))  # grammar engine up
        runs[mode] = _timed(
            llm, prompts, SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=so)
        )
    first = runs[modes[0]][1]
    lengths = [len(o.outputs[0].token_ids) for o in first]
    for mode in modes[1:]:  # the overlap changes no token
        assert [o.outputs[0].token_ids for o in runs[mode][1]] == [o.outputs[0].token_ids for o in first], (
            mode
        )
    plain_params = [
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in lengths
    ]
    t_plain, _ = _timed(llm, prompts, plain_params)
    valid = 0
    for o in first:
        try:
            jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    tokens = sum(lengths)
    return [
        {
            "batch": batch,
            "grammar_overlap": mode,
            "tokens": tokens,
            "constrained_ms_per_token": 1000 * runs[mode][0] / tokens,
            "plain_ms_per_token": 1000 * t_plain / tokens,
            "overhead": runs[mode][0] / t_plain - 1,
            "valid": f"{valid}/{batch}",
        }
        for mode in modes
    ]


def tool_success(llm: LLM, n_prompts: int, max_tokens: int) -> dict:
    template = getattr(llm.tokenizer, "chat_template", None)
    parser = get_parser(parser_for_template(template if isinstance(template, str) else None), TOOLS)
    system = parser.tools_prompt(TOOLS)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    convs = [
        [{"role": "system", "content": system}, {"role": "user", "content": p}]
        for p in TOOL_PROMPTS[:n_prompts]
    ]
    outs = llm.chat(convs, SamplingParams(temperature=0, max_tokens=max_tokens))
    ok = 0
    for o in outs:
        _, calls = parser.parse(o.outputs[0].text)
        good = [c for c in calls if c.ok and c.name in schemas]
        try:
            if good:
                jsonschema.validate(good[0].arguments, schemas[good[0].name])
                ok += 1
        except jsonschema.ValidationError:
            pass
    return {
        "parser": parser.name,
        "prompts": len(convs),
        "parsed_valid_calls": ok,
        "rate": ok / max(1, len(convs)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory or .gguf (default: the embedded model)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16], help="batch sizes (default: 1 16)")
    ap.add_argument("--max-tokens", type=int, default=96, help="cap on each constrained output (default: 96)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per batch size; the median overhead is kept")
    ap.add_argument(
        "--overlap",
        nargs="+",
        default=["off", "on"],
        choices=["auto", "on", "off"],
        help="grammar_overlap modes compared side by side, each against the same unconstrained run "
        "(default: off on)",
    )
    ap.add_argument("--prompts", type=int, default=len(TOOL_PROMPTS), help="tool-use prompts to try")
    args = ap.parse_args()
    llm = LLM(args.model)
    for batch in args.batches:
        repeats = [overhead(llm, batch, args.max_tokens, args.overlap) for _ in range(args.repeats)]
        for k in range(len(args.overlap)):
            runs = [r[k] for r in repeats]
            best = sorted(runs, key=lambda r: r["overhead"])[len(runs) // 2]
            best["overhead_runs"] = [round(r["overhead"], 3) for r in runs]
            print(json.dumps({"structured_overhead": best}))
    if args.prompts > 0:
        print(json.dumps({"tool_calls": tool_success(llm, args.prompts, 128)}))


if __name__ == "__main__":
    main()
