// A multi-turn tool conversation in one session, driven by the official OpenAI SDK (npm `openai`,
// pinned in tests/fixtures/tokenizers/) against `colocated-rl serve` over a model with Qwen3's real
// tokenizer and chat template (random weights). Each turn the client sends the whole conversation
// back as the SDK returned it, naming the session by header or by body field; the server must
// keep the session's ids: a turn's prompt is the ids held so far plus the new text, also where
// Qwen3's template rewrites an earlier turn (issue 52: the new messages are rendered against a
// fixed base, the earlier replies stay as sampled), so 10 turns are one segment and each later
// turn finds every id held before it in the prefix cache but the last. An edited message is
// refused with 409; a retry rewinds.
//
// usage: node tests/server/openai_sdk_session.mjs BINARY FIXTURES_DIR WORK_DIR TEMPLATES_DIR
//   TEMPLATES_DIR: tests/fixtures/chat_templates (Qwen2.5's template, prefix-preserving).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const [binary, fixtures, work, templatesDir] = process.argv.slice(2);
if (!binary || !fixtures || !work || !templatesDir) {
  console.error('usage: node openai_sdk_session.mjs BINARY FIXTURES_DIR WORK_DIR TEMPLATES_DIR');
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
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const startsWith = (a, b) => a.length >= b.length && b.every((x, i) => a[i] === x);

const model = path.join(work, 'm');
fs.rmSync(work, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });
execFileSync(binary, ['make-model', '--out', model, '--shape', 'qwen3-0.6b', '--hidden', '32', '--ffn', '64',
                      '--layers', '1', '--heads', '2', '--kv-heads', '1', '--max-pos', '2048',
                      '--tokenizer-from', path.join(fixtures, 'qwen3')], { stdio: 'inherit' });

// Serves `modelDir` and drives one conversation through it.
async function run(name, modelDir) {
  const server = spawn(binary, ['serve', '--model', modelDir, '--port', '0', '--served-model-name', 'q', '--threads', '1'],
                       { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  try {
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
    for (let waited = 0; ; waited += 200) {
      const res = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
      if (res?.status === 200) break;
      if (waited > 120000) throw new Error(`serve not healthy in 120 s:\n${log}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
    const tools = [{ type: 'function', function: { name: 'calc', description: 'Evaluates arithmetic.',
                                                    parameters: { type: 'object', properties: { expr: { type: 'string' } } } } }];
    const tokenize = async (messages) => {
      const res = await fetch(`http://127.0.0.1:${port}/tokenize`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ messages, tools }) });
      return (await res.json()).tokens;
    };
    const turn = (messages, t) => client.chat.completions.create(
      // Odd turns name the session in the body, even ones by header.
      { model: 'q', messages, tools, max_tokens: 12, temperature: 1, seed: t, return_token_ids: true,
        ...(t % 2 ? { session_id: 'sdk-1' } : {}) },
      t % 2 ? {} : { headers: { 'X-Session-Id': 'sdk-1' } });

    const messages = [{ role: 'system', content: 'You can call calc.' }, { role: 'user', content: 'What is 17 * 23?' }];
    let held = [];     // the ids of the current segment
    let before = 0;    // the ids of the earlier segments
    let segments = 0;
    let sent = [];
    let cachedShare = 1;  // the lowest share of a turn's held ids served from the cache
    for (let t = 0; t < 10; t++) {
      sent = structuredClone(messages);
      const r = await turn(messages, t);
      const prompt = r.prompt_token_ids;
      const reply = r.choices[0].token_ids;
      check(Array.isArray(prompt) && Array.isArray(reply), `${name} turn ${t}: no token ids`);
      check(r.session?.id === 'sdk-1', `${name} turn ${t}: session ${JSON.stringify(r.session)}`);
      if (t === 0 || r.session.new_segment) {
        before += held.length;
        // A fresh render: the same ids /tokenize gives for the conversation.
        check(same(prompt, await tokenize(messages)), `${name} turn ${t}: a fresh prompt is not the render's ids`);
        segments++;
      } else {
        check(startsWith(prompt, held), `${name} turn ${t}: the prompt does not start with the session's ids`);
        check(r.usage.prompt_tokens_details.cached_tokens === held.length - 1,
              `${name} turn ${t}: ${r.usage.prompt_tokens_details.cached_tokens} cached of ${held.length} held`);
        cachedShare = Math.min(cachedShare, r.usage.prompt_tokens_details.cached_tokens / held.length);
      }
      check(r.session.segments === segments, `${name} turn ${t}: ${r.session.segments} segments, expected ${segments}`);
      held = prompt.concat(reply);
      check(r.session.length === before + held.length,
            `${name} turn ${t}: length ${r.session.length} != ${before} + ${held.length}`);
      messages.push(r.choices[0].message);  // as the SDK returned it
      messages.push(t % 3 === 1 ? { role: 'user', content: `and now ${t}?` }
                                : { role: 'tool', tool_call_id: `call_${t}`, content: String(391 + t) });
    }

    check(segments === 1, `${name}: ${segments} segments in 10 turns`);
    check(cachedShare >= 0.95, `${name}: a turn found only ${cachedShare} of its held ids cached`);
    console.log(`${name}: 10 turns, ${segments} segment, at least ${(100 * cachedShare).toFixed(1)}% of each later turn's held ids from the cache`);

    // An edit of an earlier message: 409 naming it.
    const edited = structuredClone(messages);
    edited[1].content = 'What is 17 * 24?';
    try {
      await turn(edited, 1);
      check(false, 'an edited conversation was accepted');
    } catch (e) {
      check(e.status === 409, `an edit got ${e.status}`);
      check(String(e.message).includes('message 1 differs'), `the 409 says: ${e.message}`);
    }
    // A retry of the last turn: the history it was sent with, another last message.
    const retry = sent.slice(0, -1).concat([{ role: 'user', content: 'never mind: what is 2 + 2?' }]);
    const r = await turn(retry, 9);
    check(r.session.rewound === true, `the retry was not rewound: ${JSON.stringify(r.session)}`);
  } finally {
    server.kill('SIGTERM');
  }
}

await run('Qwen3', model);
// The same model with Qwen2.5's template, which never rewrites an earlier turn: every later turn
// is the ids held plus the new text.
const model25 = path.join(work, 'm25');
fs.cpSync(model, model25, { recursive: true });
const fixtureTemplates = JSON.parse(fs.readFileSync(path.join(templatesDir, 'templates.json'), 'utf8'));
fs.writeFileSync(path.join(model25, 'chat_template.jinja'),
                 fixtureTemplates.find((t) => t.name === 'Qwen2.5-7B-Instruct').template);
await run('Qwen2.5', model25);

if (failures) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('OK: a multi-turn tool conversation kept its ids through the OpenAI SDK');
