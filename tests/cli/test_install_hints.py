"""An install hint names what works where edgelm runs: the extra's own requirements, read from pyproject through
edgelm's installed metadata (edgelm installs from a checkout, not from PyPI), or, in a frozen app, a rebuild."""

import sys

import pytest
from edgelm.runtime.errors import install_hint


@pytest.mark.parametrize(
    "extra, wanted",
    [("constrained", "'llguidance>=1.0'"), ("sign", "'py-minisign>=0.21'"), ("server", "'uvicorn>=0.30'")],
)
def test_a_hint_lists_the_extras_requirements(extra, wanted):
    hint = install_hint(extra)
    assert hint.startswith("pip install ") and wanted in hint and "edgelm[" not in hint


def test_a_frozen_app_is_told_to_rebuild_its_bundle(monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    hint = install_hint("constrained")
    assert "build the bundle again" in hint and "llguidance" in hint and not hint.startswith("pip")


def test_an_unknown_extra_names_itself():
    assert install_hint("nothing-like-it") == "pip install the nothing-like-it extra"
