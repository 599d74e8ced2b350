"""A package's chat template is hostile input: loops nested in loops, values doubled by `~` or `+`, and filters
asked for gigabytes (center, indent, replace, join) each end in one ChatError, quickly and without the memory;
a tokenizer_config.json nested too deep is a ChatError at chat time. Real templates over long conversations
still render, and a render leaves no tracer behind."""

import hashlib
import json
import shutil
import sys
import time

import edgelm.runtime as rt
import pytest
from edgelm.runtime.errors import ChatError, DeadlineError
from edgelm.runtime.text.chat_bounds import deadline
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


BIG = "{% set a = 'x' * 1000000 %}"


def _chain(name: str, count: int = 40) -> str:
    """`{% set a1 = [a0, a0] %}` ... : a value nested in itself `count` times, 2**count items when walked."""
    return "".join(f"{{% set {name}{i + 1} = [{name}{i}, {name}{i}] %}}" for i in range(count))


@pytest.mark.parametrize(
    "source",
    [
        "{{ lipsum(100000000) }}",
        "{{ lipsum(10, max=100000000) }}",
        "{{ 'x'.ljust(1000000000) }}",
        "{{ 'x'.zfill(1000000000) }}",
        "{{ 'x'.center(1000000000) }}",
        "{{ ('x' * 100000).replace('x', 'y' * 100000) }}",
        BIG + "{{ 'y'.join([a, a, a]) }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
        "{% set a0 = [1] %}{% set b0 = [1] %}" + _chain("a") + _chain("b") + "{{ a40 == b40 }}",
        "{% set ns = namespace(t=(1,)) %}{% for i in range(60) %}{% set ns.t = (ns.t, ns.t) %}{% endfor %}{{ {ns.t: 1} }}",
        "{% set ns = namespace(d={}) %}{% for i in range(60) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}{{ ns.d|tojson }}",
        "{% macro f(x, n) %}{% if n %}{{ f([x, x], n - 1) }}{% else %}{{ x|length }}{% endif %}{% endmacro %}{{ f([1], 60) }}",
        "{% set ns = namespace(l=['x']) %}{% for i in range(10) %}{% set ns.l = [ns.l] * 1000 %}{% endfor %}{{ ns.l|length }}",
        "{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n > 0 }}",
        "{{ [1]|batch(1000000000, 'x')|list|length }}",
        "{{ [1]|slice(1000000000)|list|length }}",
        "{{ ('x' * 1000000)|wordwrap(1) }}",
        "{{ range(1000)|list|tojson(indent=100000000) }}",
        BIG + "{{ ('%(a)s' * 1000)|format(a=a) }}",
        BIG + "{{ ('%(a)s' * 1000) % {'a': a} }}",
        BIG + "{{ ('{0}' * 1000).format(a) }}",
        BIG + "{{ ([a] * 1000)|join }}",
        BIG + "{{ [a, a]|string }}",
        "{{ ([[0]] * 100000)|sum(start=[]) }}",
        "{% for i in range(100000) %}{% set x = ('x' * 1000000)|upper %}{% endfor %}",
        BIG + "{% set b %}{% for i in range(100000) %}{{ a }}{% endfor %}{% endset %}{{ b|length }}",
        "{{ (1).to_bytes(1000000000, 'big') }}",
        "{{ ('x' * 1000000).encode().center(1000000000) }}",
        "{{ ('\\t' * 1000).expandtabs(1000000) }}",
        "{{ ('x' * 1000000).translate({120: 'y' * 1000000}) }}",
        "{{ [1]|pprint }}",
    ],
    ids=["lipsum", "lipsum-words", "ljust", "zfill", "str-center", "str-replace", "str-join", "nested-printed",
         "nested-compared", "nested-hashed", "nested-dicts", "nested-by-macro", "repeated-nesting", "squaring",
         "batch-fill", "slice", "wordwrap", "tojson-indent", "format-fields", "percent-fields", "str-format-fields",
         "join-repeated", "string-of-list", "sum-of-lists", "work-in-a-loop", "block-set", "int-to-bytes",
         "bytes", "expandtabs", "translate", "pprint"],
)  # fmt: skip
def test_builtins_that_multiply_size_or_time_are_bounded(source):
    """Work inside Jinja's filters, globals and methods counts: each of these ran for minutes or took gigabytes."""
    with pytest.raises(ChatError, match="too large|units of work|unsafe|No filter named") as caught:
        ChatTemplate(source).render(HI)  # refused before the value is built, not by a MemoryError or its length
    assert "\n" not in str(caught.value)


def test_a_render_stops_at_its_deadline():
    slow = ChatTemplate("{% for i in range(100000) %}{% for j in range(10) %}{% endfor %}{% endfor %}")
    with deadline(time.monotonic() - 1), pytest.raises(DeadlineError, match="deadline"):
        slow.render(HI)
    with deadline(time.monotonic() + 600):
        assert ChatTemplate(CHATML).render(HI).startswith("<|im_start|>user")


def test_what_real_templates_use_still_renders():
    messages = [{"role": ("user", "assistant")[i % 2], "content": f" message {i} "} for i in range(3000)]
    source = (
        "{% set ns = namespace(last=messages|length - 1, seen=[]) %}"
        "{% for message in messages %}{% set index = (messages|length - 1) - loop.index0 %}"
        "{% if message['role'] == 'user' and message.content.strip().startswith('message') %}"
        "{{ '<|user|>' + message['content']|trim + '\\n' }}{% else %}{{ message.content.split()|join(' ') }}"
        "{% endif %}{% endfor %}{{ {'tools': [{'name': 'x', 'args': [1, 2]}]}|tojson(indent=4) }}"
        "{{ lipsum(1, html=False)|length > 0 }}{{ '%s-%d'|format('a', 3) }}{{ messages[::-1][0].role }}"
    )
    text = ChatTemplate(source).render(messages)
    assert text.count("<|user|>") == 1500 and '"args": [\n' in text and text.endswith("Truea-3assistant")
