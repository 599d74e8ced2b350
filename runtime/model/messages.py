"""Chat on a loaded model: messages rendered by the package's chat template into a prompt whose reply ends at the
template's stop strings, then generated as any prompt is (runtime/model/generation.py).

A conversation's start (its leading system messages and tools, as the template renders them before the first user
message) is told to the engine as each prompt is rendered: the prefill breaks its passes there
(runtime/engine/passes.py), so that a cache of rows (the prefix cache, its disk store) keeps the whole start and
gives it to the next conversation with the bits a cold prefill computes.
"""

import hashlib
import json

from ..batching.batch import Batch, Stream
from ..engine.passes import MAX_STARTS
from ..errors import ChatError, GenerationOptionError
from ..generation_config import GenerationConfig
from .generation import _one


class Chat:
    """The assistant's next message: chat(), chat_stream(), chat_batch(), and the prompt they render."""

    def chat_batch(
        self,
        messages,
        config: GenerationConfig | None = None,
        *,
        tools=None,
        tool_choice=None,
        parallel_tool_calls: bool = True,
        **options,
    ) -> Batch:
        """A Batch for the assistant's next message: `messages` rendered by the package's chat template (with
        the assistant's turn opened, and OpenAI function `tools` if given), the template's stop strings added to
        the caller's. `tool_choice` "required" or {"type": "function", "function": {"name": ...}} constrains the
        reply to calls (one unless parallel_tool_calls; text/tool_grammar.py); read them out of it with
        tool_format(model).parse(completion.text)."""
        if tool_choice is not None:
            from ..text.tools import tool_format

            forced = tool_format(self).constraint(tools, tool_choice, parallel_tool_calls)
            options = {**options, forced[0]: forced[1]} if forced else options
        prompt, config = self.chat_prompt(messages, self._config(config, options), tools)
        return self.batch([prompt], config)

    def chat_prompt(self, messages, config: GenerationConfig, tools=None) -> tuple[list, GenerationConfig]:
        """(prompt token ids, settings) for the assistant's next message: `messages` (and `tools`) rendered by the
        package's chat template (with the assistant's turn opened), the template's stop strings added to `config`'s
        (settings already holding them are returned as they are)."""
        stop = self.chat_stop(config.stop)
        return self.chat_ids(messages, tools), config.with_options(stop=stop) if stop != config.stop else config

    def chat_ids(self, messages, tools=None) -> list:
        """The prompt token ids of chat_prompt, alone (its conversation start told to the engine)."""
        prompt = self.chat_template.render(messages, add_generation_prompt=True, tools=tools)
        # The template writes the start token itself where the model wants one (Llama 3's {{ bos_token }}), so the
        # tokenizer adds none, as transformers' apply_chat_template(tokenize=True) does.
        ids = self.encode(prompt, add_special_tokens=False)
        self.mark_conversation_start(messages, tools, ids)
        return ids

    def conversation_start(self, messages, tools=None) -> list:
        """The token ids every conversation that opens with `messages`' leading system messages (and `tools`)
        starts with, as the chat template renders them: what two such conversations of different first user
        messages share (ChatError where the template cannot render them)."""
        leading = list(_leading_system(messages))
        a, b = (
            self.encode(
                self.chat_template.render([*leading, {"role": "user", "content": u}], add_generation_prompt=True,
                                          tools=tools),
                add_special_tokens=False,
            )
            for u in ("a", "1")  # two messages that differ from their first character on
        )  # fmt: skip
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return a[:n]

    def mark_conversation_start(self, messages, tools, ids) -> None:
        """Tell the engine where the prompt `ids`, rendered from `messages` and `tools`, ends its conversation start
        (its leading system messages and tools), for its prefill to break there; nothing for a conversation without
        either, or an engine that prefills in one pass."""
        if not self.engine.writes_cache_in_place or not (tools or next(_leading_system(messages), None)):
            return
        try:  # the Python API's messages and tools may hold keys JSON cannot sort, or nest past the recursion limit
            leading = json.dumps([list(_leading_system(messages)), tools], sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):
            return  # no start remembered: the prompt is prefilled in whole passes
        key = hashlib.sha256(leading.encode("utf-8", "surrogatepass")).digest()  # the text itself is not kept
        with self._starts_lock:  # least recently used out: an app's own start stays while others come and go
            start = self._starts.pop(key, None)
            if start is not None:
                self._starts[key] = start
        if start is None:
            try:
                start = self.conversation_start(messages, tools)
            except ChatError:  # a template that renders no system part alone: the prompt has no start to keep
                start = []
            with self._starts_lock:
                self._starts[key] = start
                while len(self._starts) > MAX_STARTS:
                    del self._starts[next(iter(self._starts))]
        if start and ids[: len(start)] == start:
            self.engine.starts.add(start)

    def chat_stop(self, stop: tuple) -> tuple:
        """The stop strings `stop` and those of the chat template it lacks: what ends an assistant's message."""
        return (*stop, *(s for s in self.chat_template.stop if s not in stop))

    def chat(self, messages, config: GenerationConfig | None = None, *, tools=None, **options):
        """The assistant's reply to `messages` ([{"role": "user", "content": "Hi"}, ...]) as a Completion, or a
        list of them when num_return_sequences > 1. `tools`: OpenAI function definitions the template shows;
        `tool_choice` (a chat_batch() option) forces a call of them."""
        batch = self.chat_batch(messages, config, tools=tools, **options)
        completions = batch.run()
        return _one(completions) if batch.config.num_return_sequences == 1 else completions

    def chat_stream(self, messages, config: GenerationConfig | None = None, *, tools=None, **options) -> "Stream":
        """The assistant's reply as a Stream of text pieces, as stream() gives them; `completion` is set at the end.
        Feed the pieces to text.tools.tool_format(model).stream() for content and tool-call deltas."""
        batch = self.chat_batch(messages, config, tools=tools, **options)
        if batch.config.num_return_sequences != 1:
            raise GenerationOptionError("chat_stream() yields one reply; use chat_batch() to stream several rows")
        return Stream(batch)


def _leading_system(messages):
    """The system messages a conversation opens with."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "system":
            return
        yield message
