"""Whether each prompt's greedy tokens are the same alone and in one Model.batch with eight other prompts of
other lengths (left-padded together).

    python benchmarks/batch_tokens.py PKG [PKG ...]

Prints, per package, how many of the nine rows' 64 greedy tokens are equal. A benchmark, not a test: the tests
(tests/export/test_int8_recipes.py) check the tiny models; this measures a real checkpoint's packages.
"""

import sys
from edgelm.runtime import load

prompts = [
    "It was a truth universally acknowledged",
    "Emma Woodhouse, handsome, clever, and rich,",
    "Sir Walter Elliot",
    "She had been forced into prudence in her youth, she learned romance as she grew older:",
    "Anne",
    "The Musgroves",
    "Captain Wentworth had no fortune.",
    "Lady Russell, convinced that",
    "In the autumn",
]
for path in sys.argv[1:]:
    m = load(path)
    opts = dict(do_sample=False, ignore_eos=True, max_new_tokens=64)
    alone = [m.generate(p, **opts).token_ids for p in prompts]
    together = [c.token_ids for c in m.generate(prompts, **opts)]
    print(
        path,
        "rows whose 64 greedy tokens equal alone and in one batch of 9:",
        sum(a == b for a, b in zip(alone, together)),
        "of",
        len(prompts),
        flush=True,
    )
