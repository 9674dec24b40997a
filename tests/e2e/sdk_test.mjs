// sdk_test.mjs - ember serve driven by the official OpenAI and Anthropic SDKs.
//
// usage: node sdk_test.mjs EMBER_BIN MODEL_DIR [SHARED_DIR]
// Starts `EMBER_BIN serve MODEL_DIR` on a free port, runs the checks, stops it
// with SIGTERM and expects exit status 0. env: EMBER_E2E_SERVE_ARGS, more
// arguments for every server (serve.mjs); EMBER_E2E_DEVICE, the device
// /v1/models must name (default cpu; "cuda:0" with --device cuda:0). With SHARED_DIR (../shared), also
// tool calls through both SDKs on a copy of the model with Qwen2.5's template. Exits 77 (skipped) when the SDKs
// are not installed (npm install in this folder; scripts/test.sh does it).

import { startServer, stopServer } from './serve.mjs';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

let OpenAI, Anthropic;
try {
  OpenAI = (await import('openai')).default;
  Anthropic = (await import('@anthropic-ai/sdk')).default;
} catch (e) {
  console.error('skip: SDKs not installed (npm install in tests/e2e):', e.message);
  process.exit(77);
}

const [bin, model, shared] = process.argv.slice(2);
if (!bin || !model) {
  console.error('usage: node sdk_test.mjs EMBER_BIN MODEL_DIR');
  process.exit(2);
}

const server = await startServer(bin, [model, '--parallel', '4', '--ctx', '512', '--threads', '2']);
const base = server.base;

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
  const device = process.env.EMBER_E2E_DEVICE ?? 'cpu'; /* the device the servers were asked for */
  /* "cpu", or the CUDA device with its name: "cuda:0 (NVIDIA H200)" */
  const listed = models.data[0]?.device ?? '';
  check(listed === device || listed.startsWith(`${device} (`), `the model listed on ${device} (${listed})`);

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

// ---- tool calls -------------------------------------------------------------------------------
// A second server on a copy of the model whose chat template is Qwen2.5's real one (it renders
// tools and writes calls as <tool_call>{json}</tool_call>). Random weights write no calls, so
// requests carry "ember_test_output", the server's TEST-ONLY hook (on with --test-output): the
// sampled token ids are swapped for a scripted completion's; detokenization, the tool-call
// parser and the protocol shaping run as in production.
const qwenTemplate = shared && join(shared, 'testdata/chat-templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja');
if (!qwenTemplate || !existsSync(qwenTemplate)) {
  console.error('note: shared/testdata absent: tool-call checks skipped');
} else {
  const toolModel = mkdtempSync(join(tmpdir(), 'ember-e2e-tools-'));
  cpSync(model, toolModel, { recursive: true });
  const cfgPath = join(toolModel, 'tokenizer_config.json');
  const cfg = JSON.parse(readFileSync(cfgPath, 'utf8'));
  cfg.chat_template = readFileSync(qwenTemplate, 'utf8');
  writeFileSync(cfgPath, JSON.stringify(cfg));
  const tserver = await startServer(
    bin, [toolModel, '--parallel', '2', '--ctx', '2048', '--threads', '2', '--test-output'], 'tool server');
  const tbase = tserver.base;
  const toa = new OpenAI({ baseURL: `${tbase}/v1`, apiKey: 'unused', maxRetries: 0 });
  const tan = new Anthropic({ baseURL: tbase, apiKey: 'unused', maxRetries: 0 });
  const tools = [
    {
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'Current weather of a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      },
    },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
  ];
  const call = (name, args) => `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;
  const one = 'Let me look that up.\n' + call('get_weather', { city: 'Paris' });
  const two = call('get_weather', { city: 'Oslo' }) + '\n' + call('get_time', {});
  const user = [{ role: 'user', content: 'What is the weather in Paris?' }];
  try {
    // single call, non-streaming
    const r1 = await toa.chat.completions.create({ model: 'demo', messages: user, tools, max_tokens: 300, ember_test_output: one });
    const m1 = r1.choices[0].message;
    check(r1.choices[0].finish_reason === 'tool_calls', `openai finish_reason tool_calls (${r1.choices[0].finish_reason})`);
    check(m1.content === 'Let me look that up.\n', `openai content around the call (${JSON.stringify(m1.content)})`);
    check(m1.tool_calls?.length === 1 && m1.tool_calls[0].type === 'function' && /^call_/.test(m1.tool_calls[0].id), 'openai one tool call with an id');
    check(m1.tool_calls?.[0].function.name === 'get_weather' && JSON.parse(m1.tool_calls[0].function.arguments).city === 'Paris', 'openai call name and arguments');

    // parallel calls, non-streaming and streaming agree
    const r2 = await toa.chat.completions.create({ model: 'demo', messages: user, tools, max_tokens: 300, ember_test_output: two });
    const m2 = r2.choices[0].message;
    check(m2.tool_calls?.length === 2 && m2.tool_calls[1].function.name === 'get_time', 'openai parallel calls');
    check(m2.tool_calls?.[0].id !== m2.tool_calls?.[1].id, 'openai call ids differ');
    const s2 = await toa.chat.completions.create({ model: 'demo', messages: user, tools, max_tokens: 300, stream: true, ember_test_output: two });
    const acc = [];
    let scontent = '',
      sfinish = null;
    for await (const chunk of s2) {
      const ch = chunk.choices[0];
      if (!ch) continue;
      scontent += ch.delta.content ?? '';
      for (const tc of ch.delta.tool_calls ?? []) {
        if (!acc[tc.index]) acc[tc.index] = { id: tc.id, name: tc.function?.name, arguments: '' };
        acc[tc.index].arguments += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason) sfinish = ch.finish_reason;
    }
    check(sfinish === 'tool_calls', 'openai stream finish_reason tool_calls');
    check(scontent === (m2.content ?? ''), `openai streamed content equals non-streamed (${JSON.stringify(scontent)})`);
    check(
      acc.length === 2 && acc.every((c, i) => c.name === m2.tool_calls[i].function.name && c.arguments === m2.tool_calls[i].function.arguments && /^call_/.test(c.id)),
      'openai streamed calls equal the non-streamed calls',
    );

    // the calls fed back with their results
    const r3 = await toa.chat.completions.create({
      model: 'demo',
      tools,
      max_tokens: 300,
      messages: [
        ...user,
        m2,
        { role: 'tool', tool_call_id: m2.tool_calls[0].id, content: '12 C, rain' },
        { role: 'tool', tool_call_id: m2.tool_calls[1].id, content: '14:05' },
      ],
      ember_test_output: 'It is 12 C and raining in Oslo.',
    });
    check(r3.choices[0].message.content === 'It is 12 C and raining in Oslo.' && r3.choices[0].finish_reason === 'stop', 'openai answer after tool results');
    check(r3.usage.prompt_tokens > r2.usage.prompt_tokens, 'tool results are in the prompt');
    try {
      await toa.chat.completions.create({ model: 'demo', tools, messages: [...user, { role: 'tool', tool_call_id: 'call_nope', content: 'x' }] });
      check(false, 'a tool result for an unknown call accepted');
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && /no tool call/.test(e.message), `BadRequestError for an unknown tool_call_id (${e.message})`);
    }
    try {
      await toa.chat.completions.create({ model: 'demo', messages: user, tools: [{ type: 'function', function: { name: 'bad name' } }] });
      check(false, 'a bad tool name accepted');
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError, 'BadRequestError for a bad tool name');
    }

    // the Responses API (client.responses.create): a function_call item, its output fed back
    // through previous_response_id, the typed events, structured output, a 400
    const rtools = tools.map((t) => ({ type: 'function', name: t.function.name, description: t.function.description, parameters: t.function.parameters }));
    const ask = 'What is the weather in Paris?';
    const q1 = await toa.responses.create({ model: 'demo', input: ask, tools: rtools, max_output_tokens: 300, ember_test_output: one });
    const fcs = q1.output.filter((o) => o.type === 'function_call');
    check(q1.object === 'response' && q1.status === 'completed' && /^resp_/.test(q1.id), `responses: completed (${q1.status})`);
    check(q1.output_text === 'Let me look that up.\n', `responses: output_text (${JSON.stringify(q1.output_text)})`);
    check(
      fcs.length === 1 && fcs[0].name === 'get_weather' && JSON.parse(fcs[0].arguments).city === 'Paris' && /^call_/.test(fcs[0].call_id),
      'responses: a function_call item',
    );
    const q2 = await toa.responses.create({
      model: 'demo',
      previous_response_id: q1.id,
      input: [{ type: 'function_call_output', call_id: fcs[0].call_id, output: '20 C' }],
      tools: rtools,
      max_output_tokens: 300,
      ember_test_output: 'It is 20 C in Paris.',
    });
    check(q2.output_text === 'It is 20 C in Paris.' && q2.usage.input_tokens > q1.usage.input_tokens, 'responses: the call output through previous_response_id');
    // the stored response: retrieve, delete, then gone
    const got = await toa.responses.retrieve(q1.id);
    check(got.id === q1.id && got.status === 'completed' && JSON.stringify(got.output) === JSON.stringify(q1.output), 'responses: retrieve gives the stored response');
    await toa.responses.delete(q1.id);
    try {
      await toa.responses.retrieve(q1.id);
      check(false, 'responses: a deleted response retrieved');
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError, `responses: NotFoundError after delete (${e.message})`);
    }
    const qs = await toa.responses.create({ model: 'demo', input: ask, tools: rtools, max_output_tokens: 300, stream: true, ember_test_output: one });
    const types = [];
    let fin = null,
      sdelta = '',
      sargs = '';
    for await (const ev of qs) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') sdelta += ev.delta;
      if (ev.type === 'response.function_call_arguments.delta') sargs += ev.delta;
      if (ev.type === 'response.completed') fin = ev.response;
    }
    check(types[0] === 'response.created' && types.at(-1) === 'response.completed', `responses: stream events (${types.join(' ')})`);
    const noIds = (items) => JSON.stringify(items.map(({ id, call_id, ...rest }) => rest));
    check(sdelta === q1.output_text && sargs === fcs[0].arguments && fin && noIds(fin.output) === noIds(q1.output), 'responses: streamed equals non-streamed');
    const helper = toa.responses.stream({ model: 'demo', input: ask, max_output_tokens: 300, ember_test_output: 'Sunny.' });
    const hf = await helper.finalResponse(); // the helper's final response has no output_text convenience
    const htext = hf.output.filter((o) => o.type === 'message').flatMap((o) => o.content.map((c) => c.text)).join('');
    check(hf.status === 'completed' && htext === 'Sunny.', `responses: the SDK's stream helper (${JSON.stringify(htext)})`);
    const sj = await toa.responses.create({
      model: 'demo',
      input: 'A number please',
      max_output_tokens: 200,
      temperature: 1,
      text: { format: { type: 'json_schema', name: 'n', strict: true, schema: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'], additionalProperties: false } } },
    });
    // the grammar closes the JSON within the budget: always completed, always valid
    check(sj.status === 'completed' && Number.isInteger(JSON.parse(sj.output_text).n), `responses: json_schema output (${sj.status} ${sj.output_text})`);
    // an enforced call through the Responses API (tool_choice required): a function_call item with valid arguments
    const rq = await toa.responses.create({ model: 'demo', input: ask, tools: rtools, tool_choice: 'required', max_output_tokens: 120, temperature: 1 });
    const rfc = rq.output.filter((o) => o.type === 'function_call');
    check(rq.status === 'completed' && rfc.length === 1 && ['get_weather', 'get_time'].includes(rfc[0].name) && typeof JSON.parse(rfc[0].arguments) === 'object',
      `responses: an enforced function_call (${JSON.stringify(rq.output)})`);
    try {
      await toa.responses.create({ model: 'demo', input: [{ type: 'nope' }] });
      check(false, 'responses: an unknown item type accepted');
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === 'input', `responses: BadRequestError naming input (${e.message})`);
    }

    // Constrained decoding through the SDKs, on the random weights (no script): structured output
    // (chat.completions response_format json_schema, strict), enforced calls (OpenAI tool_choice
    // required / named, streamed too; Anthropic tool_choice any / tool, streamed too). The grammar
    // closes every answer within max_tokens, so each one is complete and valid.
    {
      const person = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 }, tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 2 } }, required: ['name', 'age'], additionalProperties: false };
      const so = await toa.chat.completions.create({ model: 'demo', messages: user, max_tokens: 120, temperature: 1, seed: 3, response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } } });
      const sp = JSON.parse(so.choices[0].message.content);
      check(so.choices[0].finish_reason === 'stop' && typeof sp.name === 'string' && sp.name.length <= 12 && Number.isInteger(sp.age) && sp.age >= 0 && sp.age <= 120,
        `openai structured output (${so.choices[0].finish_reason} ${so.choices[0].message.content})`);
      let sot = '';
      for await (const ch of await toa.chat.completions.create({ model: 'demo', messages: user, max_tokens: 120, temperature: 1, seed: 3, stream: true, response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } } }))
        sot += ch.choices[0]?.delta?.content ?? '';
      check(sot === so.choices[0].message.content, 'openai structured output streamed equals non-streamed');
      const fr = await toa.chat.completions.create({ model: 'demo', messages: user, tools, tool_choice: 'required', max_tokens: 150, temperature: 1, seed: 5 });
      const fcall = fr.choices[0].message.tool_calls?.[0];
      check(fr.choices[0].finish_reason === 'tool_calls' && fcall && ['get_weather', 'get_time'].includes(fcall.function.name), `openai tool_choice required (${JSON.stringify(fr.choices[0])})`);
      if (fcall?.function.name === 'get_weather') check(typeof JSON.parse(fcall.function.arguments).city === 'string', 'openai enforced arguments follow the schema');
      const named = { type: 'function', function: { name: 'get_weather' } };
      const nr = await toa.chat.completions.create({ model: 'demo', messages: user, tools, tool_choice: named, max_tokens: 150, temperature: 1, seed: 6 });
      const ncall = nr.choices[0].message.tool_calls?.[0];
      check(nr.choices[0].finish_reason === 'tool_calls' && ncall?.function.name === 'get_weather' && typeof JSON.parse(ncall.function.arguments).city === 'string', `openai named tool_choice (${JSON.stringify(nr.choices[0])})`);
      let nargs = '', nname = null, nfin = null;
      for await (const ch of await toa.chat.completions.create({ model: 'demo', messages: user, tools, tool_choice: named, max_tokens: 150, temperature: 1, seed: 6, stream: true })) {
        for (const tc of ch.choices[0]?.delta?.tool_calls ?? []) {
          if (tc.function?.name) nname = tc.function.name;
          nargs += tc.function?.arguments ?? '';
        }
        nfin = ch.choices[0]?.finish_reason ?? nfin;
      }
      check(nname === 'get_weather' && nargs === ncall?.function.arguments && nfin === 'tool_calls', 'openai named tool_choice streamed equals non-streamed');
      const aw = [{ name: 'get_weather', description: 'Current weather', input_schema: tools[0].function.parameters }];
      const af1 = await tan.messages.create({ model: 'demo', max_tokens: 150, temperature: 1, tools: aw, tool_choice: { type: 'tool', name: 'get_weather' }, messages: user });
      const au = af1.content.find((b) => b.type === 'tool_use');
      check(af1.stop_reason === 'tool_use' && au?.name === 'get_weather' && typeof au.input.city === 'string', `anthropic forced tool (${JSON.stringify(af1.content)})`);
      const afs = tan.messages.stream({ model: 'demo', max_tokens: 150, temperature: 1, tools: aw, tool_choice: { type: 'any' }, messages: user });
      const aff = await afs.finalMessage();
      const afu = aff.content.find((b) => b.type === 'tool_use');
      check(aff.stop_reason === 'tool_use' && afu?.name === 'get_weather' && typeof afu.input.city === 'string', `anthropic tool_choice any, streamed (${JSON.stringify(aff.content)})`);
    }

    // Anthropic: tool_use blocks, streaming through the SDK's accumulator, results fed back
    const atools = tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
    const a1 = await tan.messages.create({ model: 'demo', max_tokens: 300, messages: user, tools: atools, ember_test_output: one + '\n' + call('get_time', {}) });
    check(a1.stop_reason === 'tool_use', `anthropic stop_reason tool_use (${a1.stop_reason})`);
    const uses = a1.content.filter((b) => b.type === 'tool_use');
    check(a1.content[0].type === 'text' && a1.content[0].text === 'Let me look that up.\n', 'anthropic text block before the calls');
    check(uses.length === 2 && /^toolu_/.test(uses[0].id) && uses[0].name === 'get_weather' && uses[0].input.city === 'Paris', 'anthropic tool_use blocks');
    const as = tan.messages.stream({ model: 'demo', max_tokens: 300, messages: user, tools: atools, ember_test_output: one + '\n' + call('get_time', {}) });
    const kinds = [];
    for await (const ev of as) if (ev.type === 'content_block_delta') kinds.push(ev.delta.type);
    const af = await as.finalMessage();
    const strip = (blocks) => blocks.map(({ id, ...rest }) => rest);
    check(JSON.stringify(strip(af.content)) === JSON.stringify(strip(a1.content)), `anthropic streamed blocks equal non-streamed (${JSON.stringify(af.content)})`);
    check(kinds.includes('input_json_delta') && af.stop_reason === 'tool_use', 'anthropic input_json_delta events');
    const a2 = await tan.messages.create({
      model: 'demo',
      max_tokens: 300,
      tools: atools,
      messages: [
        ...user,
        { role: 'assistant', content: a1.content },
        {
          role: 'user',
          content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, content: u.name === 'get_time' ? '09:30' : '20 C' })),
        },
      ],
      ember_test_output: 'It is 20 C in Paris at 09:30.',
    });
    check(a2.stop_reason === 'end_turn' && a2.content[0].text === 'It is 20 C in Paris at 09:30.', 'anthropic answer after tool results');
    try {
      await tan.messages.create({ model: 'demo', max_tokens: 5, tools: atools, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_nope', content: 'x' }] }] });
      check(false, 'anthropic tool_result for an unknown call accepted');
    } catch (e) {
      check(e instanceof Anthropic.BadRequestError, 'anthropic BadRequestError for an unknown tool_use_id');
    }
  } catch (e) {
    failures++;
    console.error('FAIL: unexpected exception in the tool checks', e);
  }
  const texited = await stopServer(tserver);
  check(texited && texited.code === 0, 'tool server exits 0 on SIGTERM');
  rmSync(toolModel, { recursive: true, force: true });
}

// graceful stop: SIGTERM, exit 0
const exited = await stopServer(server);
check(exited && exited.code === 0, `server exits 0 on SIGTERM (${JSON.stringify(exited)})`);

console.error(`${checks} checks, ${failures} failed`);
process.exit(failures ? 1 : 0);
