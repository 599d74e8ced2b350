"""The layer order of edgelm.runtime, written once, and the import graph it is checked against.

    python tools/layers.py              # the folder-level import graph of runtime/ and export/
    python tools/layers.py --modules    # one line per module instead of per folder
    python tools/layers.py PATH         # the same for another checkout of the repository

A unit is a subpackage of runtime/ (engine, text, ...) or a module at its root (model, errors, ...); `(root)` is
runtime/__init__.py, the public names, which it imports on first use (its `_LAZY` table). Each unit sits in one
layer of LAYERS, read bottom-up: a module may import its own unit and any unit of a lower layer, never one of its
own layer or above. Units that share a layer (sampling and text) know nothing of each other. tests/repository/test_layers.py fails on any
import against the order, lazy (function-level) imports and __import__ / import_module with a literal name
included, and on a unit that has no layer.

In the graph, `!` marks an import against the layer order and `*` one that is part of a cycle (two units or
modules that import each other, directly or through others); the lines under "cycles" name the modules.
export/ has no layer order: its graph is printed for its cycles.
"""

import ast
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
RUNTIME_PACKAGE = "edgelm.runtime"
EXPORT_PACKAGE = "edgelm.export"
ROOT = "(root)"  # runtime/__init__.py

# Bottom-up. Each line: the units of one layer, then what they hold.
LAYERS = (
    ("errors",),  # the exception types every layer raises
    ("lazy",),  # a package's public names imported on first use
    ("inputs", "constraint_text", "constraint_bounds", "untrusted"),  # what comes from outside, checked
    ("generation_config",),  # the settings of one request, valid by construction
    ("generation_options", "generation_defaults"),  # the options as users give them and as packages ship them
    ("package",),  # the package folder: format, manifest, files, the onnxruntime it needs
    ("sampling", "text", "store"),  # next-token choice on ids; text <-> ids and chat; installed packages
    ("engine",),  # the forward pass and the decode loop, on ids
    ("speculative",),  # several tokens per forward pass, over the engine and the samplers
    ("batching",),  # many requests at once, text out of ids
    ("quality",),  # distance between two models' outputs, measured on greedy continuations
    ("model",),  # load(): a package, its tokenizer and engine, generate / stream / chat / score
    ("apps",),  # jobs built on a model: prompt files, pipeline(), bench, bundle
    (ROOT,),  # `import edgelm.runtime`: the public names
    ("server",),  # `edgelm serve`
    ("cli", "_pyinstaller"),  # the `edgelm` command; the freezing hook
)


def modules(root: Path, package: str) -> dict:
    """Every module under root (the folder of `package`) by its dotted name -> its path."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def imported_names(name: str, path: Path) -> set:
    """The absolute names a module imports at any depth (functions, try blocks, __import__ / import_module with a
    literal name, and the modules a package's `_LAZY` table of public names imports on first use); `from a import
    b` gives a.b, which may be a module or a name defined in a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_LAZY"]:
            values = node.value.values if isinstance(node.value, ast.Dict) else []
            found |= {f"{package}.{v.value}" for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(part for part in (base, node.module) if part)
            found |= {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "__import__",
            "import_module",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def module_graph(root: Path, package: str) -> dict:
    """{module: {module of the same tree it imports: }}: each imported name resolved to the longest module that
    holds it (`from .a import b` is a.b where b is a module, else a)."""
    tree = modules(root, package)
    graph = {}
    for name, path in tree.items():
        targets = set()
        for imported in imported_names(name, path):
            parts = imported.split(".")
            held = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in tree), None)
            if held is not None and held != name:
                targets.add(held)
        graph[name] = targets
    return graph


def unit_of(module: str, package: str) -> str:
    """The unit a module belongs to: its first name below the package, or ROOT for the package itself."""
    rest = module[len(package) + 1 :] if module != package else ""
    return rest.split(".")[0] if rest else ROOT


def cyclic(graph: dict) -> set:
    """The edges (a, b) of `graph` ({node: set of nodes}) that lie on a cycle: a and b in one strongly connected
    component (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, component = {}, {}, [], set(), {}
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = node
                    if member == node:
                        break
    return {(a, b) for a, targets in graph.items() for b in targets if component.get(a) == component.get(b)}


def layer_of(unit: str) -> int | None:
    return next((n for n, layer in enumerate(LAYERS) if unit in layer), None)


class Imports:
    """The import graph of one tree (runtime/ or export/), parsed once: modules, units and the edges between."""

    def __init__(self, root: Path, package: str):
        self.root, self.package = root, package
        self.modules = module_graph(root, package)
        self.units = {}  # (unit, unit) -> sorted ["module -> module", ...]
        for a, targets in self.modules.items():
            for b in targets:
                ua, ub = unit_of(a, package), unit_of(b, package)
                if ua != ub:
                    self.units.setdefault((ua, ub), []).append(f"{a} -> {b}")
        self.unit_graph = {}
        for ua, ub in self.units:
            self.unit_graph.setdefault(ua, set()).add(ub)

    def module_cycles(self) -> list:
        """Every import that lies on a module-level cycle, as "a -> b" lines."""
        return sorted(f"{a} -> {b}" for a, b in cyclic(self.modules))

    def unit_cycles(self) -> list:
        return sorted(cyclic(self.unit_graph))

    def unplaced(self) -> list:
        """Units that LAYERS does not name."""
        return sorted({unit_of(m, self.package) for m in self.modules} - {u for layer in LAYERS for u in layer})

    def against_the_order(self) -> dict:
        """{"unit -> unit": ["module -> module", ...]} for every import of a unit at or above the importer's layer
        (units that LAYERS does not name are left to unplaced())."""
        found = {}
        for (ua, ub), lines in sorted(self.units.items()):
            la, lb = layer_of(ua), layer_of(ub)
            if la is not None and lb is not None and lb >= la:
                found[f"{ua} -> {ub}"] = sorted(lines)
        return found

    def report(self, per_module: bool = False, layered: bool = True) -> str:
        """The graph as text: one line per unit (or module) and what it imports, marked; then the cycles."""
        lines = [f"{self.package} ({self.root.name}/)"]
        if per_module:
            graph, marked = self.modules, cyclic(self.modules)
            name = lambda module: module[len(self.package) + 1 :] or ROOT  # noqa: E731
            unit = lambda module: unit_of(module, self.package)  # noqa: E731
        else:
            graph, marked = self.unit_graph, cyclic(self.unit_graph)
            name = unit = lambda unit: unit  # noqa: E731
        wrong = {tuple(key.split(" -> ")) for key in self.against_the_order()} if layered else set()
        layer = lambda node: layer_of(unit(node)) if layer_of(unit(node)) is not None else len(LAYERS)  # noqa: E731
        order = (lambda node: (layer(node), node)) if layered else None
        for a in sorted({*graph, *(b for bs in graph.values() for b in bs)}, key=order):
            shown = [
                name(b) + ("!" if (unit(a), unit(b)) in wrong else "") + ("*" if (a, b) in marked else "")
                for b in sorted(graph.get(a, ()), key=order)
            ]
            lines.append(f"  {name(a)} -> {', '.join(shown) if shown else '(nothing)'}")
        cycles = self.module_cycles() if per_module else [f"{a} -> {b}" for a, b in self.unit_cycles()]
        lines.append("cycles:" if cycles else "cycles: none")
        for edge in cycles:
            lines.append(f"  {edge}")
            if not per_module:
                lines += [f"      {line}" for line in sorted(self.units[tuple(edge.split(" -> "))])]
        if layered:
            lines.append(f"layers, bottom-up: {' < '.join(' '.join(layer) for layer in LAYERS)}")
            against, unplaced = self.against_the_order(), self.unplaced()
            lines.append("against the layer order:" if against else "against the layer order: none")
            for edge, why in against.items():
                lines += [f"  {edge}"] + [f"      {line}" for line in why]
            if unplaced:
                lines.append(f"units with no layer: {', '.join(unplaced)}")
        return "\n".join(lines)


def main(argv: list) -> int:
    per_module = "--modules" in argv
    roots = [a for a in argv if not a.startswith("--")]
    repository = Path(roots[0]).resolve() if roots else REPOSITORY
    print(Imports(repository / "runtime", RUNTIME_PACKAGE).report(per_module))
    if (repository / "export").is_dir():
        print()
        print(Imports(repository / "export", EXPORT_PACKAGE).report(per_module, layered=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
