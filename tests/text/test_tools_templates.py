"""Tools, assistant tool calls and tool results render exactly as transformers' apply_chat_template(tools=...)
renders them, for the published templates of Qwen2.5, Llama 3.1 / 3.2 and edgelm's default; SmolLM2's template
ignores tools, so edgelm writes them into its messages as SmolLM2's model card asks. Bad tools and bad tool
messages each raise one ChatError naming the field."""

import copy
import json
from types import SimpleNamespace

import pytest
from chat_templates import LLAMA31, LLAMA32, QWEN25, SMOLLM2
from edgelm.runtime.errors import ChatError
from edgelm.runtime.text.chat_template import DEFAULT_TEMPLATE, ChatTemplate
from edgelm.runtime.text.tools import tool_format
from weather_tools import WEATHER_DESCRIBED_UNIT

CLOCK = {"type": "function", "function": {"name": "now", "description": "The time <in UTC> & date."}}
TOOLS = [WEATHER_DESCRIBED_UNIT, CLOCK]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}

ASK = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Zürich?"},
]
ROUND_TRIP = ASK + [  # a call, its result, the answer, and the next turn
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "unit": "celsius"}'},
    {"role": "assistant", "content": "21 °C."},
    {"role": "user", "content": "And the time?"},
]
PARALLEL = [  # two calls in one answer, two results
    {"role": "user", "content": "Weather in Zürich, and the time?"},
    {"role": "assistant", "content": "Checking both.", "tool_calls": [CALL, CALL2]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]
CONVERSATIONS = {"ask": ASK, "round_trip": ROUND_TRIP, "parallel": PARALLEL, "no_system": ROUND_TRIP[1:]}


def _for_transformers(messages):
    """The conversation as transformers' docs write it: a call's arguments as a dict."""
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return messages


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    from checkpoints import build_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    tokenizer = build_tokenizer(folder)
    tokenizer.add_special_tokens(
        {"bos_token": "<|begin_of_text|>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    )
    tokenizer.save_pretrained(folder)
    return folder


def _both(folder, template):
    from transformers import AutoTokenizer

    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    ours = ChatTemplate.from_package(
        SimpleNamespace(folder=folder, arch=SimpleNamespace(positions="rope"), manifest={})
    )
    return AutoTokenizer.from_pretrained(folder), ours


@pytest.mark.parametrize("name", ["QWEN25", "LLAMA31", "LLAMA32", "DEFAULT_TEMPLATE"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [True, False])
def test_tools_render_as_transformers_renders_them(tokenizer_folder, name, conversation, with_tools):
    source = globals()[name]
    messages = CONVERSATIONS[conversation]
    if name.startswith("LLAMA") and conversation == "parallel":
        messages = [m for m in messages if m.get("tool_call_id") != "call_2"]  # its template takes one call
        messages[1] = {**messages[1], "tool_calls": [CALL]}
    reference, ours = _both(tokenizer_folder, source)
    tools = TOOLS if with_tools else None
    for add_generation_prompt in (True, False):
        expected = reference.apply_chat_template(
            _for_transformers(messages), tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert ours.render(messages, add_generation_prompt=add_generation_prompt, tools=tools) == expected


def test_round_trip_prompt_for_qwen():
    """The whole prompt of a tool round trip, spelled out: what Qwen2.5 was trained on."""
    prompt = ChatTemplate(QWEN25).render(ROUND_TRIP, tools=[CLOCK])
    assert prompt == (
        "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "now", "description": "The time <in UTC> & date."}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temperature": 21, "unit": "celsius"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n21 °C.<|im_end|>\n<|im_start|>user\nAnd the time?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_default_template_writes_its_documented_tool_format():
    prompt = ChatTemplate.default().render(PARALLEL, tools=[CLOCK])
    assert prompt == (
        'Tools: to call functions, answer with <tool_call>{"name": NAME, "arguments": {...}}</tool_call> for each '
        "call. The functions, as JSON:\n"
        '{"type": "function", "function": {"name": "now", "description": "The time <in UTC> & date."}}\n'
        "User: Weather in Zürich, and the time?\n"
        'Assistant: Checking both. <tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>'
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>\n'
        "Tool: 21\nTool: 12:00\nAssistant:"
    )
    assert tool_format(ChatTemplate.default()).name == "edgelm"
    content, calls = tool_format(DEFAULT_TEMPLATE).parse(prompt.split("Assistant: ", 1)[1].split("\n", 1)[0])
    assert content == "Checking both." and [(c.name, c.arguments_json) for c in calls] == [
        ("get_weather", '{"city": "Zürich"}'),
        ("now", "{}"),
    ]


def test_smollm2_gets_its_model_cards_tool_prompt(tokenizer_folder):
    """SmolLM2's template never reads `tools`: transformers would drop them, edgelm writes them as SmolLM2's model
    card does (a system prompt, calls as `<tool_call>[...]</tool_call>`, results as user messages)."""
    reference, ours = _both(tokenizer_folder, SMOLLM2)
    assert not ours.reads_tools and tool_format(ours).name == "smollm2"
    prompt = ours.render(ROUND_TRIP, tools=[CLOCK])
    tools_json = json.dumps([CLOCK], ensure_ascii=False)
    expected = [
        {
            "role": "system",
            "content": "You are terse.\n\nYou are an expert in composing functions. You are given a question and a "
            "set of possible functions.\nBased on the question, you will need to make one or more function/tool calls "
            "to achieve the purpose.\nIf none of the functions can be used, point it out and refuse to answer.\nIf the "
            "given question lacks the parameters required by the function, also point it out.\n\nYou have access to "
            f"the following tools:\n<tools>{tools_json}</tools>\n\nThe output MUST strictly adhere to the following "
            "format, and NO other text MUST be included.\nThe example format is as follows. Please make sure the "
            "parameter type is correct. If no function call is needed, please make the tool calls an empty list "
            '\'[]\'.\n<tool_call>[\n{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": '
            '"value2"}},\n... (more tool calls as required)\n]</tool_call>',
        },
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n]</tool_call>',
        },
        {"role": "user", "content": '<tool_response>\n{"temperature": 21, "unit": "celsius"}\n</tool_response>'},
        *ROUND_TRIP[4:],
    ]
    assert prompt == reference.apply_chat_template(expected, tokenize=False, add_generation_prompt=True)
    results = ours.render(PARALLEL)  # two results in a row become one user message, as Qwen2.5 writes them
    assert (
        "<|im_start|>user\n<tool_response>\n21\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>"
        in results
    )


def test_a_template_without_tools_support_gets_edgelms_format():
    plain = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    prompt = ChatTemplate(plain).render(PARALLEL, tools=[CLOCK])
    assert prompt.startswith("[system] Tools: to call functions, answer with <tool_call>")
    assert (
        '[assistant] Checking both.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>'
        in prompt
    )
    assert prompt.endswith("[user] <tool_response>\n21\n</tool_response>\n<tool_response>\n12:00\n</tool_response>\n")
    assert tool_format(plain).name == "edgelm"


def test_formats_are_told_from_the_template_and_model_type(tokenizer_folder):
    assert [tool_format(t).name for t in (QWEN25, LLAMA31, LLAMA32, SMOLLM2)] == [
        "hermes",
        "llama3",
        "llama3",
        "smollm2",
    ]
    package = SimpleNamespace(chat_template=ChatTemplate("{{ messages }}", model_type="qwen2"))
    assert tool_format(package).name == "hermes"  # a Qwen2 fine-tune whose template says nothing of tools
    _, ours = _both(tokenizer_folder, LLAMA32)
    folder = SimpleNamespace(
        folder=tokenizer_folder, arch=SimpleNamespace(model_type="llama", positions="rope"), manifest={}
    )
    assert tool_format(ChatTemplate.from_package(folder)).name == "llama3" and tool_format(ours).name == "llama3"
    with pytest.raises(TypeError, match="ChatTemplate.from_package"):
        tool_format(folder)  # a package is not read behind the caller's back


@pytest.mark.parametrize(
    "tools, param, says",
    [
        ({"type": "function"}, "tools", "must be a list"),
        (["get_weather"], "tools[0]", '"type": "function"'),
        ([{"type": "code_interpreter"}], "tools[0]", '"type": "function"'),
        ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name", "letters, digits"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name", "1 to 64"),
        ([{"type": "function", "function": {}}], "tools[0].function.name", "got None"),
        ([CLOCK, CLOCK], "tools[1]", "given twice"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "tools[0].function.parameters",
            "of an object",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": []}}],
            "tools[0].function.parameters",
            "of an object",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": []}}}],
            "tools[0].function.parameters.properties",
            "mapping names",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "a"}}}],
            "tools[0].function.parameters.required",
            "list of property names",
        ),
        (
            [{"type": "function", "function": {"name": "f", "description": 3}}],
            "tools[0].function.description",
            "string",
        ),
        (
            [{"type": "function", "function": {"name": "f", "strict": "yes"}}],
            "tools[0].function.strict",
            "true or false",
        ),
        ([{"type": "function", "function": {"name": "f", "params": {}}}], "tools[0]", "unknown field 'params'"),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "default": float("nan")}},
                }
            ],
            "tools[0]",
            "not JSON data",
        ),
        ([CLOCK] * 129, "tools", "at most 128"),
    ],
)
def test_bad_tools(tools, param, says):
    with pytest.raises(ChatError, match=says) as caught:
        ChatTemplate(QWEN25).render(ASK, tools=tools)
    assert caught.value.param == param and "\n" not in str(caught.value)


def _with(*messages):
    return ASK + list(messages)


@pytest.mark.parametrize(
    "messages, param, says",
    [
        (_with({"role": "tool", "tool_call_id": "call_1", "content": "21"}), "messages[2]", "neither an assistant"),
        (
            _with({"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "21"}),
            "messages[3].tool_call_id",
            "must name the call",
        ),
        (
            _with(
                {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_9", "content": "21"}
            ),
            "messages[3].tool_call_id",
            "'call_9' answers no open call",
        ),
        (
            _with(
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21"},
                {"role": "tool", "tool_call_id": "call_1", "content": "21"},
            ),
            "messages[4].tool_call_id",
            "answers no open call",
        ),
        (
            _with(
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "user", "content": "Well?"},
                {"role": "tool", "tool_call_id": "call_1", "content": "21"},
            ),
            "messages[4]",
            "neither an assistant",
        ),
        (_with({"role": "assistant", "tool_calls": "get_weather"}), "messages[2].tool_calls", "must be a list"),
        (_with({"role": "assistant", "tool_calls": [{"id": "c"}]}), "messages[2].tool_calls[0]", '"type": "function"'),
        (
            _with({"role": "assistant", "tool_calls": [{**CALL, "id": ""}]}),
            "messages[2].tool_calls[0].id",
            "non-empty string",
        ),
        (_with({"role": "assistant", "tool_calls": [CALL, CALL]}), "messages[2].tool_calls[1].id", "given twice"),
        (
            _with({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{city: 1}"}}]}),
            "messages[2].tool_calls[0].function.arguments",
            "is not JSON text",
        ),
        (
            _with({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]}),
            "messages[2].tool_calls[0].function.arguments",
            "must be a JSON object, got list",
        ),
        (
            _with({"role": "assistant", "tool_calls": [{**CALL, "function": {"arguments": "{}"}}]}),
            "messages[2].tool_calls[0].function.name",
            "non-empty string",
        ),
        (_with({"role": "tool", "tool_call_id": "c", "content": None}), "messages[2].content", "got NoneType"),
        (
            _with(
                {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": 21}
            ),
            "messages[3].content",
            "string or a list of text parts",
        ),
    ],
)
def test_bad_tool_messages(messages, param, says):
    with pytest.raises(ChatError, match=says) as caught:
        ChatTemplate(QWEN25).render(messages, tools=TOOLS)
    assert caught.value.param == param and "\n" not in str(caught.value)


def test_arguments_given_as_a_dict_and_empty_tool_calls_are_read():
    as_dict = _with(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
        }
    )
    assert ChatTemplate(QWEN25).render(as_dict) == ChatTemplate(QWEN25).render(
        _with({"role": "assistant", "content": "", "tool_calls": [CALL]})
    )
    plain = _with({"role": "assistant", "content": "Hi.", "tool_calls": []})
    assert ChatTemplate(QWEN25).render(plain) == ChatTemplate(QWEN25).render(
        _with({"role": "assistant", "content": "Hi."})
    )


def test_responses_api_tools_read_as_chat_tools():
    flat = [{"type": "function", **CLOCK["function"]}]
    assert ChatTemplate(QWEN25).render(ASK, tools=flat) == ChatTemplate(QWEN25).render(ASK, tools=[CLOCK])
    with pytest.raises(ChatError, match="unknown field 'params'"):
        ChatTemplate(QWEN25).render(ASK, tools=[{"type": "function", "name": "f", "params": {}}])


def test_a_llama_template_without_tools_support_gets_llamas_words():
    """A Llama 3.0-style template (no tools): the tools as Llama 3.1's template words them, a call as the JSON
    answer, each result its own ipython message."""
    plain = (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}"
        "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    prompt = ChatTemplate(plain).render(PARALLEL, tools=[CLOCK])
    assert tool_format(plain).name == "llama3"
    assert prompt.startswith(
        "<|start_header_id|>system<|end_header_id|>\n\nYou have access to the following functions. To call a "
        'function, please respond with JSON for a function call.Respond in the format {"name": function name, '
        '"parameters": dictionary of argument name and its value}.Do not use variables.\n\n{\n    "type": "function",'
    )
    assert (
        '<|start_header_id|>assistant<|end_header_id|>\n\nChecking both.\n{"name": "get_weather", "parameters": '
        '{"city": "Zürich"}}; {"name": "now", "parameters": {}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n21<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n12:00<|eot_id|>"
    ) in prompt
