"""Constrained decoding: the one module that speaks to llguidance.

A constraint (GenerationConfig's json_schema, json_object, regex, grammar or choices, held as plain text) becomes
an llguidance grammar (grammar_text: checked once, as the request enters, by check()), then, for one tokenizer, a
compiled Grammar (Compiler: a bounded LRU per (tokenizer, kind, text)) whose row() is one row's matcher
(RowConstraint). The engine sees only ids: before each step, Masks computes every constrained row's allowed tokens
as a bitmask [rows, ceil(V / 32)] int32 (bit t of a row: token t is allowed), then per row the shorter list of
allowed or forbidden ids (an Allowed), in a thread of its own while the graph runs (llguidance releases the GIL);
Allowed.apply writes -inf over the forbidden tokens, the sampler chain's first filter (filters.py's order).

End-of-text is allowed exactly where the grammar may end (llguidance sets those bits only then); a matcher that
is stopped (nothing can follow) ends its row with "stop".

llguidance is an optional dependency (the `constrained` extra): nothing here imports it until a constraint is used.
"""

import hashlib
import json
import re
import threading
from collections import OrderedDict

import numpy as np

from ..constraint_bounds import bounded_numbers, check_choices, no_output_line, refuse_special_text
from ..constraint_text import MAX_TEXT, schema_text  # noqa: F401 (the settings' limit and form, read here too)
from ..constraint_text import one_line as _one_line
from ..errors import GenerationOptionError, install_hint
from .token_bytes import engine_tokenizer

CACHED_GRAMMARS = 64  # compiled grammars kept per process (each a few hundred KB at most, under LIMITS)
# llguidance's limits: construction fuel (~50k per ms), per-step fuel (~14k per ms) and Earley items (~20k per ms),
# lexer states (1-2 KB each) and grammar size. Above them a compile or a step fails, and edgelm refuses the request.
LIMITS = dict(
    initial_lexer_fuel=1_000_000,  # about 20 ms of lexer construction
    step_lexer_fuel=200_000,  # about 15 ms per mask at most
    step_max_items=50_000,
    max_lexer_states=50_000,  # under 100 MB
    max_grammar_size=200_000,
    max_items_in_row=2_000,
)
# Compact JSON (no whitespace between tokens): a model cannot pad its output with endless spaces or newlines.
JSON_OPTIONS = {"whitespace_flexible": False}


def llguidance(param: str = "json_schema"):
    """The llguidance module, or a GenerationOptionError(param=param) that says how to install it."""
    try:
        import llguidance as module
        import llguidance.numpy  # noqa: F401 (the bitmask helpers)
    except ImportError:
        raise GenerationOptionError(
            f"constrained generation (json_schema, json_object, regex, grammar, choices) needs llguidance: {install_hint('constrained')}",
            param=param,
        ) from None
    return module


def _limits():
    return llguidance().LLParserLimits(**LIMITS, verbose_errors=False)


def _lark_choices(choices: tuple) -> str:
    # a Lark string literal reads JSON's escapes, so each choice is exactly its text
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


_grammar_texts: OrderedDict = OrderedDict()
_grammar_lock = threading.Lock()


def grammar_text(kind: str, text) -> str:
    """The llguidance grammar for a constraint (kind one of GenerationConfig's CONSTRAINTS; text: the schema's JSON text, the regex, the Lark
    grammar, the tuple of choices, or True for json_object), checked under LIMITS; raises GenerationOptionError with
    param=kind and one line for an invalid one or an unsupported schema keyword. Cached (a bounded LRU)."""
    key = (kind, text)
    with _grammar_lock:
        if key in _grammar_texts:
            _grammar_texts.move_to_end(key)
            return _grammar_texts[key]
    if kind == "choices":
        check_choices(text)
    lg = llguidance(kind)
    matcher = lg.LLMatcher
    try:
        if kind == "json_schema":  # bounded numbers with bounded digits (constraint_bounds.py)
            schema = json.dumps(bounded_numbers(json.loads(text)), ensure_ascii=False)
            grammar = matcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        elif kind == "json_object":
            grammar = matcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
        elif kind == "regex":
            grammar = matcher.grammar_from_regex(text)
        elif kind == "grammar":
            grammar = matcher.grammar_from_lark(text)
        elif kind == "choices":
            grammar = matcher.grammar_from_lark(_lark_choices(text))
        else:
            raise GenerationOptionError(f"unknown constraint {kind!r}", param=kind)  # GenerationConfig names the known
    except ValueError as error:
        raise GenerationOptionError(f"{kind} is invalid: {_one_line(error)}", param=kind) from None
    except RecursionError:
        raise GenerationOptionError(f"{kind} is nested too deeply; flatten it", param=kind) from None
    problem = matcher.validate_grammar(grammar, None, limits=_limits())
    if problem:
        raise GenerationOptionError(_problem_line(kind, problem), param=kind)
    with _grammar_lock:
        _grammar_texts[key] = grammar
        while len(_grammar_texts) > CACHED_GRAMMARS:
            _grammar_texts.popitem(last=False)
    return grammar


def _problem_line(kind: str, problem: str) -> str:
    """llguidance's message, as one line a user can act on."""
    line = _one_line(problem)
    if line.startswith("Unimplemented keys:"):
        keys = line.split(":", 1)[1].strip().strip("[]").replace('"', "")
        return (
            f"json_schema uses keyword(s) edgelm cannot enforce: {keys}; remove them or describe the value without them"
        )
    if "fuel" in line or "too many" in line.lower() or "limit" in line.lower() or "too large" in line.lower():
        return f"{kind} is too complex to compile within edgelm's limits ({line}); simplify it"
    if kind in ("regex", "choices"):  # positions count in the grammar edgelm wraps them in, not in the option
        line = re.sub(r"^at \d+\(\d+\): ", "", line)
    return f"{kind} is invalid: {line}"


def check(config) -> None:
    """Refuse the constraint of `config` (a GenerationConfig), if it has one, where llguidance cannot read it or it
    is over LIMITS: GenerationOptionError naming the option. Needs no tokenizer; cached with grammar_text."""
    if config.constraint is not None:
        grammar_text(*config.constraint)


class Compiler:
    """Compiles constraints for one tokenizer (a package's tokenizer.json text, `encoder` its tokenizers.Tokenizer
    if built), for a model of `vocab_size` logits whose end-of-text ids are `eos_ids` and whose context holds
    `max_tokens` (None: unbounded; a forced text longer than it could hold is refused unread). The llguidance
    tokenizer is built on first use, once per process for the same tokenizer (token_bytes.py)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: tuple, max_tokens=None, encoder=None):
        self.tokenizer_json, self.vocab_size, self.eos_ids = tokenizer_json, vocab_size, tuple(eos_ids)
        self.max_tokens, self.encoder = max_tokens, encoder
        digest = hashlib.sha256(tokenizer_json.encode()).hexdigest()
        self.key = (digest, vocab_size, self.eos_ids, max_tokens)

    def tokenizer(self):
        """The llguidance tokenizer: every id with the bytes it spells (sampling/token_bytes.py)."""
        return self._tokenizer()[0]

    def special_texts(self) -> list:
        """The texts of the tokenizer's special tokens, longest first."""
        return self._tokenizer()[1].special_texts

    def _tokenizer(self) -> tuple:
        with _compiled_lock:
            found = _tokenizers.get(self.key)
        if found is not None:
            return found
        with _building_lock:  # one build at a time: a request arriving meanwhile waits for it rather than build twice
            with _compiled_lock:
                found = _tokenizers.get(self.key)
            if found is None:
                lg = llguidance()
                try:
                    found = engine_tokenizer(
                        lg, self.tokenizer_json, self.vocab_size, self.eos_ids, self.max_tokens, self.encoder
                    )
                except Exception as error:  # the package's tokenizer.json is one llguidance cannot read
                    raise GenerationOptionError(
                        f"constrained generation cannot use this package's tokenizer: {_one_line(error)}",
                        "json_schema",
                    ) from None
                with _compiled_lock:
                    found = _tokenizers.setdefault(self.key, found)
                    while len(_tokenizers) > 4:
                        _tokenizers.pop(next(iter(_tokenizers)))
        return found

    def compile(self, kind: str, text, max_new_tokens: int | None = None) -> "Grammar":
        """The compiled Grammar of a constraint; raises GenerationOptionError(param=kind) for one that fails to
        compile under LIMITS, or that cannot finish within max_new_tokens where that can be told beforehand (a
        choice or a forced start longer than that)."""
        key = (self.key, kind, text)
        with _compiled_lock:
            found = _compiled.get(key)
            if found is not None:
                _compiled.move_to_end(key)
        if found is None:
            tokenizer = self.tokenizer()
            grammar = grammar_text(kind, text)
            template = llguidance().LLMatcher(tokenizer, grammar, log_level=0, limits=_limits())
            if template.is_error():
                raise GenerationOptionError(_problem_line(kind, template.get_error()), param=kind)
            spelling = self._tokenizer()[1]
            spelling.take_refused()
            problem = _build_lexer(template, self.vocab_size)  # first: what follows would build it holding the GIL
            refused = spelling.take_refused()  # a forced text too long to write; or no output at all (a schema
            if problem is not None or refused is not None:  # that is only a reference to itself)
                raise GenerationOptionError(no_output_line(kind, problem and _one_line(problem), refused), param=kind)
            refuse_special_text(kind, text, template, self.special_texts())
            shortest = None
            if kind == "choices":
                shortest = min(len(tokenizer.tokenize_str(c)) for c in text)  # each within the bound: MAX_TEXT
            found = Grammar(kind, template, self.vocab_size, self.eos_ids or tuple(tokenizer.eos_tokens), shortest)
            with _compiled_lock:
                _compiled[key] = found
                while len(_compiled) > CACHED_GRAMMARS:
                    _compiled.popitem(last=False)
        found.check_length(max_new_tokens)
        return found


_compiled: OrderedDict = OrderedDict()  # (tokenizer key, kind, text) -> Grammar, least recently used first
_tokenizers: dict = {}
_compiled_lock = threading.Lock()
_building_lock = threading.Lock()  # held while a tokenizer's table is built


class Grammar:
    """A constraint compiled for one tokenizer: row() gives a fresh matcher (a copy of a template never advanced)."""

    def __init__(self, kind: str, template, vocab_size: int, eos_ids: tuple, shortest: int | None = None):
        # the template's lexer is built already (compile: _build_lexer)
        self.kind, self.template, self.vocab_size, self.eos_ids = kind, template, vocab_size, eos_ids
        self.forced = len(template.deep_copy().compute_ff_tokens())  # tokens every output starts with
        self.shortest = shortest  # the fewest tokens any output takes, where known (choices)

    def check_length(self, max_new_tokens: int | None) -> None:
        fewest = max(self.forced, self.shortest or 0)
        if max_new_tokens is not None and fewest > max_new_tokens:
            raise GenerationOptionError(
                f"the {self.kind} constraint needs at least {fewest} tokens, more than max_new_tokens={max_new_tokens}; "
                "raise max_new_tokens",
                param="max_new_tokens",
            )

    def row(self) -> "RowConstraint":
        return RowConstraint(self.kind, self.template.deep_copy(), self.eos_ids)


_lexer_executor = None


def _build_lexer(template, vocab_size: int) -> str | None:
    """Build the template's lexer (shared by its copies) by computing a first mask through llguidance's executor,
    which releases the GIL: nearly all of a compile's time (up to LIMITS; seconds for a pattern like
    ^((a{100}){100}){100}$), which compute_ff_bytes or compute_ff_tokens would spend holding the GIL, stalling every
    other thread of the process (the server's event loop included). Returns that mask's error (None without one):
    the grammar is refused then, before any other check."""
    global _lexer_executor
    lg = llguidance()
    with _compiled_lock:
        if _lexer_executor is None:
            _lexer_executor = lg.LLExecutor(1)
    mask = np.zeros((1, words(vocab_size)), np.int32)  # [1, words]: read by nobody
    first = template.deep_copy()
    lg.numpy.fill_next_token_bitmask_par(_lexer_executor, [(first, 0)], mask)
    return first.get_error() if first.is_error() else None


class RowConstraint:
    """One row's matcher: it advances with every id the row generates; `finished` once nothing can follow."""

    __slots__ = ("kind", "matcher", "eos_ids", "finished")

    def __init__(self, kind: str, matcher, eos_ids: tuple):
        self.kind, self.matcher, self.eos_ids, self.finished = kind, matcher, eos_ids, False

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise self.failure(self.matcher.get_error(), f" at token {token}")
        self.finished = self.matcher.is_stopped()

    def failure(self, reason, where: str = "") -> GenerationOptionError:
        """The error that ends this row when its matcher fails: llguidance's reason, on one line."""
        return GenerationOptionError(f"the {self.kind} constraint failed{where}: {_one_line(reason)}", param=self.kind)

    def forced_tokens(self, limit: int) -> list:
        """The next ids the grammar forces, whatever the model says (llguidance's compute_ff_tokens: the braces,
        keys and quotes of a schema, the rest of an enum word), at most `limit`; the matcher does not advance."""
        if self.finished or limit <= 0:
            return []
        return list(self.matcher.compute_ff_tokens()[:limit])

    def valid_prefix(self, ids: list) -> int:
        """How many leading ids of `ids` the grammar accepts from here (the matcher does not advance)."""
        return int(self.matcher.validate_tokens(list(ids))) if ids and not self.finished else 0

    @property
    def may_end(self) -> bool:
        """The output so far is complete: the grammar accepts it (end-of-text is allowed now)."""
        return self.matcher.is_accepting()


def words(vocab_size: int) -> int:
    """int32 words in one row of a bitmask over vocab_size tokens."""
    return (vocab_size + 31) // 32


class Masks:
    """The allowed tokens of a batch's rows, computed off the calling thread: start(constraints) before the graph
    runs a step, wait() after it. A row without a constraint (None) allows every token."""

    _pool = None  # one worker (llguidance spreads a batch over its own), made by the first constrained step
    _executor = None

    def __init__(self, rows: int, vocab_size: int):
        self.bitmask = np.full((rows, words(vocab_size)), -1, dtype=np.int32)  # [rows, words]
        self.vocab_size = vocab_size
        self._pending, self._allowed = None, Allowed([])

    def start(self, constraints: list) -> None:
        """Compute row r's allowed tokens from constraints[r] (None, or a finished one: every token)."""
        rows = [(c, r) for r, c in enumerate(constraints) if c is not None and not c.finished]
        self._pending = _mask_pool().submit(self._fill, rows, len(constraints))

    def _fill(self, rows: list, n: int) -> "Allowed":
        # [n, words] bitmask -> per row the ids to keep or ban, here, while the graph runs; a row whose matcher
        # fails is that row's failure alone (Allowed.failed), whatever the others' matchers do
        lg, failed = llguidance() if rows else None, {}
        if rows:
            if Masks._executor is None:
                Masks._executor = lg.LLExecutor()
            try:
                lg.numpy.fill_next_token_bitmask_par(Masks._executor, [(c.matcher, r) for c, r in rows], self.bitmask)
            except Exception:  # which row's it was is not said: each row alone
                for c, r in rows:
                    try:
                        lg.numpy.fill_next_token_bitmask(c.matcher, self.bitmask, r)
                    except Exception as error:
                        failed[r] = c.failure(error)
        kept = [(False, NONE)] * n
        for c, r in rows:
            if r not in failed and c.matcher.is_error():  # its mask is meaningless: the row ends with the reason
                failed[r] = c.failure(c.matcher.get_error())
            if r not in failed:
                kept[r] = _row_ids(self.bitmask[r], self.vocab_size)
        return Allowed(kept, failed)

    def wait(self) -> "Allowed":
        """The rows' allowed tokens (an Allowed), once those started last are computed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._allowed = pending.result()
        return self._allowed


NONE = np.zeros(0, dtype=np.int64)


_pool_lock = threading.Lock()


def _mask_pool():
    """Masks' worker thread, started on first use: a generation without a constraint starts no thread (so the
    command's process ends at once, cli/launch.py) and does not import concurrent.futures."""
    with _pool_lock:
        if Masks._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            Masks._pool = ThreadPoolExecutor(1, thread_name_prefix="edgelm-masks")
        return Masks._pool


def _row_ids(bitmask_row: np.ndarray, n_vocab: int) -> tuple:
    """(True, the allowed ids) or (False, the forbidden ids), whichever is fewer, from one row's bitmask."""
    # [words] int32 -> (bool, [k] int64)
    bits = np.unpackbits(bitmask_row.view(np.uint8), count=n_vocab, bitorder="little")
    allowed = np.count_nonzero(bits)
    if allowed <= n_vocab // 2:
        return True, np.flatnonzero(bits)
    return False, np.flatnonzero(bits == 0)


class Allowed:
    """A batch's allowed tokens, ready to apply: per row (True, allowed ids) or (False, forbidden ids), whichever list
    is shorter (a JSON structure allows a few tokens, a string all but a few), so that applying them costs little
    whatever the vocabulary. failed: row -> the error of a row whose mask could not be computed (it bans nothing:
    the row must not be picked for)."""

    __slots__ = ("rows", "failed")

    def __init__(self, rows: list, failed: dict | None = None):
        self.rows, self.failed = rows, failed or {}

    @classmethod
    def from_bitmask(cls, bitmask: np.ndarray, n_vocab: int) -> "Allowed":
        """From a bitmask [B, words] int32, bit t of a row set where token t is allowed (llguidance's layout)."""
        return cls([_row_ids(row, n_vocab) for row in bitmask])

    def take(self, index: list) -> "Allowed":
        """These rows only, in this order."""
        failed = {k: self.failed[i] for k, i in enumerate(index) if i in self.failed}
        return Allowed([self.rows[i] for i in index], failed)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Forbidden tokens -> -inf, in place: the sampler chain's first filter (no ids to ban is its no-op)."""
        # [B, V] float32 -> [B, V] (the same array)
        for row, (keep, ids) in zip(logits, self.rows):
            if keep:
                values = row[ids]
                row.fill(-np.inf)
                row[ids] = values
            elif ids.size:
                row[ids] = -np.inf
        return logits
