// Drives worker-orcd with the unchanged `openai` npm client (version pinned in
// conformance/package.json): one streamed and one non-streamed chat completion, and one
// streamed text completion. Prints one JSON object with what the client saw; the gtest
// (suites/openai_test.cpp) judges it. Usage: node stream_chat.mjs BASE_URL PROMPT MAX_TOKENS
import OpenAI from "openai";

const [baseURL, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "conformance-key", maxRetries: 0, timeout: 60000 });
const out = { stream: { chunks: 0, content: "", roles: [], finish_reason: null, usage: null } };

const stream = await client.chat.completions.create({
  model: "worker-orcd",
  messages: [{ role: "user", content: prompt }],
  max_tokens: Number(maxTokens),
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  out.stream.chunks += 1;
  if (chunk.usage) out.stream.usage = chunk.usage;
  for (const c of chunk.choices ?? []) {
    if (c.delta?.role) out.stream.roles.push(c.delta.role);
    if (c.delta?.content) out.stream.content += c.delta.content;
    if (c.finish_reason) out.stream.finish_reason = c.finish_reason;
  }
}

const full = await client.chat.completions.create({
  model: "worker-orcd",
  messages: [{ role: "user", content: prompt }],
  max_tokens: Number(maxTokens),
  temperature: 0,
});
out.full = {
  object: full.object,
  content: full.choices[0].message.content,
  role: full.choices[0].message.role,
  finish_reason: full.choices[0].finish_reason,
  usage: full.usage,
};

const comp = await client.completions.create({
  model: "worker-orcd", prompt, max_tokens: Number(maxTokens), temperature: 0, stream: true,
});
out.completion = { chunks: 0, text: "" };
for await (const chunk of comp) {
  out.completion.chunks += 1;
  for (const c of chunk.choices ?? []) out.completion.text += c.text ?? "";
}
console.log(JSON.stringify(out));
