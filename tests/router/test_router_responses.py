"""/v1/responses through `vriksha router`: routed like chat, a conversation kept on its replica by the
session header, and GET /v1/responses/{id} found on whichever replica stored it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.router.conftest import Router

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def router(replicas, router_model_dir, tmp_path_factory):
    r = Router(router_model_dir, tmp_path_factory.mktemp("router-responses"), replicas)
    r.start()
    yield r
    r.stop()


def test_a_conversation_through_the_router(router, replicas):
    model = httpx.get(f"{replicas[0].url}/v1/models", timeout=10).json()["data"][0]["id"]
    session = {"x-session-id": "conversation-1"}
    with openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        first = c.responses.create(
            model=model, input="Hello there", temperature=0, max_output_tokens=6, extra_headers=session
        )
        second = c.responses.create(
            model=model, previous_response_id=first.id, input="And then?", temperature=0, max_output_tokens=6,
            extra_headers=session,
        )  # fmt: skip
        assert second.previous_response_id == first.id
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        events = list(c.responses.create(model=model, input="Stream", max_output_tokens=4, stream=True))
        assert events[0].type == "response.created" and events[-1].type in (
            "response.completed",
            "response.incomplete",
        )
        for r in (first, second, events[-1].response):
            assert c.responses.retrieve(r.id).id == r.id
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve("resp_unknown")
