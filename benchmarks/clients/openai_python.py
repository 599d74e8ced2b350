"""The official openai Python client against `edgelm serve`: completions and chat, plain and streamed.

Needs: pip install openai. Run a server first, e.g. `edgelm serve PACKAGE --model-name edgelm`, then
`python benchmarks/clients/openai_python.py` (EDGELM_URL and EDGELM_MODEL override the defaults).
"""

import os

import openai

URL = os.environ.get("EDGELM_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("EDGELM_MODEL", "edgelm")
client = openai.OpenAI(base_url=URL, api_key=os.environ.get("EDGELM_API_KEY", "unused"))

done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8)
print("completions.create:", repr(done.choices[0].text))
streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, stream=True)
print("completions.create(stream=True):", repr("".join(c.choices[0].text for c in streamed if c.choices)))

messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
print("chat.completions.create:", repr(answer.choices[0].message.content), answer.usage)
chunks = client.chat.completions.create(
    model=MODEL, messages=messages, max_tokens=16, stream=True, stream_options={"include_usage": True}
)
print(
    "chat.completions.create(stream=True):",
    repr("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)),
)
