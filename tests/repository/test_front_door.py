"""The README's performance table is docs/performance.md's first, the current one: a figure has one home, and the
README shows it as it stands there."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def first_table(text: str) -> list:
    """The rows of the first Markdown table in `text`."""
    block = []
    for line in text.splitlines():
        if line.startswith("|"):
            block.append(line)
        elif block:
            break
    return block


def test_the_readme_shows_the_current_performance_table_as_it_stands_in_the_docs():
    readme = (ROOT / "README.md").read_text()
    performance = readme[readme.index("## Performance") :]
    docs = (ROOT / "docs" / "performance.md").read_text()
    current = docs[docs.index("## Current") :]
    assert first_table(performance) and first_table(performance) == first_table(current)
