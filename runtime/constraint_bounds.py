"""What a constraint may ask, decided before any token is generated: each check a function of its own, raising
GenerationOptionError with `param` naming the option and one line saying what to change.

- choices: at most MAX_CHOICES. llguidance holds one Earley item per choice in the row after the first token, and
  fails that step above its max_items_in_row (2,000); compiling 60,000 choices takes seconds.
- bounded numbers: a JSON `number` with both a lower and an upper bound gets a bounded number of digits (a
  `multipleOf`: NUMBER_DECIMALS decimals past the range's own scale), so that a model cannot write digits until
  max_new_tokens; a `multipleOf` of the schema's own wins.
- special token texts: an answer every output of which holds a special token's text is refused (a conversation
  reads that text back as the token).
- forced text: a text every answer must write (what llguidance tokenizes as it builds a grammar) longer than the
  model's context of its longest tokens is refused unread (sampling/token_bytes.py).
"""

import math

from .errors import GenerationOptionError

MAX_CHOICES = 1_000  # half llguidance's max_items_in_row (constraint.LIMITS), which the choices' row must stay under
NUMBER_DECIMALS = 6  # decimals a bounded JSON number may have past its range's scale (0 to 1: 0.123456)
_VALUES = ("const", "enum", "default", "examples")  # keys whose values are data, not schemas


def check_choices(choices: tuple) -> None:
    """Refuse more than MAX_CHOICES choices."""
    if len(choices) > MAX_CHOICES:
        raise GenerationOptionError(
            f"choices has {len(choices):,} strings, over the {MAX_CHOICES:,} edgelm can enforce; give at most "
            f"{MAX_CHOICES:,}, or a regex or json_schema enum that describes them",
            param="choices",
        )


def bounded_numbers(schema):
    """A copy of a JSON schema (a dict) whose bounded `number` schemas, at any depth, have a `multipleOf` that
    bounds their digits (see the module's docstring); anything else as it was. No recursion: a schema may nest
    as deep as its JSON text allows."""
    root = [schema]
    stack = [(root, 0)]  # (container, key) of each value still to copy
    while stack:
        container, key = stack.pop()
        value = container[key]
        if isinstance(value, list):
            container[key] = value = list(value)
            stack += [(value, i) for i in range(len(value))]
        elif isinstance(value, dict):
            container[key] = value = dict(value)
            stack += [(value, k) for k in value if k not in _VALUES]
            step = number_step(value)
            if step is not None:
                value["multipleOf"] = step
    return root[0]


def number_step(schema: dict):
    """The multipleOf a bounded number schema gets, or None (not a number, not bounded on both sides, or a
    multipleOf of its own)."""
    kind = schema.get("type")
    if not (kind == "number" or (isinstance(kind, list) and "number" in kind)) or "multipleOf" in schema:
        return None
    low = _bound(schema, "minimum", "exclusiveMinimum", max)
    high = _bound(schema, "maximum", "exclusiveMaximum", min)
    if low is None or high is None or not high > low:
        return None
    scale = math.floor(math.log10(high - low))  # 0 to 1: 0; 0 to 0.001: -3; -273.15 to 10,000: 4
    decimals = max(NUMBER_DECIMALS, NUMBER_DECIMALS - scale)
    return float(f"1e-{decimals}")


def _bound(schema: dict, inclusive: str, exclusive: str, tighter):
    values = [v for v in (schema.get(inclusive), schema.get(exclusive)) if _number(v)]
    return tighter(values) if values else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def refuse_special_text(kind: str, text, template, specials: list) -> None:
    """GenerationOptionError(param=kind) where every answer must hold a special token's text (`specials`): what the
    matcher `template` forces from the start, or a choice. Such an answer, sent back in a conversation, reads as
    that token (the end of a turn, a new role), and the model itself never writes it as text."""
    outputs = list(text) if kind == "choices" else [template.deep_copy().compute_ff_bytes().decode("utf-8", "replace")]
    for output in outputs:
        found = next((s for s in specials if s in output), None)
        if found is not None:
            which = f"the choice {output[:80]!r}" if kind == "choices" else "every answer"
            raise GenerationOptionError(
                f"{kind}: {which} would hold {found!r}, the text of a special token of this model, which a "
                f"conversation reads back as that token; change the {kind}",
                param=kind,
            )


def no_output_line(kind: str, problem: str | None, refused: tuple | None = None) -> str:
    """The line for a constraint whose first mask fails (llguidance's `problem`, on one line), or whose forced text
    the tokenizer refused: `refused` = (its bytes, the most the model can write)."""
    if refused is None:
        return f"the {kind} constraint allows no output: {problem}; check the {kind}"
    return (
        f"the {kind} constraint forces a text of {refused[0]:,} bytes, more than this model can write within its "
        f"context (at most {refused[1]:,}); shorten what the {kind} requires"
    )
