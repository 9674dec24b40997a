// schema_test.mjs - structured output through `ember serve`, checked by an independent
// validator: every schema of schemas.json (over 100, written for this test: every type,
// enum / const, required and additionalProperties, string lengths, numeric ranges, array
// sizes, nested objects, $ref / $defs, anyOf, regular patterns, and combinations) is sent as
// response_format json_schema (strict) to a random-weight model whose tokenizer is Qwen3's
// real one (151,669 tokens in a 151,936-row vocabulary); the answer must finish (finish_reason
// "stop": the grammar steers the output to close within max_tokens), parse, and validate with
// Ajv (JSON Schema 2020-12). The refusals of schemas.json must be answered 400 naming the
// feature, and the server must stay up.
//
// usage: node schema_test.mjs EMBER_BIN SHARED_DIR
// Exits 77 (skipped) when Ajv is not installed (npm ci in this folder) or SHARED_DIR lacks
// Qwen3's tokenizer.

import { spawnSync } from 'node:child_process';
import { startServer, stopServer } from './serve.mjs';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

let Ajv2020;
try {
  Ajv2020 = (await import('ajv/dist/2020.js')).default;
} catch (e) {
  console.error('skip: ajv not installed (npm ci in tests/e2e):', e.message);
  process.exit(77);
}

const [bin, shared] = process.argv.slice(2);
if (!bin) {
  console.error('usage: node schema_test.mjs EMBER_BIN SHARED_DIR');
  process.exit(2);
}
const tokDir = shared && join(shared, 'testdata/tokenizers/hf/qwen3');
if (!tokDir || !existsSync(join(tokDir, 'tokenizer.json'))) {
  console.error('skip: shared/testdata/tokenizers/hf/qwen3 absent (the test needs a real tokenizer)');
  process.exit(77);
}

const suite = JSON.parse(readFileSync(join(dirname(fileURLToPath(import.meta.url)), 'schemas.json'), 'utf8'));

// a tiny Qwen3 with random weights and the real tokenizer
const dir = mkdtempSync(join(tmpdir(), 'ember-schemas-'));
const cfg = {
  architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', vocab_size: 151936, hidden_size: 64,
  intermediate_size: 128, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
  max_position_embeddings: 2048, rms_norm_eps: 1e-6, rope_theta: 10000, tie_word_embeddings: true,
  bos_token_id: 151643, eos_token_id: 151645, hidden_act: 'silu',
};
writeFileSync(join(dir, 'config.in.json'), JSON.stringify(cfg));
const mk = spawnSync(bin, ['mkmodel', '--config', join(dir, 'config.in.json'), '--out', dir], { stdio: 'inherit' });
if (mk.status !== 0) {
  console.error('mkmodel failed');
  process.exit(1);
}
copyFileSync(join(tokDir, 'tokenizer.json'), join(dir, 'tokenizer.json'));
copyFileSync(join(tokDir, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));

const server = await startServer(bin, [dir, '--parallel', '4', '--ctx', '1024', '--threads', '2'], 'server', 600);
const base = server.base;
let exited = null;

let failures = 0, checks = 0;
const check = (cond, what) => {
  checks++;
  if (!cond) {
    failures++;
    console.error('FAIL:', what);
  }
};

const ajv = new Ajv2020({ strict: false, allErrors: true });
const ask = (schema, i, maxTokens) =>
  fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: 'Answer in JSON.' }],
      response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
      max_tokens: maxTokens,
      temperature: 1,
      seed: 1000 + i,
    }),
  });

// runs f over items, n at a time (the server batches 4 rows)
const pool = async (items, n, f) => {
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) {
      const i = next++;
      await f(items[i], i);
    }
  }));
};

// Grammars and regular expressions on the real tokenizer (docs/tool-calls.md, "Grammars and
// regular expressions"): guided_regex answers checked with a JS RegExp of the same pattern
// (the whole answer must match), GBNF answers with JSON.parse or a RegExp of the same
// language; every answer must finish ("stop").
const k_regexes = [
  '[a-z]{3,10}@[a-z]{2,8}\\.(com|org|net)',
  '\\d{4}-\\d{2}-\\d{2}',
  '(yes|no|maybe), because [a-z ]{5,40}\\.',
  '"[^"\\n]{0,60}"',
  '[A-Z][a-z]{1,100}( [A-Z][a-z]{1,100}){0,3}',
  '(0|[1-9][0-9]{0,5})(\\.[0-9]{1,3})?',
];
const k_gbnf = [
  {
    grammar: 'root ::= "{" ws "\\"n\\":" ws num ws ("," ws "\\"tag\\":" ws str ws)? "}"\n' +
      'num ::= "-"? [0-9]{1,6}\nstr ::= "\\"" [a-z]{0,12} "\\""\nws ::= [ ]?\n',
    ok: (t) => { try { const x = JSON.parse(t); return Number.isInteger(x.n); } catch { return false; } },
  },
  {
    grammar: '# a list of words\nroot ::= item ("," item){0,5}\nitem ::= [a-z]+ | [0-9]{1,3}\n',
    ok: (t) => /^([a-z]+|[0-9]{1,3})(,([a-z]+|[0-9]{1,3})){0,5}$/.test(t),
  },
  {
    grammar: 'root ::= greet " " name "!"\ngreet ::= "hi" | "h\\u00e9llo"\nname ::= [A-Z] [a-z\\u00e0-\\u00ff]{1,8}\n',
    ok: (t) => /^(hi|h\u00e9llo) [A-Z][a-z\u00e0-\u00ff]{1,8}!$/u.test(t),
  },
];
const post = (body) =>
  fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'Go.' }], temperature: 1, ...body }),
  });
async function grammarCases() {
  let n = 0;
  const t = Date.now();
  for (const [i, p] of k_regexes.entries()) {
    for (let seed = 0; seed < 3; seed++) {
      const r = await post({ guided_regex: p, max_tokens: 60, seed });
      const b = await r.json();
      const t = b.choices?.[0]?.message?.content;
      check(r.status === 200 && b.choices[0].finish_reason === 'stop' && new RegExp(`^(?:${p})$`).test(t),
        `guided_regex ${i} ${p}: ${r.status} ${JSON.stringify(b.error ?? b.choices[0])}`);
      n++;
    }
  }
  for (const [i, g] of k_gbnf.entries()) {
    for (let seed = 0; seed < 3; seed++) {
      const r = await post({ grammar: g.grammar, max_tokens: 48, seed });
      const b = await r.json();
      const t = b.choices?.[0]?.message?.content;
      check(r.status === 200 && b.choices[0].finish_reason === 'stop' && g.ok(t),
        `grammar ${i}: ${r.status} ${JSON.stringify(b.error ?? b.choices[0])}`);
      n++;
    }
  }
  const r = await post({ grammar: 'root ::= x\nx ::= x "a" | "b"', max_tokens: 8 });
  const b = await r.json();
  check(r.status === 400 && b.error?.param === 'grammar' && b.error.message.includes('left recursion'),
    `left recursion: ${r.status} ${JSON.stringify(b.error)}`);
  console.error(`grammars and regular expressions: ${n} answers checked, ${((Date.now() - t) / 1000).toFixed(1)} s`);
}

const t0 = Date.now();
let valid = 0, tokens = 0;
try {
  check(suite.schemas.length >= 100, `at least 100 schemas (${suite.schemas.length})`);
  await pool(suite.schemas, 4, async ({ schema, max_tokens }, i) => {
    const tag = `schema ${i} ${JSON.stringify(schema).slice(0, 120)}`;
    const r = await ask(schema, i, max_tokens ?? 48);
    const body = await r.json();
    check(r.status === 200, `${tag}: status ${r.status} ${JSON.stringify(body.error)}`);
    if (r.status !== 200) return;
    const ch = body.choices[0];
    tokens += body.usage.completion_tokens;
    check(ch.finish_reason === 'stop', `${tag}: finish_reason ${ch.finish_reason} (${JSON.stringify(ch.message.content)})`);
    let x;
    try {
      x = JSON.parse(ch.message.content);
    } catch (e) {
      check(false, `${tag}: output does not parse: ${JSON.stringify(ch.message.content)}`);
      return;
    }
    const ok = ajv.validate(schema, x);
    check(ok, `${tag}: output ${JSON.stringify(ch.message.content)} does not validate: ${ajv.errorsText()}`);
    if (ok) valid++;
  });
  for (const { schema, names } of suite.refusals) {
    const r = await ask(schema, 0, 16);
    const body = await r.json();
    check(
      r.status === 400 && body.error?.param === 'response_format' && body.error.message.includes(names),
      `refusal ${JSON.stringify(schema).slice(0, 100)}: ${r.status} ${JSON.stringify(body.error)} (want '${names}')`,
    );
  }
  await grammarCases();
  check((await fetch(`${base}/health`)).ok, 'the server is up after the suite');
} finally {
  exited = await stopServer(server, 5000);
  rmSync(dir, { recursive: true, force: true });
}
check(exited && exited.code === 0, `server exits 0 on SIGTERM (${JSON.stringify(exited)})`);
console.error(
  `${suite.schemas.length} schemas: ${valid} outputs valid (${tokens} tokens); ${suite.refusals.length} refusals; ` +
    `${checks} checks, ${failures} failed, ${((Date.now() - t0) / 1000).toFixed(1)} s`,
);
process.exit(failures ? 1 : 0);
