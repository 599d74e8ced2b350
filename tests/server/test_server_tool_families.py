"""The server reads each family's own tool-call format: a package whose chat template is Qwen2.5's writes calls in
`<tool_call>` blocks, one whose template is Llama 3.1's writes the call's JSON as the whole answer. The template is
set on the tiny model (its weights random, its answers scripted: server_harness.ScriptedEngine), so what is tested
is that the server renders the tools with the package's template and reads the answer in its format."""

import json

import openai
import pytest
from chat_templates import LLAMA31, QWEN25
from edgelm.runtime import load
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.text.chat_template import ChatTemplate
from server_harness import InProcessServer, scripted
from weather_tools import WEATHER_UNDESCRIBED

FAMILIES = {
    "qwen2.5": (QWEN25, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "llama3.1": (LLAMA31, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
}
TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tiny_package_long):
    model = load(tiny_package_long)
    template, answer = FAMILIES[request.param]
    model.chat_template = ChatTemplate(template, TOKENS)
    model.script = scripted(model)
    model.script.say(answer)
    server = InProcessServer(model, Limits(max_tokens=300), max_batch=0, model_names=("tiny",))
    yield model, server
    server.stop()


def test_each_family_renders_the_tools_and_its_calls_are_read(family):
    model, server = family
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    options = dict(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_UNDESCRIBED], temperature=0
    )
    choice = client.chat.completions.create(**options, max_tokens=200).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(**options, max_tokens=200, stream=True))
    parts = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt = model.chat_template.render(options["messages"], tools=[WEATHER_UNDESCRIBED])
    assert "get_weather" in prompt  # the template's own rendering of the tools
