"""The Jinja environment a chat template renders in: Jinja's immutable sandbox (as transformers uses) with every
operation that can multiply size or time measured by the render's Budget (chat_bounds.py): operators, list,
tuple and dict literals, comparisons, calls (globals, macros, string methods), filters, tests, subscripts and
printed values. chat_template.py adds transformers' globals and its tojson filter on top."""

from .chat_bounds import (
    FILTERS,
    MAX_COUNT,
    MAX_VALUE,
    METHODS,
    STR_METHODS,
    WALKING_FILTERS,
    bounded_lipsum,
    budget,
    check_format,
    check_size,
    checked,
    too_large,
)

MAX_WORDWRAP_CHARS = 16_384  # textwrap splits a long word in quadratic time


def bounded_environment(extensions=()):
    """A bounded ImmutableSandboxedEnvironment with transformers' options (trim_blocks, lstrip_blocks)."""
    from jinja2.compiler import CodeGenerator, operators
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        """Compiles list, tuple and dict literals to `environment.built(literal)` and each comparison operand to
        `environment.operand(x)`: nothing else sees a template nest a value in itself or compare two."""

        def _wrapped(self, visit, node, frame):
            self.write("environment.built(")
            visit(node, frame)
            self.write(")")

        def visit_List(self, node, frame):
            self._wrapped(super().visit_List, node, frame)

        def visit_Dict(self, node, frame):
            self._wrapped(super().visit_Dict, node, frame)

        def visit_Tuple(self, node, frame):
            if node.ctx != "load":  # a target (`for a, b in ...`) is no value
                return super().visit_Tuple(node, frame)
            self._wrapped(super().visit_Tuple, node, frame)

        def visit_Compare(self, node, frame):
            self.write("(environment.operand(")
            self.visit(node.expr, frame)
            self.write(")")
            for op in node.ops:
                self.write(f" {operators[op.op]} environment.operand(")
                self.visit(op.expr, frame)
                self.write(")")
            self.write(")")

    class Environment(ImmutableSandboxedEnvironment):
        code_generator_class = Generator
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def __init__(self, **options):
            super().__init__(finalize=lambda value: checked(value, "a printed value"), **options)
            bound_filters(self.filters)
            for name, test in list(self.tests.items()):
                self.tests[name] = _charging(test)
            self.globals["lipsum"] = bounded_lipsum

        def built(self, value):
            return checked(value, "a list or dict")

        def operand(self, value):
            b = budget()
            b.charge(b.size(value))
            return value

        def is_safe_attribute(self, obj, attr, value):
            if not super().is_safe_attribute(obj, attr, value):
                return False
            if isinstance(obj, str):
                return attr in STR_METHODS
            if isinstance(obj, (bytes, int, float, complex)):  # int.to_bytes(10**9), bytes.center(...)
                return False
            allowed = next((names for kind, names in METHODS.items() if isinstance(obj, kind)), None)
            return allowed is None or attr in allowed

        def getitem(self, obj, argument):
            budget().charge(budget().size(argument))  # a key is hashed and compared
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):
            """str.format / format_map as the sandbox wraps them, refused first if the result would be too large."""
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None

            def bounded(*args, **kwargs):
                mapping = args[0].values() if args and isinstance(args[0], dict) else ()
                check_format(value.__self__, [*args, *kwargs.values(), *mapping])
                return checked(wrapped(*args, **kwargs), "a format string")

            return bounded

        def call_binop(self, context, operator, left, right):
            size = budget().size
            if operator == "*" and isinstance(left, int) and not isinstance(right, (int, float)):
                left, right = right, left
            if operator == "%" and isinstance(left, str):
                check_format(
                    left, right.values() if isinstance(right, dict) else right if isinstance(right, tuple) else (right,)
                )
            if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
                check_size(size(left) + size(right), "a concatenation")
            if operator in ("*", "**") and isinstance(left, int) and isinstance(right, int):
                bits = abs(left).bit_length() * (abs(right) if operator == "**" else 1) + abs(right).bit_length()
                if bits > 1 << 16:
                    raise too_large(f"a number ({operator})")  # squaring in a loop, a power
            if operator == "*" and isinstance(left, (str, list, tuple)) and isinstance(right, int):
                check_size(size(left) * right, "a repetition")
            return checked(super().call_binop(context, operator, left, right), f"the operator {operator}")

        def call(*args, **kwargs):
            self, context, obj, *rest = args
            owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
            if isinstance(owner, str):
                rest = _check_str_method(owner, name, rest)
            if isinstance(owner, (str, list, tuple, dict)):
                budget().charge(budget().size(owner))  # a method reads its object
            result = ImmutableSandboxedEnvironment.call(self, context, obj, *rest, **kwargs)
            return checked(result, f"a call of {name or 'a function'}")

    return Environment(trim_blocks=True, lstrip_blocks=True, extensions=list(extensions))


def _check_str_method(s: str, name: str, args: list) -> list:
    """Refuse a string method call whose result would pass MAX_VALUE; the arguments to call it with."""
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        check_size(args[0], f"str.{name}")
    if name == "replace" and len(args) >= 2:
        _check_replace(s, str(args[0]), str(args[1]), f"str.{name}")
    if name == "join" and args:
        parts = list(args[0])  # once: it may be a generator
        check_size(sum(budget().size(p) for p in parts) + len(s) * len(parts), "str.join")
        args = [parts, *args[1:]]
    return args


def _check_replace(s: str, old: str, new: str, what: str) -> None:
    check_size(len(s) + (len(s) + 1 if not old else s.count(old)) * max(len(new) - len(old), 0), what)


def _charging(test):
    """A Jinja test (`is eq`, `is in`, ...) that charges the sizes of what it compares."""

    def run(*args, **kwargs):
        b = budget()
        b.charge(sum(b.size(v) for v in (*args, *kwargs.values())))
        return test(*args, **kwargs)

    _same_pass_arg(run, test)
    return run


def _same_pass_arg(wrapper, original) -> None:
    if hasattr(original, "jinja_pass_arg"):
        wrapper.jinja_pass_arg = original.jinja_pass_arg  # Jinja passes the context or environment first


def bound_filters(filters: dict) -> None:
    """Keep only the FILTERS, each refusing before the call an argument that would make its result too large,
    and measuring (and charging) its result."""
    kept = {name: filters[name] for name in FILTERS if name in filters}
    filters.clear()
    for name, original in kept.items():
        filters[name] = _guarded(name, original, PRECHECKS.get(name))


def _guarded(name: str, original, precheck):
    passes = hasattr(original, "jinja_pass_arg")

    def run(*args, **kwargs):
        head, values = (args[:1], list(args[1:])) if passes else ((), list(args))
        if precheck is not None and values:
            values = precheck(values, kwargs) or values
        if name in WALKING_FILTERS and values:
            budget().charge(len(values[0]) if hasattr(values[0], "__len__") else 1)
        return checked(original(*head, *values, **kwargs), f"the {name} filter")

    _same_pass_arg(run, original)
    return run


def _arg(values, kwargs, index, name, default):
    return values[index] if len(values) > index else kwargs.get(name, default)


def _int_within(value, low: int, high: int, what: str) -> None:
    if isinstance(value, int) and not low <= value <= high:
        raise too_large(f"{what} of {value}")


def _center(values, kwargs):
    _int_within(_arg(values, kwargs, 1, "width", 80), -MAX_VALUE, MAX_VALUE, "the center filter's width")


def _indent(values, kwargs):
    s, width = str(values[0]), _arg(values, kwargs, 1, "width", 4)
    check_size(
        len(s) + (s.count("\n") + 1) * (width if isinstance(width, int) else len(str(width))), "the indent filter"
    )


def _replace(values, kwargs):
    if len(values) >= 3:
        _check_replace(str(values[0]), str(values[1]), str(values[2]), "the replace filter")


def _join(values, kwargs):
    items = list(values[0])  # once: it may be a generator
    d = str(_arg(values, kwargs, 1, "d", ""))
    check_size(sum(budget().size(v) for v in items) + len(d) * len(items), "the join filter")
    return [items, *values[1:]]


def _format(values, kwargs):
    check_format(values[0], [*values[1:], *kwargs.values()])


def _wordwrap(values, kwargs):
    s, wrapstring = str(values[0]), _arg(values, kwargs, 3, "wrapstring", None)
    if len(s) > MAX_WORDWRAP_CHARS:
        raise too_large(f"the wordwrap filter on over {MAX_WORDWRAP_CHARS} characters")
    _int_within(_arg(values, kwargs, 1, "width", 79), 1, MAX_VALUE, "the wordwrap filter's width")
    check_size(len(s) * (1 + len(str(wrapstring or "\n"))), "the wordwrap filter")


def _counted(index, name):
    def check(values, kwargs):
        _int_within(_arg(values, kwargs, index, name, 1), 1, MAX_COUNT, f"the {name}")

    return check


def _sum(values, kwargs):
    start = _arg(values, kwargs, 2, "start", 0)
    if not isinstance(start, (int, float)):  # lists added one by one take quadratic time
        raise too_large(
            "the sum filter, which adds only numbers in a chat template, given a start that is not a number,"
        )


PRECHECKS = {
    "center": _center,
    "indent": _indent,
    "replace": _replace,
    "join": _join,
    "format": _format,
    "wordwrap": _wordwrap,
    "batch": _counted(1, "linecount"),
    "slice": _counted(1, "slices"),
    "sum": _sum,
}
