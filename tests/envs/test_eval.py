"""`evaluate` and `vriksha env eval` through the real engine: a tiny random Llama wrapped by
`LLM.from_module` (fast), and the embedded model through the CLI (slow)."""

import json

import pytest

llm_mod = pytest.importorskip(
    "vriksha.engine.core.llm", reason="the engine (vriksha.engine.core.llm) has not landed"
)


@pytest.fixture(scope="module")
def tiny_llm():
    from tests.tiny_llama import embedded_tokenizer, tiny_llama

    tok = embedded_tokenizer()
    model = tiny_llama(tok, max_position_embeddings=2048, bos_token_id=tok.bos_token_id)
    return llm_mod.LLM.from_module(model.eval(), tok)


def test_evaluate_single_turn(tiny_llm):
    from vriksha.envs.eval import evaluate

    res = evaluate("arithmetic", tiny_llm, episodes=3, max_tokens=6, progress=False, seed=100)
    assert res.episodes == 3 and res.split == "test" and res.mean_turns == 1.0
    assert set(res.components) == {"length_ok", "correct", "format"}
    assert 0.0 <= res.mean_reward <= 1.0 and 0.0 <= res.success_rate <= 1.0
    assert [r.seed for r in res.records] == [100, 101, 102]
    assert all(len(r.completions) == 1 for r in res.records) and res.generated_tokens > 0
    again = evaluate("arithmetic", tiny_llm, episodes=3, max_tokens=6, progress=False, seed=100)
    assert [r.completions for r in again.records] == [
        r.completions for r in res.records
    ]  # greedy: repeatable


def test_evaluate_multi_turn_env_runs_to_the_end(tiny_llm):
    from vriksha.envs.eval import evaluate

    res = evaluate("calculator_tools", tiny_llm, episodes=2, max_tokens=6, progress=False)
    assert res.episodes == 2 and all(1 <= r.turns <= 6 for r in res.records)
    assert "used_calculator" in res.components


class _NoSessions:
    """The same engine seen through the bare rollout-engine protocol (no `close_session`)."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.eos_token_ids = llm.eos_token_ids

    def generate(self, prompts, sampling_params, use_tqdm=False):
        return self.llm.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def test_each_episode_is_an_engine_session_closed_at_its_end(tiny_llm):
    from vriksha.envs.eval import evaluate

    counters = tiny_llm.engine.cache.sessions.counters
    opened, closed = counters.opened, counters.closed
    res = evaluate("calculator_tools", tiny_llm, episodes=3, max_tokens=6, progress=False, seed=7)
    multi = sum(1 for r in res.records if r.turns > 1)
    assert counters.opened - opened >= 3 + multi  # each group's first turn, then each episode going on
    assert counters.closed - closed == counters.opened - opened  # every one closed by the driver
    stats = tiny_llm.stats()
    assert stats.open_sessions == 0 and stats.kv_pinned_tokens == 0
    plain = evaluate(
        "calculator_tools", _NoSessions(tiny_llm), episodes=3, max_tokens=6, progress=False, seed=7
    )
    assert [r.completions for r in plain.records] == [r.completions for r in res.records]


def test_a_pass_through_engine_passes_sessions_on(tiny_llm):
    from vriksha.envs.eval import evaluate
    from vriksha.envs.rollout_engine import PassThroughEngine, SessionEngine

    wrapped = PassThroughEngine(tiny_llm)
    wrapped.tokenizer = tiny_llm.tokenizer  # what `evaluate` formats prompts with
    assert isinstance(wrapped, SessionEngine)
    counters = tiny_llm.engine.cache.sessions.counters
    opened, closed = counters.opened, counters.closed
    res = evaluate("calculator_tools", wrapped, episodes=2, max_tokens=6, progress=False, seed=3)
    assert counters.opened - opened >= 2  # the wrapped engine opened them
    assert counters.closed - closed == counters.opened - opened and tiny_llm.stats().open_sessions == 0
    # over an engine without sessions: requests go without them, and closing reports nothing closed
    bare = PassThroughEngine(_NoSessions(tiny_llm))
    bare.tokenizer = tiny_llm.tokenizer
    before = counters.opened
    again = evaluate("calculator_tools", bare, episodes=2, max_tokens=6, progress=False, seed=3)
    assert counters.opened == before
    assert [r.completions for r in again.records] == [r.completions for r in res.records]
    assert bare.close_session("anything") is False


@pytest.mark.slow
def test_cli_eval_on_the_embedded_model(capsys):
    from vriksha.cli import main

    rc = main(
        [
            "env",
            "eval",
            "arithmetic",
            "--episodes",
            "2",
            "--level",
            "1",
            "--max-tokens",
            "24",
            "--json",
            "--no-progress",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["env"] == "arithmetic" and out["episodes"] == 2 and out["model"] == "embedded"
    assert set(out["components"]) == {"length_ok", "correct", "format"} and out["generated_tokens"] > 0


def test_evaluate_under_the_profiler_records_env_phases(tiny_llm, tmp_path):
    import gzip

    from vriksha.envs.eval import evaluate
    from vriksha.profiling import ProfileConfig, StepProfiler

    prof = StepProfiler(
        ProfileConfig(enabled=True, dir=tmp_path, wait=0, warmup=0, active=1), name="env_eval"
    )
    prof.start()
    evaluate("arithmetic", tiny_llm, episodes=2, max_tokens=4, progress=False, on_step=prof.step)
    traces = prof.stop()
    assert traces
    text = "".join(gzip.open(p, "rt").read() for p in traces)
    assert '"env.step"' in text and '"env.reward"' in text and '"engine.forward"' in text
