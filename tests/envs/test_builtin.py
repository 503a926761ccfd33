"""The built-in environments: seeded generators, held-out splits, parsing, rewards, tools."""

import pytest

from vriksha.envs import make_env
from vriksha.envs.builtin.arithmetic import LEVELS
from vriksha.envs.builtin.calculator_tools import calculate, find_tool_call
from vriksha.envs.builtin.common import has_answer_format, parse_answer, split_of
from vriksha.envs.builtin.python_functions import extract_code, same_value


@pytest.mark.parametrize(
    "text,value,formatted",
    [
        ("so the result is 42.", 42.0, False),
        ("Answer: 42", 42.0, True),
        ("work: 3 + 4 = 7\nAnswer: 1,234", 1234.0, True),
        ("**Final answer:** -7", -7.0, False),
        ("Final answer: -7.5", -7.5, True),
        ("\\boxed{12}", 12.0, True),
        ("Answer: 41 or 42", None, False),  # hedged
        ("Answer: 3\nAnswer: 42", None, False),  # two different marked answers
        ("Answer: 5\nAnswer: 5", 5.0, False),
        ("no numbers here", None, False),
        ("", None, False),
        ("9" * 5000, None, False),  # overlong
    ],
)
def test_answer_parsing(text, value, formatted):
    assert parse_answer(text) == value
    assert has_answer_format(text) is formatted


def test_arithmetic_levels_and_rewards():
    env = make_env("arithmetic")
    for level in LEVELS:
        r = env.reset(seed=level, options={"level": level})
        assert env.state.level == level and r.observation.messages[-1]["role"] == "user"
        answer = env._problem.answer
        assert str(answer) not in r.observation.text.replace(env._problem.expression, "")
        s = env.step({"text": f"Let me think.\nAnswer: {answer}"})
        assert s.terminated and s.reward == pytest.approx(1.0) and s.success
        env.reset(seed=level, options={"level": level})
        s = env.step({"text": f"it is {answer}"})  # right, free text: no format bonus
        assert s.reward == pytest.approx(0.9) and s.components["format"] == 0.0
        env.reset(seed=level, options={"level": level})
        s = env.step({"text": f"Answer: {answer + 1}"})  # wrong, well formatted: nothing
        assert s.reward == 0.0 and not s.success


def test_arithmetic_level4_has_two_digit_mixed_operations():
    env = make_env("arithmetic", level=4)
    ops = set()
    for seed in range(40):
        env.reset(seed=seed)
        a, op, b = env._problem.expression.split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        ops.add(op)
    assert ops == {"+", "-", "*"}
    env.reset(seed=0, options={"level": 6})
    assert "(" in env._problem.expression and "/" in env._problem.expression


def test_splits_are_disjoint_and_deterministic():
    env = make_env("arithmetic")
    train = {env.reset(seed=s, options={"split": "train"}).observation.text for s in range(200)}
    test = {env.reset(seed=s, options={"split": "test"}).observation.text for s in range(200)}
    assert not train & test
    assert len(test) > 50
    assert split_of("Compute 1 + 2") == split_of("Compute 1 + 2")


def test_python_functions_hidden_tests_in_sandbox(monkeypatch):
    monkeypatch.setenv("VRIKSHA_ENV_SECRET", "fixed-for-this-test")  # the hidden inputs depend on it
    env = make_env("python_functions", per_test_s=0.5)
    r = env.reset(seed=5)
    assert "running_sum" in r.observation.text and "```python" in r.observation.text
    assert env.state.num_hidden_tests == 8
    good = "```python\ndef running_sum(xs):\n    out = []\n    for x in xs:\n        out.append(x + (out[-1] if out else 0))\n    return out\n```"
    s = env.step({"text": good})
    assert s.reward == 1.0 and s.success and s.info["tests"] == {"passed": 8, "total": 8}
    assert s.info["sandbox"]["network_isolated"]
    env.reset(seed=5)
    half = "def running_sum(xs):\n    return [sum(xs[:i+1]) for i in range(len(xs))] if len(xs) % 2 else []\n"
    s = env.step({"text": half})
    assert 0 < s.reward < 1 and s.reward == s.info["tests"]["passed"] / 8 and not s.success
    env.reset(seed=5)
    always_equal = "```python\nclass A(list):\n    def __eq__(s, o): return True\ndef running_sum(xs):\n    return A()\n```"
    assert env.step({"text": always_equal}).reward == 0.0
    env.reset(seed=5)
    s = env.step({"text": "```python\ndef running_sum(xs):\n    while True: pass\n```"})
    assert s.reward == 0.0


def test_python_functions_parsing_helpers():
    assert extract_code("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("def f(x):\n    return x") == "def f(x):\n    return x"
    assert extract_code("no code") == ""
    assert same_value([1, 2], [1, 2]) and not same_value(True, 1) and not same_value(1, True)
    assert same_value(0.1 + 0.2, 0.3) and not same_value("1", 1)


def test_calculator_tool_is_safe_arithmetic():
    assert calculate("(37 * 24) - 150") == "738"
    assert calculate("7 / 2") == "3.5"
    assert calculate("2 ^ 10") == "1024"
    assert calculate("9 ** 99999").startswith("error")
    assert calculate("__import__('os').system('id')").startswith("error")
    assert calculate("1/0").startswith("error")
    assert calculate("x" * 500).startswith("error")
    assert find_tool_call("so <calculator>3*4</calculator>") == ("calculator", {"expression": "3*4"})
    assert find_tool_call("so <calculator>3*4") == ("calculator", {"expression": "3*4"})
    assert find_tool_call(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    ) == (
        "calculator",
        {"expression": "1+1"},
    )
    assert find_tool_call("Answer: 5") is None


def test_calculator_tools_multi_turn():
    env = make_env("calculator_tools")
    r = env.reset(seed=1)
    assert r.observation.tools[0].name == "calculator" and r.observation.stop.strings == ["</calculator>"]
    answer = env._episode.problem.answer
    s = env.step({"text": "First <calculator>48*60</calculator>"})
    assert not s.done and s.observation.text == "Calculator result: 2880" and env.state.tool_calls == 1
    assert s.observation.messages[-2]["role"] == "assistant" and s.observation.messages[-1]["role"] == "user"
    s = env.step({"tool": "calculator", "arguments": {"expression": "2880 - 7"}})
    assert s.observation.text == "Calculator result: 2873"
    s = env.step({"text": f"Answer: {answer}"})
    assert s.terminated and s.reward == pytest.approx(1.0) and s.success
    assert s.components["used_calculator"] == 1.0
    # the right answer without the tool scores nothing
    env.reset(seed=1)
    s = env.step({"text": f"Answer: {answer}"})
    assert s.reward == 0.0 and not s.success
    # calling forever hits the turn limit
    env.reset(seed=1)
    for _ in range(env.max_turns):
        s = env.step({"tool": "calculator", "arguments": {"expression": "1+1"}})
    assert s.truncated and s.reward == 0.0 and s.success is False
