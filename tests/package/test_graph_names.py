"""The ONNX graph's input and output names are written once, in runtime/package/format.py: the export that
declares them and the engine that feeds and reads them ask it, so neither can drift from the other."""

import ast
from pathlib import Path

from edgelm.runtime.package import format as package_format

ROOT = Path(__file__).resolve().parents[2]
NAMES = {
    package_format.INPUT_IDS,
    package_format.INPUTS_EMBEDS,
    package_format.ATTENTION_MASK,
    package_format.POSITION_IDS,
    package_format.LOGITS_TO_KEEP,
    package_format.LOGITS,
    package_format.PAST,
    package_format.PRESENT,
}
EXEMPT = {
    "runtime/package/format.py": "the owner",
    "runtime/package/graph_section.py": "format.py imports it, so it cannot ask format.py; logits_to_keep: a key",
    "runtime/sampling/chain.py": "its 'logits' names a scratch buffer, not the graph's output",
}


def literal_names(source: str) -> list:
    """The graph names a module spells out: string constants, and f-strings that start with a cache prefix."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in NAMES:
            found.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            if str(node.values[0].value).startswith((package_format.PAST, package_format.PRESENT)):
                found.add(node.values[0].value)
    return sorted(found)


def test_no_module_spells_out_a_graph_name():
    spelled = {}
    for folder in ("runtime", "export"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name not in EXEMPT and (found := literal_names(path.read_text(encoding="utf-8"))):
                spelled[name] = found
    assert spelled == {}


def test_the_check_finds_a_planted_name():
    planted = 'feeds = {"attention_mask": mask}\nname = f"present.{i}.key"'
    assert literal_names(planted) == ["attention_mask", "present."]
    assert literal_names('feeds = {ATTENTION_MASK: mask}\nname = f"attn_{i}"') == []
