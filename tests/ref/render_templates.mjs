// render_templates.mjs - produces tests/data/chat/expected.json, the oracle
// for tests/test_chat_templates.c: every chat template of the corpus rendered
// with every conversation of tests/data/chat/conversations.json by the
// reference engine (@huggingface/jinja, version pinned in package.json).
//
// Usage (from tests/ref):  npm install && node render_templates.mjs [templates_dir] [out.json]
// Defaults: ../../../shared/testdata/chat-templates/llama.cpp and ../data/chat/expected.json.
//
// Determinism: strftime_now() reads the clock, so the clock is pinned to
// 2024-07-26 12:00 local time (the C test passes the same broken-down time).
// A template that fails to parse, or a render that throws, is recorded as
// {"error": message}; the C side must fail on it too.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = dirname(fileURLToPath(import.meta.url));
const templatesDir = resolve(process.argv[2] ?? join(here, "../../../shared/testdata/chat-templates/llama.cpp"));
const outPath = resolve(process.argv[3] ?? join(here, "../data/chat/expected.json"));
const convPath = join(here, "../data/chat/conversations.json");
const snippetsPath = join(here, "../data/chat/snippets.json");

const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(2024, 6, 26, 12, 0, 0);
    else super(...args);
  }
  static now() {
    return new RealDate(2024, 6, 26, 12, 0, 0).getTime();
  }
};

const pkg = JSON.parse(readFileSync(join(here, "node_modules/@huggingface/jinja/package.json"), "utf8"));
const conversations = JSON.parse(readFileSync(convPath, "utf8")).conversations;
const names = readdirSync(templatesDir).filter((f) => f.endsWith(".jinja")).sort();

const out = {
  generator: `@huggingface/jinja ${pkg.version}`,
  now: "2024-07-26T12:00:00 (local time)",
  templates: {},
};
for (const name of names) {
  const src = readFileSync(join(templatesDir, name), "utf8");
  let tmpl;
  try {
    tmpl = new Template(src);
  } catch (e) {
    out.templates[name] = { compile_error: String(e.message ?? e) };
    continue;
  }
  const results = {};
  for (const conv of conversations) {
    try {
      results[conv.id] = { rendered: tmpl.render(structuredClone(conv.context)) };
    } catch (e) {
      results[conv.id] = { error: String(e.message ?? e) };
    }
  }
  out.templates[name] = { results };
}
// Small feature templates, all rendered with one shared context.
const snip = JSON.parse(readFileSync(snippetsPath, "utf8"));
out.snippets = {};
for (const { id, template } of snip.snippets) {
  try {
    out.snippets[id] = { rendered: new Template(template).render(structuredClone(snip.context)) };
  } catch (e) {
    out.snippets[id] = { error: String(e.message ?? e) };
  }
}
writeFileSync(outPath, JSON.stringify(out, null, 1) + "\n");
let ok = 0, err = 0;
for (const t of Object.values(out.templates))
  for (const r of Object.values(t.results ?? {})) r.error === undefined ? ok++ : err++;
console.log(`${names.length} templates x ${conversations.length} conversations: ${ok} rendered, ${err} errors -> ${outPath}`);
