// An Electron-style app's use of edgelm: spawn the server, wait for its ready line, stream a chat, ask for a
// structured answer, stop it. Node 18 or newer, no packages (fetch is built in).
//
//   node examples/sidecar.mjs [EDGELM] [PACKAGE]
//
// EDGELM is the command: `edgelm` on PATH by default, or the frozen one `edgelm bundle` made (DIR/edgelm/edgelm),
// which finds its own package. PACKAGE is -m's value, if any. docs/apps.md explains each step.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

const [command = "edgelm", pkg] = process.argv.slice(2);
const args = ["serve", "--port", "0", "--parent-pid", String(process.pid), "--exit-with-stdin"];
if (pkg) args.push("-m", pkg);

// stdin a pipe: if this process dies, even by SIGKILL, the pipe closes and the server stops (--exit-with-stdin)
const server = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
const exited = new Promise((resolve) => server.on("exit", (code) => resolve(code)));

// the first line on stdout is {"event": "ready", "url", "port", "model", "pid"}, printed once the server answers
const ready = await new Promise((resolve, reject) => {
  const lines = createInterface({ input: server.stdout });
  lines.once("line", (line) => resolve(JSON.parse(line)));
  server.once("exit", (code) => reject(new Error(`edgelm serve exited (${code}) before it was ready`)));
});
console.log(`ready: ${ready.model} at ${ready.url} (pid ${ready.pid})`);

async function chat(body) {
  const response = await fetch(`${ready.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: ready.model, ...body }),
  });
  if (!response.ok) throw new Error(`${response.status}: ${await response.text()}`);
  return response;
}

// a streamed chat: server-sent events, each `data: {...}` line a chunk, `data: [DONE]` the end
const streamed = await chat({ messages: [{ role: "user", content: "Say hello." }], max_tokens: 16, stream: true });
let text = "";
let buffered = "";
for await (const bytes of streamed.body) {
  buffered += new TextDecoder().decode(bytes, { stream: true });
  const events = buffered.split("\n\n");
  buffered = events.pop();
  for (const event of events) {
    const data = event.replace(/^data: /, "");
    if (data !== "[DONE]") text += JSON.parse(data).choices[0]?.delta?.content ?? "";
  }
}
console.log("streamed:", JSON.stringify(text));

// a structured answer: the server constrains the output to the schema (closed and bounded, so that it ends well
// before the room the context leaves, which is its length when max_tokens is not given)
const schema = {
  type: "object",
  properties: { city: { type: "string", pattern: "^[A-Za-z ]{1,12}$" }, days: { type: "integer", minimum: 1, maximum: 30 } },
  required: ["city", "days"],
  additionalProperties: false,
};
const typed = await chat({
  messages: [{ role: "user", content: "Trip to Rome?" }],
  response_format: { type: "json_schema", json_schema: { name: "trip", schema } },
});
const choice = (await typed.json()).choices[0];
if (choice.finish_reason !== "stop") throw new Error(`the answer was cut (${choice.finish_reason})`);
const trip = JSON.parse(choice.message.content);
console.log("structured:", JSON.stringify(trip));

server.kill("SIGTERM"); // a clean stop: running requests get --shutdown-timeout
console.log(`stopped: exit code ${await exited}`);
