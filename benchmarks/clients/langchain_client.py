"""LangChain's OpenAI (completions) and ChatOpenAI (chat) against `edgelm serve`.

Needs: pip install langchain-openai. Run a server first, e.g. `edgelm serve PACKAGE --model-name edgelm`, then
`python benchmarks/clients/langchain_client.py` (EDGELM_URL and EDGELM_MODEL override the defaults).
"""

import os

from langchain_openai import ChatOpenAI, OpenAI

URL = os.environ.get("EDGELM_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("EDGELM_MODEL", "edgelm")
KEY = os.environ.get("EDGELM_API_KEY", "unused")

llm = OpenAI(model=MODEL, base_url=URL, api_key=KEY, max_tokens=8)
print("OpenAI.invoke:", repr(llm.invoke("The capital of France is")))
answers = llm.batch([f"Prompt number {i}:" for i in range(20)])  # LangChain sends these 20 in one request
print("OpenAI.batch(20 prompts):", len(answers), "answers")

chat = ChatOpenAI(model=MODEL, base_url=URL, api_key=KEY, max_tokens=16)
print("ChatOpenAI.invoke:", repr(chat.invoke("Say hello.").content))
print("ChatOpenAI.stream:", repr("".join(chunk.content for chunk in chat.stream("Say hello."))))
