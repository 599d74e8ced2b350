"""Chat templates render exactly as transformers' apply_chat_template renders them; bad messages and bad
templates each raise one ChatError naming the field."""

import json
from types import SimpleNamespace

import pytest
from edgelm.runtime.errors import ChatError
from edgelm.runtime.text.chat_template import DEFAULT_STOP, ChatTemplate, check_messages

CHATML = (  # Qwen2.5's shape: a default system message when none is given
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (  # bos_token, trim, a system message pulled out first, strftime_now, tojson
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] | trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = 'Today is ' + strftime_now('%Y') + '.' %}\n"
    "{%- endif %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"
    "{#- tools is {{ tools | tojson }} #}"
)
ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
ALTERNATING = (  # raise_exception, namespace, tojson with options, loop controls, the generation tag
    "{% set ns = namespace(turns=0) %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '[SYS] ' + message['content'] | tojson + '\\n' }}{% continue %}{% endif %}"
    "{% if (message['role'] == 'user') != (ns.turns % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set ns.turns = ns.turns + 1 %}"
    "{% if message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% else %}{% generation %}{{ message['content'] }}{% endgeneration %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{{ {'turns': ns.turns, 'note': '<b>&</b>', 'é': 1} | tojson(indent=1, sort_keys=True) }}"
)
PARTS = """{% for message in messages %}
{{ message['role'] }}:
{%- if message['content'] is string %} {{ message['content'] }}
{%- else %}
{%- for part in message['content'] %}
{%- if part['type'] == 'text' %} [{{ part['text'] }}]{% endif %}
{%- endfor %}
{%- endif %}

{% endfor %}
{% if add_generation_prompt %}assistant:{% endif %}"""

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello there!"}],
    "system": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name three <colours> & \"shapes\"?"},
    ],
    "turns": [
        {"role": "user", "content": "Émile asked: 1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And\ntwice that?"},
    ],
}
PART_MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": [{"type": "text", "text": "Look at"}, {"type": "text", "text": "this"}]},
]


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    """A transformers tokenizer folder with Llama-style special tokens, and a way to set its chat template."""
    from checkpoints import build_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    tokenizer = build_tokenizer(folder)
    tokenizer.add_special_tokens(
        {"bos_token": "<|begin_of_text|>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    )
    tokenizer.save_pretrained(folder)
    return folder


GPT2 = SimpleNamespace(positions="learned")  # a GPT-2-family package: the default template serves it


def _both(folder, template):
    """(transformers' AutoTokenizer, our ChatTemplate) reading the same tokenizer_config.json."""
    from transformers import AutoTokenizer

    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours = ChatTemplate.from_package(SimpleNamespace(folder=folder, arch=GPT2, manifest={}))
    return AutoTokenizer.from_pretrained(folder), ours


@pytest.mark.parametrize("name", ["CHATML", "LLAMA3", "ZEPHYR", "ALTERNATING", "PARTS"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_transformers(tokenizer_folder, name, add_generation_prompt):
    reference, ours = _both(tokenizer_folder, globals()[name])
    assert ours.special_tokens["bos_token"] == "<|begin_of_text|>"
    conversations = list(CONVERSATIONS.values()) + ([PART_MESSAGES] if name == "PARTS" else [])
    for messages in conversations:
        if name == "ALTERNATING" and messages is CONVERSATIONS["system"]:
            messages = messages[:2]
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_named_templates_use_default(tokenizer_folder):
    reference, ours = _both(
        tokenizer_folder, [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": ZEPHYR}]
    )
    messages = CONVERSATIONS["turns"]
    assert ours.render(messages) == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_template_stop_is_what_follows_an_answer():
    assert ChatTemplate(CHATML).stop == ("<|im_end|>",)
    assert ChatTemplate(ZEPHYR, {"eos_token": "</s>"}).stop == ("</s>",)
    assert ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").stop == ()


def test_default_template_and_stop():
    template = ChatTemplate.default()
    assert template.stop == DEFAULT_STOP
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]},
    ]
    assert (
        template.render(messages)
        == "System: You are terse.\nUser: Hello!\nAssistant: Hi.\nUser: Two\nparts\nAssistant:"
    )
    assert template.render(messages[:2], add_generation_prompt=False) == "System: You are terse.\nUser: Hello!\n"


def test_package_without_template_gets_default(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    listed = ChatTemplate.from_package(
        SimpleNamespace(folder=tmp_path, arch=GPT2, manifest=SimpleNamespace(files={"tokenizer_config.json": {}}))
    )
    assert listed.is_default and listed.special_tokens == {"eos_token": "<|endoftext|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'x' }}"}))
    unlisted = ChatTemplate.from_package(
        SimpleNamespace(folder=tmp_path, arch=GPT2, manifest=SimpleNamespace(files={"model.onnx": {}}))
    )
    assert unlisted.is_default  # a file the manifest does not list is never read


@pytest.mark.parametrize(
    "messages, param, says",
    [
        ("Hello", "messages", "must be a list"),
        ({"role": "user", "content": "Hi"}, "messages", "must be a list"),
        ([], "messages", "messages is empty"),
        (["Hi"], "messages[0]", "must be an object"),
        ([{"role": "robot", "content": "Hi"}], "messages[0].role", "must be one of system, user, assistant"),
        ([{"content": "Hi"}], "messages[0].role", "got None"),
        ([{"role": "user", "content": 3}], "messages[0].content", "must be a string or a list of text parts"),
        ([{"role": "user"}], "messages[0].content", "got NoneType"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content[0]",
            "text only",
        ),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0]", "text part"),
        ([{"role": "user", "content": "Hi", "name": 7}], "messages[0].name", "must be a string"),
    ],
)
def test_bad_messages(messages, param, says):
    with pytest.raises(ChatError, match=says) as caught:
        ChatTemplate.default().render(messages)
    assert caught.value.param == param and "\n" not in str(caught.value)


def test_developer_role_reads_as_system():
    assert check_messages([{"role": "developer", "content": "Be brief."}]) == [
        {"role": "system", "content": "Be brief."}
    ]


@pytest.mark.parametrize(
    "source, param, says",
    [
        (["not", "a", "template"], None, "is a list, not a string"),
        ({"default": "x"}, None, "is a dict, not a string"),
        ("{% for m in messages %}", None, "not a valid Jinja template"),
        ("x" * 300_000, None, "over the 200000 allowed"),
        (ALTERNATING, "messages", "Conversation roles must alternate"),
        ("{{ messages.__class__.__mro__ }}", "messages", "cannot render"),
        ("{{ messages.append(1) }}", "messages", "cannot render"),  # the immutable sandbox
        ("{{ 'x' * 100000000 }}", "messages", "too large"),
        ("{{ 2 ** 100000000 }}", "messages", "too large"),
        ("{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}", "messages", "over 1048576 characters"),
        ("{{ messages[0]['content'] + 1 }}", "messages", "cannot render"),
        ("{{ undefined_thing.attribute }}", "messages", "cannot render"),
    ],
)
def test_bad_templates(source, param, says):
    messages = [{"role": "assistant", "content": "first"}]
    with pytest.raises(ChatError, match=says) as caught:
        ChatTemplate(source).render(messages)
    assert caught.value.param == param and "\n" not in str(caught.value)


def test_unreadable_tokenizer_config_fails_at_chat_time(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    template = ChatTemplate.from_package(SimpleNamespace(folder=tmp_path, arch=GPT2, manifest={}))
    with pytest.raises(ChatError, match="cannot read .*tokenizer_config.json.*--chat-template"):
        template.render([{"role": "user", "content": "Hi"}])


def test_special_tokens_as_transformers_reads_them(tokenizer_folder, tmp_path):
    """A current tokenizer_config.json (with added_tokens_decoder) rules; in a legacy one, special_tokens_map.json wins."""
    from transformers import AutoTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((tokenizer_folder / name).read_bytes())
    folder = SimpleNamespace(folder=tmp_path, arch=GPT2, manifest={})
    assert (
        ChatTemplate.from_package(folder).special_tokens == AutoTokenizer.from_pretrained(tmp_path).special_tokens_map
    )
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": "x"}))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|im_start|>"}))
    expected = AutoTokenizer.from_pretrained(tmp_path).special_tokens_map
    assert expected["bos_token"] == "<|im_start|>"
    assert ChatTemplate.from_package(folder).special_tokens == expected
