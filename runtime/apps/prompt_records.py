"""What one line of a prompt file is answered with: a generate or score record in, a JSON-ready answer out.

runtime/apps/prompt_file.py reads the lines, batches them and writes these answers; the record formats are in its
docstring. Records that share their options run as one Model.batch call; a record that cannot be run is answered
{"error": "what is wrong and what to do"}, never raised.
"""

import math

from ..errors import EdgelmError, GenerationOptionError, PromptError
from ..generation_config import GenerationConfig, sampling_implied

COMMON_KEYS = ("id",)  # what a line of either task may carry besides its own keys


def generate_records(model, config: GenerationConfig, records: list) -> list:
    """One answer per record ({"prompt": ...} or {"messages": ...} with per-line options): a Completion's
    fields, {"completions": [...]} for several sequences, or {"error": ...}. Records that share their
    settings run as one batch; a batch that a prompt spoils (too long, bad ids) is rerun line by line."""
    answers, groups = [None] * len(records), []  # groups: [(settings, [(index, prompt)])]
    for index, record in enumerate(records):
        try:
            prompt, settings = _generate_request(model, config, record)
        except EdgelmError as error:
            answers[index] = {"error": str(error)}
            continue
        group = next((g for g in groups if g[0] == settings), None)
        if group is None:
            groups.append(group := (settings, []))
        group[1].append((index, prompt))
    for settings, items in groups:
        for index, answer in zip([i for i, _ in items], _complete(model, settings, [p for _, p in items])):
            answers[index] = answer
    return answers


def score_records(model, records: list, top_logprobs: int | None = None) -> list:
    """One answer per record ({"text": ...} or {"prompt": ...}, optionally "top_logprobs"): a Score's fields
    with null for a log-prob that does not exist, or {"error": ...}."""
    answers = []
    for record in records:
        try:
            unknown = sorted(set(record) - {"text", "prompt", "top_logprobs", *COMMON_KEYS})
            if unknown:
                raise PromptError(
                    f"unknown key(s) {', '.join(unknown)}: a score line has text (or prompt), top_logprobs and id"
                )
            text = _text_of(record, ("text", "prompt"))
            score = model.score(text, top_logprobs=record.get("top_logprobs", top_logprobs))
        except EdgelmError as error:
            answers.append({"error": str(error)})
            continue
        answer = score.to_dict()
        answer["logprobs"] = [v if math.isfinite(v) else None for v in answer["logprobs"]]
        answer["perplexity"] = answer["perplexity"] if math.isfinite(answer["perplexity"]) else None
        if answer["top_logprobs"] is None:
            del answer["top_logprobs"]
        answers.append(answer)
    return answers


def _generate_request(model, config: GenerationConfig, record: dict) -> tuple:
    """(prompt, settings) for one record: its per-line options over `config`, a chat rendered to token ids."""
    if "prompt" in record and "messages" in record:
        raise PromptError('the line has both "prompt" and "messages"; give one')
    if "messages" not in record:
        _text_of(record, ("prompt",))  # the missing prompt said before any unknown option
    options = {k: v for k, v in record.items() if k not in ("prompt", "messages", *COMMON_KEYS)}
    settings = model.settings(config, **sampling_implied(options)) if options else config
    if "messages" in record:
        return model.chat_prompt(record["messages"], settings)
    return record["prompt"], settings


def _text_of(record: dict, names: tuple):
    """The record's prompt (a string or token ids), under the first of `names` it has."""
    name = next((n for n in names if n in record), None)
    if name is None:
        hint = ' (or "messages" for a chat)' if names == ("prompt",) else ""
        raise PromptError(f'the line has no "{names[0]}": write {{"{names[0]}": "...", ...}}' + hint)
    return record[name]


def _complete(model, settings: GenerationConfig, prompts: list) -> list:
    """Answers for prompts that share their settings: one batch call, or one call per prompt when a prompt
    spoils the batch (too long, bad token ids, too big a batch). Other errors (onnxruntime failing) stop the job."""
    try:
        completions = model.generate(prompts, settings)
    except (PromptError, GenerationOptionError) as error:
        if len(prompts) == 1:
            return [{"error": str(error)}]
        return [answer for prompt in prompts for answer in _complete(model, settings, [prompt])]
    n = settings.num_return_sequences
    answers = []
    for i in range(len(prompts)):
        mine = completions[i * n : (i + 1) * n]
        failed = next((c.error for c in mine if c.error is not None), None)  # a row that failed alone: its line's
        rows = [_completion_fields(c) for c in mine]
        answers.append({"error": str(failed)} if failed is not None else rows[0] if n == 1 else {"completions": rows})
    return answers


def _completion_fields(completion) -> dict:
    fields = completion.to_dict()
    del fields["index"], fields["prompt_index"]  # positions in a batch, which the file does not show
    if fields["logprobs"] is None:
        del fields["logprobs"]
    return fields
