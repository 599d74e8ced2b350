"""A batch's draw uses a second thread only where a second core is free: not beside onnxruntime's spinning workers."""

import numpy as np
import pytest
from edgelm.runtime import sampling
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.model import load
from edgelm.runtime.sampling import draw

V = 50_257


@pytest.fixture
def second_thread_calls(monkeypatch):
    """Each use of the sampler's second thread, recorded; the work then runs on it as before."""
    calls, executor = [], draw._executor

    def recorded():
        calls.append(True)
        return executor()

    monkeypatch.setattr(draw, "_executor", recorded)
    return calls


@pytest.mark.parametrize("options", [{"top_k": 0}, {"top_k": 0, "top_p": 0.9}])  # the dense draw, top_p's rejection
def test_a_chain_without_a_second_thread_draws_the_same_tokens_on_one(options, second_thread_calls):
    logits = (np.random.default_rng(4).standard_normal((draw.MANY_ROWS * 2 + 1, V)) * 2.0).astype(np.float32)
    config, rows = GenerationConfig(do_sample=True, **options), len(logits)
    one, two = sampling.SamplerChain(config, V, second_thread=False), sampling.SamplerChain(config, V)
    for seed in range(4):
        picks = [
            chain(logits, [[]] * rows, [[]] * rows, [np.random.default_rng([seed, r]) for r in range(rows)]).tolist()
            for chain in (one, two)
        ]
        assert picks[0] == picks[1]
    assert len(second_thread_calls) == 4  # the chain with a second thread only, once a step


def test_a_model_whose_workers_spin_draws_a_batch_on_one_thread(tiny_package, second_thread_calls):
    # the tiny vocabulary leaves top_p's rejection draw as the one that splits a batch
    prompts, options = ["Hi", "The quick", "brown fox", "jumps"], dict(do_sample=True, top_p=0.9, max_new_tokens=4)
    spinning = load(tiny_package, spinning=True)
    assert spinning.engine.workers_spin
    expected = [c.token_ids for c in spinning.generate(prompts, seed=1, **options)]
    assert second_thread_calls == []
    sleeping = load(tiny_package, spinning=False)
    assert not sleeping.engine.workers_spin
    assert [c.token_ids for c in sleeping.generate(prompts, seed=1, **options)] == expected
    assert second_thread_calls  # its workers sleep after a run: the second core is free
