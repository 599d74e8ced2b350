// The official openai JavaScript client against `edgelm serve`: one chat and one completion call.
// Needs: node >= 18 and `npm install openai` (in this folder or any parent). Run a server first, e.g.
// `edgelm serve PACKAGE --model-name edgelm`, then `node benchmarks/clients/openai_js.mjs`
// (EDGELM_URL and EDGELM_MODEL override the defaults).
import OpenAI from "openai";

const baseURL = process.env.EDGELM_URL ?? "http://127.0.0.1:8000/v1";
const model = process.env.EDGELM_MODEL ?? "edgelm";
const client = new OpenAI({ baseURL, apiKey: process.env.EDGELM_API_KEY ?? "unused" });

const chat = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Say hello." }],
  max_tokens: 16,
});
console.log("chat.completions.create:", JSON.stringify(chat.choices[0].message.content));
const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Say hello." }],
  max_tokens: 16,
  stream: true,
});
let text = "";
for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
console.log("chat.completions.create(stream):", JSON.stringify(text));
const done = await client.completions.create({ model, prompt: "The capital of France is", max_tokens: 8 });
console.log("completions.create:", JSON.stringify(done.choices[0].text));
