// Renders every case of cases.json with @huggingface/jinja, the independent renderer the
// chat-template interpreter is compared against, into OUT_DIR/<id>.txt (or <id>.error).
// usage: node reference_render.mjs CASES_JSON TEMPLATE_DIR OUT_DIR   (NODE_PATH: the npm prefix)
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [casesPath, templateDir, outDir] = process.argv.slice(2);
const require = createRequire(path.join(process.env.NPM_PREFIX, "node_modules", "x.js"));
const { Template } = require("@huggingface/jinja");

// strftime_now() formats the library's `new Date()`: pin it to the case's time.
const RealDate = Date;
let fixedNow = 0;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    super(...(args.length ? args : [fixedNow * 1000]));
  }
  static now() { return fixedNow * 1000; }
};

// The same context moe_chat_apply_template documents (moeinfer.h, docs/chat.md).
function context(c) {
  const messages = c.messages.map((m) => {
    const out = { role: m.role, content: m.content ?? null };
    if (m.reasoning_content !== undefined) {
      out.reasoning_content = m.reasoning_content;
      out.thinking = m.reasoning_content;
    }
    for (const k of ["tool_calls", "tool_call_id", "name"]) if (m[k] !== undefined) out[k] = m[k];
    return out;
  });
  const ctx = { messages, add_generation_prompt: c.add_generation_prompt, bos_token: c.bos_token, eos_token: c.eos_token };
  if (c.tools) ctx.tools = c.tools;
  if (c.enable_thinking >= 0) ctx.enable_thinking = c.enable_thinking === 1;
  Object.assign(ctx, c.extra ?? {});
  return ctx;
}

fs.mkdirSync(outDir, { recursive: true });
const cache = new Map();
for (const c of JSON.parse(fs.readFileSync(casesPath, "utf8"))) {
  if (!cache.has(c.template)) cache.set(c.template, new Template(fs.readFileSync(path.join(templateDir, c.template), "utf8")));
  fixedNow = c.now_unix;
  try {
    fs.writeFileSync(path.join(outDir, c.id + ".txt"), cache.get(c.template).render(context(c)));
  } catch (e) {
    fs.writeFileSync(path.join(outDir, c.id + ".error"), String(e.message) + "\n");
  }
}
