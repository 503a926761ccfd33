"""The TRL adapter against the real `trl` package: reward functions, dataset rows, environment_factory,
and GRPOTrainer running a step or two on a tiny random Llama with the embedded tokenizer."""

import os

import pytest

from vriksha.envs import make_env
from vriksha.envs.trl_adapter import build_dataset, build_rows, environment_factory, make_reward_func

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _answers(rows):
    env = make_env("arithmetic")
    out = []
    for row in rows:
        env.reset(seed=row["env_seed"], options={"split": row["env_split"], "level": 2})
        out.append(env._problem.answer)
    return out


def test_reward_func_scores_the_rows_episode():
    rows = build_rows("arithmetic", 4, options={"level": 2}, split="test", seed=10)
    assert [r["env_seed"] for r in rows] == [10, 11, 12, 13] and rows[0]["prompt"][-1]["role"] == "user"
    answers = _answers(rows)
    rf = make_reward_func("arithmetic")
    fmt = make_reward_func("arithmetic", component="format")
    succ = make_reward_func("arithmetic", component="success")
    assert rf.__name__ == "arithmetic_reward" and fmt.__name__ == "arithmetic_format"
    kw = {k: [r[k] for r in rows] for k in ("env_seed", "env_split", "env_options")}
    completions = [
        [{"role": "assistant", "content": f"Answer: {answers[0]}"}],  # conversational
        f"it is {answers[1]}",  # standard, no format
        f"Answer: {answers[2] + 1}",  # wrong
        "",
    ]
    prompts = [r["prompt"] for r in rows]
    assert rf(prompts, completions, **kw) == pytest.approx([1.0, 0.9, 0.0, 0.0])
    assert fmt(prompts, completions, **kw) == [1.0, 0.0, 1.0, 0.0]
    assert succ(prompts, completions, **kw) == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="env_seed"):
        rf(prompts, completions)


def test_environment_factory_shape():
    from transformers.utils import get_json_schema

    factory = environment_factory("calculator_tools")
    env = factory()
    schema = get_json_schema(type(env).calculator)
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    row = build_rows("calculator_tools", 1, seed=3)[0]
    assert env.reset(**row) is None  # the row carries the prompt already
    assert env.calculator(expression="6 * 7") == "Calculator result: 42"
    assert env._env.state.tool_calls == 1
    answer = env._env._episode.problem.answer
    rf = make_reward_func("calculator_tools")
    got = rf(
        [row["prompt"]],
        [[{"role": "assistant", "content": f"Answer: {answer}"}]],
        environments=[env],
        env_seed=[row["env_seed"]],
    )
    assert got == [1.0]
    fresh = factory()
    assert "calculator" in fresh.reset(env_seed=None)  # no dataset row: the observation becomes the prompt


def _tiny_model_and_tokenizer():
    from tests.tiny_llama import embedded_tokenizer, tiny_llama

    tok = embedded_tokenizer()
    tok.padding_side = "left"
    return tiny_llama(tok, max_position_embeddings=2048, bos_token_id=tok.bos_token_id), tok


@pytest.mark.slow
def test_grpo_trainer_two_steps_with_reward_funcs(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    model, tok = _tiny_model_and_tokenizer()
    ds = build_dataset("arithmetic", 8, options={"level": 1})
    seen = []
    rf = make_reward_func("arithmetic")

    def arithmetic_reward(prompts, completions, **kw):
        out = rf(prompts, completions, **kw)
        seen.append((list(kw["env_seed"]), out))
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        reward_weights=[1.0, 0.0],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_reward, make_reward_func("arithmetic", component="format")],
        args=args,
        train_dataset=ds,
        processing_class=tok,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(seen) == 2 and all(len(s) == 4 and set(s) <= set(range(8)) for s, _ in seen)
    assert all(0.0 <= x <= 1.0 for _, rewards in seen for x in rewards)
    logged = [h for h in trainer.state.log_history if "rewards/arithmetic_reward/mean" in h]
    assert len(logged) == 2 and all("rewards/arithmetic_format/mean" in h for h in logged)


@pytest.mark.slow
def test_grpo_trainer_with_environment_factory(tmp_path):
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    model, tok = _tiny_model_and_tokenizer()
    tok.chat_template = qwen2_5_chat_template  # a template that renders tool calls (SmolLM2's does not)
    seen = []
    rf = make_reward_func("calculator_tools")

    def calc_reward(prompts, completions, **kw):
        seen.append(kw.get("environments"))
        return rf(prompts, completions, **kw)

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[calc_reward],
        args=args,
        train_dataset=build_dataset("calculator_tools", 4),
        processing_class=tok,
        environment_factory=environment_factory("calculator_tools"),
    )
    assert [t.__name__ for t in trainer.tools] == ["calculator"]
    trainer.train()
    assert trainer.state.global_step == 1
    envs = seen[0]
    assert len(envs) == 2 and all(e._env.state.done for e in envs)  # each rollout scored in its own episode
