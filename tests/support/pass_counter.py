"""Counting the passes a model makes through its graph."""


def count_passes(model, monkeypatch) -> list:
    """Every pass through the graph (a prompt chunk, a decode step, a scoring pass) appends to the list."""
    calls, make_decoder, forward = [], model.engine.decoder, model.engine.forward

    class Counted:
        def __init__(self, inner):
            self.inner = inner

        def run(self, *args):
            calls.append(1)
            return self.inner.run(*args)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(model.engine, "decoder", lambda *a, **k: Counted(make_decoder(*a, **k)))
    monkeypatch.setattr(model.engine, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    return calls
