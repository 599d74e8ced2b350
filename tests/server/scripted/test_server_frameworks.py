"""Agent frameworks against `edgelm serve`'s structured output and tools, offline (127.0.0.1 only): LangChain's
ChatOpenAI `with_structured_output` (json_schema and json_mode) and `bind_tools`, and litellm's
`completion(response_format=...)`. The tiny model answers a script (server_harness.ScriptedEngine) that the
constraint must also allow, so each answer is known and still passes through the constraint."""

import json
import os
from typing import Literal

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm reads its price list from the package

import langchain_openai  # noqa: E402
import litellm  # noqa: E402
import pytest  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from server_harness import serve_alone  # noqa: E402

TRIP = '{"city":"Paris","days":3}'  # compact JSON: how the constraint writes it


class Trip(BaseModel):
    city: Literal["Paris", "Rome"]
    days: int


@pytest.fixture(scope="module")
def server(model):
    s = serve_alone(model, max_tokens=200)
    yield s
    s.stop()


def chat_model(server):
    return langchain_openai.ChatOpenAI(
        model="tiny", base_url=server.url + "/v1", api_key="unused", temperature=0, max_tokens=100, max_retries=0
    )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, model, method):
    # a forced call's arguments are laid out as templates write calls: ", " and ": " (text/tool_grammar.py)
    call = '<tool_call>{"name": "Trip", "arguments": {"city": "Paris", "days": 3}}</tool_call>'
    model.script.say(TRIP if method == "json_schema" else call)
    trip = chat_model(server).with_structured_output(Trip, method=method).invoke("Plan a trip")
    assert trip == Trip(city="Paris", days=3)


def test_langchain_json_mode(server, model):
    model.script.say(TRIP)
    answer = chat_model(server).with_structured_output(None, method="json_mode").invoke("Plan a trip, as JSON")
    assert answer == {"city": "Paris", "days": 3}


def test_langchain_bind_tools(server, model):
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    model.script.say('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    message = chat_model(server).bind_tools([get_weather]).invoke("Weather in Oslo?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize("response_format", [Trip, {"type": "json_object"}])
def test_litellm_response_format(server, model, response_format):
    model.script.say(TRIP)
    answer = litellm.completion(
        model="openai/tiny",
        api_base=server.url + "/v1",
        api_key="unused",
        messages=[{"role": "user", "content": "Plan a trip"}],
        response_format=response_format,
        temperature=0,
        max_tokens=100,
    )
    assert json.loads(answer.choices[0].message.content) == {"city": "Paris", "days": 3}


def test_openai_agents_on_the_responses_api(server, model):
    """The OpenAI Agents SDK's Responses model: a tool call, its result sent back, then a typed final answer."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # its traces go to OpenAI's service
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return "sunny"

    model.script.say('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>', TRIP)
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="planner",
        instructions="Plan trips.",
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=100),
        tools=[get_weather],
        output_type=Trip,
    )
    result = Runner.run_sync(agent, "Plan a trip where it is sunny")
    assert seen == ["Rome"] and result.final_output == Trip(city="Paris", days=3)
