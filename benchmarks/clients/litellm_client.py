"""litellm's completion (chat) and text_completion against `edgelm serve`, as an OpenAI-compatible provider.

Needs: pip install litellm. Run a server first, e.g. `edgelm serve PACKAGE --model-name edgelm`, then
`python benchmarks/clients/litellm_client.py` (EDGELM_URL and EDGELM_MODEL override the defaults).
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list at import

import litellm  # noqa: E402

URL = os.environ.get("EDGELM_URL", "http://127.0.0.1:8000/v1")
MODEL = "openai/" + os.environ.get("EDGELM_MODEL", "edgelm")
KEY = os.environ.get("EDGELM_API_KEY", "unused")
messages = [{"role": "user", "content": "Say hello."}]

answer = litellm.completion(model=MODEL, api_base=URL, api_key=KEY, messages=messages, max_tokens=16)
print("completion:", repr(answer.choices[0].message.content))
chunks = litellm.completion(model=MODEL, api_base=URL, api_key=KEY, messages=messages, max_tokens=16, stream=True)
print("completion(stream=True):", repr("".join(c.choices[0].delta.content or "" for c in chunks)))
text = litellm.text_completion(model=MODEL, api_base=URL, api_key=KEY, prompt="The capital of France is", max_tokens=8)
print("text_completion:", repr(text.choices[0].text))
