// Log-prob tokens through the official OpenAI SDK (npm `openai`, pinned in
// tests/fixtures/tokenizers/): a model with Qwen3's real byte-level tokenizer (random weights) is
// served by `colocated-rl serve`, and over many random completions, streamed and not, chat and
// completions, each log-prob entry's `token` is its `bytes` as UTF-8 and the entries' bytes
// concatenate to the content (exactly where the content is valid UTF-8; where the model produced
// invalid UTF-8, to the bytes the content was repaired from).
//
// usage: node tests/server/openai_sdk_logprobs.mjs BINARY FIXTURES_DIR WORK_DIR
//   FIXTURES_DIR: what scripts/tokenizer_fixtures.sh made (qwen3/, npm/node_modules/openai).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const [binary, fixtures, work] = process.argv.slice(2);
if (!binary || !fixtures || !work) {
  console.error('usage: node openai_sdk_logprobs.mjs BINARY FIXTURES_DIR WORK_DIR');
  process.exit(2);
}
const { default: OpenAI } = await import(path.join(fixtures, 'npm/node_modules/openai/index.mjs'));

let failures = 0;
function check(ok, what) {
  if (!ok) {
    failures++;
    if (failures <= 10) console.error(`FAIL: ${what}`);
  }
}

const model = path.join(work, 'm');
fs.rmSync(work, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });
execFileSync(binary, ['make-model', '--out', model, '--shape', 'qwen3-0.6b', '--hidden', '32', '--ffn', '64',
                      '--layers', '1', '--heads', '2', '--kv-heads', '1', '--max-pos', '256',
                      '--tokenizer-from', path.join(fixtures, 'qwen3')], { stdio: 'inherit' });
const tokenizer = JSON.parse(fs.readFileSync(path.join(model, 'tokenizer.json'), 'utf8'));
const specials = new Set(tokenizer.added_tokens.filter((t) => t.special).map((t) => t.content));

const server = spawn(binary, ['serve', '--model', model, '--port', '0', '--served-model-name', 'q', '--threads', '1'],
                     { stdio: ['ignore', 'pipe', 'pipe'] });
let log = '';
const port = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`serve did not start in 120 s:\n${log}`)), 120000);
  const look = (data) => {
    log += data;
    const m = log.match(/serving q on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) {
      clearTimeout(timer);
      resolve(Number(m[1]));
    }
  };
  server.stdout.on('data', look);
  server.stderr.on('data', look);
  server.on('exit', (code) => reject(new Error(`serve exited with ${code}:\n${log}`)));
});

// Ready when /health says so (the port opens before the model has loaded).
for (let waited = 0; ; waited += 200) {
  const res = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
  if (res?.status === 200) break;
  if (waited > 120000) throw new Error(`serve not healthy in 120 s:\n${log}`);
  await new Promise((r) => setTimeout(r, 200));
}
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
const decoder = (b) => Buffer.from(b).toString('utf8');  // WHATWG: maximal subparts -> U+FFFD

// One choice: [{token, bytes}] and its content.
function checkChoice(what, entries, content) {
  const parts = [];
  for (const [i, e] of entries.entries()) {
    check(Array.isArray(e.bytes), `${what}: entry ${i} has no bytes`);
    check(e.token === decoder(e.bytes), `${what}: entry ${i} token ${JSON.stringify(e.token)} is not its bytes ${JSON.stringify(e.bytes)}`);
    for (const t of e.top_logprobs ?? []) {
      check(t.token === decoder(t.bytes), `${what}: an alternative of entry ${i} is not its bytes`);
    }
    if (!specials.has(e.token)) parts.push(Buffer.from(e.bytes));
  }
  const all = Buffer.concat(parts);
  if (content.includes('\uFFFD')) {
    check(decoder(all) === content, `${what}: the bytes decode to ${JSON.stringify(decoder(all))}, content ${JSON.stringify(content)}`);
  } else {
    check(all.equals(Buffer.from(content, 'utf8')), `${what}: the bytes ${JSON.stringify(decoder(all))} are not the content ${JSON.stringify(content)}`);
  }
  // Whether a token's bytes alone are not valid UTF-8 (it ends or starts inside a character).
  return entries.some((e) => !Buffer.from(decoder(e.bytes), 'utf8').equals(Buffer.from(e.bytes)));
}

let choices = 0;
let partial = 0;
try {
  for (let seed = 0; seed < 8; seed++) {
    const common = { model: 'q', max_tokens: 24, temperature: 1.0, seed, n: 2, ignore_eos: true };
    const messages = [{ role: 'user', content: `Say something in 中文 and 日本語 (${seed}).` }];
    const chat = await client.chat.completions.create({ ...common, messages, logprobs: true, top_logprobs: 2 });
    for (const ch of chat.choices) {
      partial += checkChoice(`chat seed ${seed} choice ${ch.index}`, ch.logprobs.content, ch.message.content);
      choices++;
    }
    const stream = await client.chat.completions.create({ ...common, messages, logprobs: true, top_logprobs: 1, stream: true });
    const content = new Map();
    const entries = new Map();
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        content.set(ch.index, (content.get(ch.index) ?? '') + (ch.delta?.content ?? ''));
        entries.set(ch.index, [...(entries.get(ch.index) ?? []), ...(ch.logprobs?.content ?? [])]);
      }
    }
    check(content.size === 2, `streamed chat seed ${seed}: ${content.size} choices`);
    for (const [idx, c] of content) {
      partial += checkChoice(`streamed chat seed ${seed} choice ${idx}`, entries.get(idx), c);
      choices++;
    }
    // /v1/completions: tokens carry text only; their concatenation is the text where it is valid.
    const done = await client.completions.create({ ...common, prompt: 'Once upon a time 日本', logprobs: 1 });
    for (const ch of done.choices) {
      const text = ch.logprobs.tokens.filter((t) => !specials.has(t)).join('');
      if (!ch.text.includes('\uFFFD')) check(text === ch.text, `completions seed ${seed}: tokens ${JSON.stringify(text)} != text ${JSON.stringify(ch.text)}`);
      check(!ch.logprobs.tokens.some((t) => /[\u0120\u010a]/.test(t)), `completions seed ${seed}: a raw byte-level piece in ${JSON.stringify(ch.logprobs.tokens)}`);
      choices++;
    }
  }
} finally {
  server.kill('SIGTERM');
}
console.log(`openai sdk ${JSON.parse(fs.readFileSync(path.join(fixtures, 'npm/node_modules/openai/package.json'))).version}: ` +
            `${choices} choices checked, ${partial} with a token that ends inside a character, ${failures} failures`);
process.exit(failures === 0 && choices >= 48 ? 0 : 1);
