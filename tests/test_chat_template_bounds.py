"""A package's chat template is hostile input: loops nested in loops, values doubled by `~` or `+`, and filters
asked for gigabytes (center, indent, replace, join) each end in one ChatError, quickly and without the memory;
a tokenizer_config.json nested too deep is a ChatError at chat time. Real templates over long conversations
still render, and a render leaves no tracer behind."""

import hashlib
import json
import shutil
import sys

import edgelm.runtime as rt
import pytest
from edgelm.runtime.errors import ChatError
from edgelm.runtime.text.chat_template import ChatTemplate

HI = [{"role": "user", "content": "hi"}]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
        ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "(~)"),
        ("{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "concat"),
        ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "concat"),
        ("{{ 'x'|center(1000000000) }}", "center filter"),
        ("{{ ('x\\n' * 100000)|indent(100000) }}", "indent filter"),
        ("{{ ('x' * 100000)|replace('x', 'y' * 100000) }}", "replace filter"),
        ("{{ ('x' * 1000)|replace('', 'y' * 100000) }}", "replace filter"),
        ("{{ range(100000)|join(',' * 100000) }}", "join filter"),
        ("{{ '%1000000000s'|format('x') }}", "format string"),
        ("{{ '%.2000000000d' % 7 }}", "format string"),
        ("{{ '{:>1000000000}'.format('x') }}", "format string"),
        ("{{ '{:>{w}}'.format('x', w=1000000000) }}", "format string"),
        ("{{ '{a:>{w}}'.format_map({'a': 'x', 'w': 1000000000}) }}", "format string"),
    ],
    ids=["nested-loops", "tilde-doubling", "list-doubling", "plus-doubling", "center", "indent", "replace",
         "replace-empty", "join", "format-filter", "percent", "str-format", "str-format-nested", "format-map"],
)  # fmt: skip
def test_a_runaway_template_is_one_chat_error(source, fragment):
    with pytest.raises(ChatError, match="too large|steps") as caught:
        ChatTemplate(source).render(HI)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_a_render_leaves_the_tracer_as_it_found_it():
    before = sys.gettrace()
    ChatTemplate(CHATML).render(HI)
    with pytest.raises(ChatError):
        ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").render(HI)
    assert sys.gettrace() is before


def test_long_conversations_and_ordinary_filters_still_render():
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(5000)]
    assert ChatTemplate(CHATML).render(messages).count("<|im_start|>") == 5001
    text = ChatTemplate("{{ messages|map(attribute='content')|join(', ')|replace('hi', 'yo')|indent(2)|center(9) }}")
    assert text.render(HI) == "yo".center(9)
    assert ChatTemplate("{{ 'a' ~ 'b' ~ 1 }}{{ [1] + [2] }}{{ 'c' + 'd' }}").render(HI) == "ab1[1, 2]cd"
    assert ChatTemplate("{{ '%5s|%s'|format('a', 'b') }}{{ '%3d' % 7 }}").render(HI) == "    a|b  7"


def test_a_tokenizer_config_nested_too_deep_is_a_chat_error(tiny_package, tmp_path):
    folder = shutil.copytree(tiny_package, tmp_path / "pkg")
    config = folder / "tokenizer_config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][config.name] = {
        "size": config.stat().st_size,
        "sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ChatError, match="cannot read .*tokenizer_config.json"):
        rt.load(folder).chat(HI, max_new_tokens=2)
