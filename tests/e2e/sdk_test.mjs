// sdk_test.mjs - ember serve driven by the official OpenAI and Anthropic SDKs.
//
// usage: node sdk_test.mjs EMBER_BIN MODEL_DIR
// Starts `EMBER_BIN serve MODEL_DIR` on a free port, runs the checks, stops it
// with SIGTERM and expects exit status 0. Exits 77 (skipped) when the SDKs
// are not installed (npm install in this folder; scripts/test.sh does it).

import { spawn } from 'node:child_process';
import { createServer } from 'node:net';

let OpenAI, Anthropic;
try {
  OpenAI = (await import('openai')).default;
  Anthropic = (await import('@anthropic-ai/sdk')).default;
} catch (e) {
  console.error('skip: SDKs not installed (npm install in tests/e2e):', e.message);
  process.exit(77);
}

const [bin, model] = process.argv.slice(2);
if (!bin || !model) {
  console.error('usage: node sdk_test.mjs EMBER_BIN MODEL_DIR');
  process.exit(2);
}

const freePort = () =>
  new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

const port = await freePort();
const server = spawn(bin, ['serve', model, '--port', String(port), '--parallel', '4', '--ctx', '512', '--threads', '2'], {
  stdio: ['ignore', 'inherit', 'inherit'],
});
let exited = null;
server.on('exit', (code, signal) => (exited = { code, signal }));

const base = `http://127.0.0.1:${port}`;
for (let i = 0; ; i++) {
  try {
    const r = await fetch(`${base}/health`);
    if (r.ok) break;
  } catch {}
  if (i > 300 || exited) {
    console.error('server did not come up', exited);
    process.exit(1);
  }
  await new Promise((r) => setTimeout(r, 100));
}

let failures = 0,
  checks = 0;
const check = (cond, what) => {
  checks++;
  if (!cond) {
    failures++;
    console.error('FAIL:', what);
  }
};

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });

try {
  // chat, non-streaming
  const msgs = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Say hello.' },
  ];
  const c1 = await openai.chat.completions.create({ model: 'demo', messages: msgs, max_tokens: 10, temperature: 0 });
  check(c1.object === 'chat.completion', 'chat object');
  check(typeof c1.choices[0].message.content === 'string', 'chat content is a string');
  check(c1.choices[0].finish_reason === 'length', 'chat finish_reason length');
  check(c1.usage.completion_tokens === 10 && c1.usage.prompt_tokens > 0, 'chat usage');
  check(c1.usage.total_tokens === c1.usage.prompt_tokens + c1.usage.completion_tokens, 'total_tokens');

  // chat, streaming: same text, usage chunk, cached prefix reported
  const stream = await openai.chat.completions.create({
    model: 'demo',
    messages: msgs,
    max_tokens: 10,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '',
    usage = null,
    finish = null,
    roleSeen = false;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (ch) {
      if (ch.delta.role === 'assistant') roleSeen = true;
      text += ch.delta.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(roleSeen, 'stream starts with the assistant role');
  check(text === c1.choices[0].message.content, `streamed text equals the non-streamed text (${JSON.stringify(text)})`);
  check(finish === 'length', 'stream finish_reason');
  check(usage && usage.completion_tokens === 10, 'stream usage');
  check(usage && usage.prompt_tokens_details.cached_tokens === usage.prompt_tokens - 1, 'cached_tokens on repeat');

  // logprobs
  const c2 = await openai.chat.completions.create({
    model: 'demo',
    messages: [{ role: 'user', content: 'x' }],
    max_tokens: 3,
    temperature: 0,
    logprobs: true,
    top_logprobs: 2,
  });
  const lp = c2.choices[0].logprobs.content;
  check(lp.length === 3 && lp[0].top_logprobs.length === 2 && lp[0].logprob <= 0, 'chat logprobs');

  // stop strings: ask for text, then stop at a piece of it
  const full = c1.choices[0].message.content;
  const cut = [...full][Math.floor([...full].length / 2)];
  if (cut) {
    const c3 = await openai.chat.completions.create({ model: 'demo', messages: msgs, max_tokens: 10, temperature: 0, stop: [cut] });
    check(c3.choices[0].message.content === full.slice(0, full.indexOf(cut)), 'stop string cuts the text');
    check(c3.choices[0].finish_reason === 'stop', 'stop finish_reason');
  }

  // completions (string and token ids), streaming and not
  const p1 = await openai.completions.create({ model: 'demo', prompt: 'Once upon', max_tokens: 5, temperature: 0, logprobs: 2 });
  check(p1.object === 'text_completion' && typeof p1.choices[0].text === 'string', 'completion text');
  check(p1.choices[0].logprobs.tokens.length === 5, 'completion logprobs');
  const p2 = await openai.completions.create({ model: 'demo', prompt: [79, 110, 99, 101], max_tokens: 5, temperature: 0, stream: true });
  let ptext = '';
  for await (const chunk of p2) ptext += chunk.choices[0]?.text ?? '';
  const p3 = await openai.completions.create({ model: 'demo', prompt: [79, 110, 99, 101], max_tokens: 5, temperature: 0 });
  check(ptext === p3.choices[0].text, 'streamed completion equals non-streamed');

  // models
  const models = await openai.models.list();
  check(models.data.length === 1, 'one model listed');

  // errors surface as the SDK's error types
  try {
    await openai.chat.completions.create({ model: 'demo', messages: msgs, temperature: 5 });
    check(false, 'temperature 5 accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `BadRequestError for temperature (${e.constructor.name})`);
  }
  try {
    await openai.chat.completions.create({ model: 'demo', messages: [] });
    check(false, 'empty messages accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, 'BadRequestError for empty messages');
  }
  try {
    await openai.chat.completions.create({ model: 'demo', messages: msgs, max_tokens: 100000 });
    check(false, 'max_tokens beyond the context accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /context length/.test(e.message), 'context length error');
  }

  // Anthropic messages, non-streaming and streaming
  const a1 = await anthropic.messages.create({
    model: 'demo',
    max_tokens: 8,
    system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi' }],
    temperature: 0,
  });
  check(a1.type === 'message' && a1.role === 'assistant' && a1.content[0].type === 'text', 'anthropic message');
  check(a1.stop_reason === 'max_tokens' && a1.usage.output_tokens === 8, 'anthropic stop_reason and usage');
  const events = [];
  let atext = '';
  const as = anthropic.messages.stream({
    model: 'demo',
    max_tokens: 8,
    system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi' }],
    temperature: 0,
  });
  for await (const ev of as) {
    events.push(ev.type);
    if (ev.type === 'content_block_delta') atext += ev.delta.text;
  }
  const final = await as.finalMessage();
  check(atext === a1.content[0].text, 'anthropic streamed text equals non-streamed');
  check(final.stop_reason === 'max_tokens', 'anthropic stream final message');
  check(events[0] === 'message_start' && events.at(-1) === 'message_stop', `anthropic event order ${events.join(',')}`);
  try {
    await anthropic.messages.create({ model: 'demo', max_tokens: 5, messages: [{ role: 'user', content: 'x' }], temperature: 2 });
    check(false, 'anthropic temperature 2 accepted');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && e.status === 400, `anthropic BadRequestError (${e.constructor.name})`);
  }
} catch (e) {
  failures++;
  console.error('FAIL: unexpected exception', e);
}

// graceful stop: SIGTERM, exit 0
server.kill('SIGTERM');
for (let i = 0; i < 200 && !exited; i++) await new Promise((r) => setTimeout(r, 50));
check(exited && exited.code === 0, `server exits 0 on SIGTERM (${JSON.stringify(exited)})`);
if (!exited) server.kill('SIGKILL');

console.error(`${checks} checks, ${failures} failed`);
process.exit(failures ? 1 : 0);
