"""Model.chat with tools: the prompt holds them, the package tells its tool format, and a streamed reply read
through the format's stream gives what parsing the whole reply gives."""

import pytest
from edgelm.runtime import ChatError, load, tool_format
from edgelm.runtime.text.chat_template import ChatTemplate

TOOLS = [{"type": "function", "function": {"name": "now", "description": "The time."}}]
ASK = [{"role": "user", "content": "What time is it?"}]
ROUND_TRIP = ASK + [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
]


@pytest.fixture(scope="module")
def qwen2_model(qwen2_package):
    return load(qwen2_package)


def test_gpt2_package_chats_with_tools_in_edgelms_format(model):
    assert (
        tool_format(model).name == "edgelm" and tool_format(ChatTemplate.from_package(model.package)).name == "edgelm"
    )
    ids, config = model.chat_prompt(
        ROUND_TRIP, model.settings(max_new_tokens=4), TOOLS
    )  # a long prompt: truncated below
    prompt = model.chat_template.render(ROUND_TRIP, tools=TOOLS)
    assert ids == model.encode(prompt, add_special_tokens=False) and "\nTool:" in config.stop
    assert prompt.startswith("Tools: ") and prompt.endswith(
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>\nTool: 12:00\nAssistant:'
    )
    reply = model.chat(ROUND_TRIP, tools=TOOLS, max_new_tokens=6, do_sample=False, truncate=True)
    stream = model.chat_stream(ROUND_TRIP, tools=TOOLS, max_new_tokens=6, do_sample=False, truncate=True)
    reader = tool_format(model).stream()
    for piece in stream:
        reader.feed(piece)
    reader.finish()
    content, calls = tool_format(model).parse(reply.text)
    assert reader.result()[0] == content and [c.name for c in reader.result()[1]] == [c.name for c in calls]


def test_a_qwen2_package_without_tools_in_its_template_gets_qwens_format(qwen2_model):
    """The tiny Qwen2 package's ChatML template never reads tools: its model_type picks Qwen2.5's format, whose
    tool prompt the messages then carry."""
    assert not qwen2_model.chat_template.reads_tools and tool_format(qwen2_model).name == "hermes"
    prompt = qwen2_model.chat_template.render(ROUND_TRIP, tools=TOOLS)
    assert "# Tools\n\nYou may call one or more functions" in prompt
    assert '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>' in prompt
    assert "<tool_response>\n12:00\n</tool_response>" in prompt
    assert qwen2_model.chat(ROUND_TRIP, tools=TOOLS, max_new_tokens=2, truncate=True).finish_reason in (
        "stop",
        "length",
    )


def test_bad_tools_fail_chat_with_one_line(model):
    with pytest.raises(ChatError, match="tools\\[0\\].function.name") as caught:
        model.chat(ASK, tools=[{"type": "function", "function": {"name": "no spaces"}}], max_new_tokens=2)
    assert caught.value.param == "tools[0].function.name"
