// The official ollama JavaScript client against edgelm serve's /api/: list, chat, a streamed chat, a schema.
// Run by tests/server/test_server_ollama_js.py with EDGELM_URL and EDGELM_MODEL set; prints one JSON object.
import { Ollama } from "ollama";

const ollama = new Ollama({ host: process.env.EDGELM_URL });
const model = process.env.EDGELM_MODEL;
const messages = [{ role: "user", content: "Say hello." }];
const out = {};
out.models = (await ollama.list()).models.map((m) => m.model);
out.chat = (await ollama.chat({ model, messages, options: { num_predict: 8, temperature: 0 } })).message.content;
let streamed = "";
let last = null;
for await (const part of await ollama.chat({ model, messages, stream: true, options: { num_predict: 8, temperature: 0 } })) {
  streamed += part.message.content;
  last = part;
}
out.streamed = streamed;
out.done = last.done;
out.eval_count = last.eval_count;
const schema = { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"], additionalProperties: false };
out.json = JSON.parse((await ollama.chat({ model, messages, format: schema, options: { num_predict: 20 } })).message.content);
try {
  await ollama.chat({ model: "other", messages });
} catch (error) {
  out.error = { status: error.status_code, message: error.error };
}
console.log(JSON.stringify(out));
