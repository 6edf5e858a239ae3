#!/usr/bin/env node
// Hugging Face tokenizers (Rust, Node binding) on a document: the reference side of
// `colocated-rl bench tokenizer` (bench/tokenizer_bench.cpp).
//
//   node bench/hf_tokenize.mjs --npm-dir DIR TOKENIZER_JSON CHUNKS_JSON [--repeats N]
//
// DIR holds node_modules/tokenizers (scripts/tokenizer_fixtures.sh installs it into OUT_DIR/npm).
// CHUNKS_JSON is a JSON array of strings: the document, split in chunks. Encodes without special
// tokens, as `Tokenizer::encode` does by default.
//   1T: encode(chunk) for each chunk in turn, each awaited before the next: one thread at a time
//       (a single encode does not use rayon).
//   NT: encodeBatch(all chunks): rayon's pool, RAYON_NUM_THREADS threads (the caller sets it).
//
// With --repeats N: runs N paired repeats (after a warm-up), prints the medians as one JSON line.
// Without: a server for the C++ side, which pairs each of our runs with one of these. It prints
// {"ready": ...} once loaded, then answers each stdin line with one JSON line on stdout:
//   "1t" / "nt"   -> {"seconds": S}
//   "ids PATH"    -> writes the ids of every chunk (JSON array of arrays) to PATH; {"ok": true}
//   "quit"        -> exits
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { createRequire } from 'node:module';

function fail(msg) {
  process.stderr.write(`hf_tokenize.mjs: ${msg}\n`);
  process.exit(1);
}

const args = process.argv.slice(2);
let npmDir = null, repeats = 0;
const pos = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--npm-dir') npmDir = args[++i];
  else if (args[i] === '--repeats') repeats = Number(args[++i]);
  else pos.push(args[i]);
}
if (pos.length !== 2 || !npmDir) {
  fail('usage: node hf_tokenize.mjs --npm-dir DIR TOKENIZER_JSON CHUNKS_JSON [--repeats N]');
}
const [tokenizerJson, chunksJson] = pos;

let Tokenizer;
try {
  ({ Tokenizer } = createRequire(path.join(path.resolve(npmDir), 'package.json'))('tokenizers'));
} catch (e) {
  fail(`cannot load the tokenizers package from ${npmDir}/node_modules: ${e.message}`);
}
const chunks = JSON.parse(fs.readFileSync(chunksJson, 'utf8'));
const t0 = process.hrtime.bigint();
const tok = Tokenizer.fromFile(tokenizerJson);
const loadSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
const opts = { addSpecialTokens: false };

async function run1t() {
  const start = process.hrtime.bigint();
  for (const c of chunks) await tok.encode(c, null, opts);
  return Number(process.hrtime.bigint() - start) / 1e9;
}

async function runNt() {
  const start = process.hrtime.bigint();
  await tok.encodeBatch(chunks, opts);
  return Number(process.hrtime.bigint() - start) / 1e9;
}

const median = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const bytes = chunks.reduce((a, c) => a + Buffer.byteLength(c, 'utf8'), 0);
if (repeats > 0) {
  await run1t();
  await runNt();
  const one = [], many = [];
  for (let r = 0; r < repeats; ++r) {
    one.push(await run1t());
    many.push(await runNt());
  }
  const m1 = median(one), mn = median(many);
  console.log(JSON.stringify({
    tokenizer: tokenizerJson, bytes, chunks: chunks.length, load_s: loadSeconds,
    rayon_threads: process.env.RAYON_NUM_THREADS ?? null,
    hf_1t_s: m1, hf_nt_s: mn, hf_1t_mb_s: bytes / 1e6 / m1, hf_nt_mb_s: bytes / 1e6 / mn,
  }));
} else {
  console.log(JSON.stringify({ ready: true, load_s: loadSeconds, bytes, chunks: chunks.length }));
  const rl = readline.createInterface({ input: process.stdin, terminal: false });
  for await (const line of rl) {
    const cmd = line.trim();
    try {
      if (cmd === '1t') console.log(JSON.stringify({ seconds: await run1t() }));
      else if (cmd === 'nt') console.log(JSON.stringify({ seconds: await runNt() }));
      else if (cmd.startsWith('ids ')) {
        const encs = await tok.encodeBatch(chunks, opts);
        fs.writeFileSync(cmd.slice(4), JSON.stringify(encs.map((e) => e.getIds())));
        console.log(JSON.stringify({ ok: true }));
      } else if (cmd === 'quit') break;
      else console.log(JSON.stringify({ error: `unknown command ${cmd}` }));
    } catch (e) {
      console.log(JSON.stringify({ error: String(e && e.message ? e.message : e) }));
    }
  }
  process.exit(0);
}
