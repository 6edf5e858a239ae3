#!/usr/bin/env node
// Conformance fixtures for the tokenizer.json implementation (text/hf/): a deterministic
// corpus and, for each real tokenizer, what Hugging Face's own tokenizers library (the Rust crate,
// through its Node binding) gives for it. Run by scripts/tokenizer_fixtures.sh OUT_DIR, which
// installs the pinned packages (tests/fixtures/tokenizers/package.json) into OUT_DIR/npm first.
//
// Writes:
//   OUT_DIR/corpus.json            {"version", "strings": [...]} (no randomness but a fixed seed)
//   OUT_DIR/<name>/tokenizer.json, tokenizer_config.json   symlinks into OUT_DIR/npm/node_modules
//   OUT_DIR/<name>/expected.json   per corpus string (same index): see write_expected below
//
// Used by tests/text/hf_tokenizer_conformance_test.cpp and `colocated-rl bench tokenizer`.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const OUT = process.argv[2];
if (!OUT) {
  console.error('usage: node scripts/tokenizer_fixtures.mjs OUT_DIR (OUT_DIR/npm holds the packages)');
  process.exit(2);
}
const NPM = path.resolve(OUT, 'npm');
const require = createRequire(path.join(NPM, 'package.json'));
const { Tokenizer } = require('tokenizers');
const TOKENIZERS_VERSION = require('tokenizers/package.json').version;

const NAMES = ['qwen3', 'llama3_1', 'llama2', 'deepseek_v3', 'gemma3', 'gpt4o'];
const CORPUS_VERSION = 1;

// ---------------------------------------------------------------------------------------------
// The corpus.

// mulberry32: a small seeded PRNG, so the shuffles below are the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function added_tokens(tok_json) {
  return tok_json.added_tokens.map((t) => ({ content: t.content, special: !!t.special }));
}

function build_corpus(tokenizer_jsons) {
  const s = [];
  const add = (...xs) => s.push(...xs);

  // Empty, whitespace and newline runs.
  add('', ' ', '  ', '   ', '    ', '        ', '\n', '\n\n', '\n\n\n', '\n\n\n\n\n', '\t', '\t\t',
      '\t\t\t', '\r\n', '\r\n\r\n', '\r', ' \n', '\n ', ' \n ', '  \n\n  ', '\t \n \t', ' \t',
      'a b', 'a  b', 'a   b', 'a    b', 'a\tb', 'a\t\tb', 'a\nb', 'a\n\nb', 'a\n\n\nb',
      'a\r\nb', 'a \r\n b', 'a\n \nb', 'end.\n', 'end.\n\n', 'end. \n', 'x \n\n y',
      '\u00a0', 'a\u00a0b', '\u3000', '\u3000\u3000text', 'zero\u200bwidth', '\ufeffbom',
      'line\u2028sep', 'para\u2029sep', 'nel\u0085next', 'vt\u000bff\u000ccr', 'ctl\u0001\u001f\u007fend',
      'nul\u0000byte');
  // Leading and trailing spaces.
  add(' hello', 'hello ', ' hello ', '  hello', 'hello  ', '   hello world   ', '\thello',
      'hello\t', '\nhello', 'hello\n', ' Hello World', 'Hello  World', 'Hello   World ');

  // Prose.
  const prose = [
    'Hello world',
    'The quick brown fox jumps over the lazy dog.',
    'THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!',
    'It was the best of times, it was the worst of times.',
    'Reinforcement learning from human feedback (RLHF) fine-tunes a policy.',
    'Question: what is 3 plus 4? Answer: 7',
    'Mr. O\'Neil paid $1,234.56 for 3.5 kg of café au lait on 2024-02-29.',
    'e.g. i.e. etc. vs. Dr. St. U.S.A.',
    'snake_case camelCase PascalCase kebab-case SCREAMING_SNAKE_CASE',
  ];
  add(...prose);
  // Contractions in both cases.
  add("I'LL", "I'll", "i'll", "don't", "DON'T", "Don't", "she's", "SHE'S", "they're", "THEY'RE",
      "we've", "WE'VE", "I'm", "I'M", "you'd", "YOU'D", "it's", "IT'S", "won't", "can't",
      "'s", "'S", "'t", "'ll", "'re", "'ve", "'m", "'d", "rock 'n' roll", "'quoted'",
      "don\u2019t", "James' car", "o'clock", "I'LL BE BACK, don't worry, she's fine.",
      "y'all'd've", "'''triple'''");
  // Numbers.
  add('0', '7', '42', '123', '1234', '12345', '123456789', '1234567890123456789012345678901234567890',
      '3.14159265358979323846264338327950288419716939937510', '1,000,000', '1_000_000',
      '-273.15', '+1 (555) 010-9999', '0x7fffffff', '0b101010', '1e-10', '6.022e23',
      '2024-02-29T13:37:00Z', 'v1.2.3-rc.4', 'Price: 99.99 EUR', 'x1y22z333w4444',
      '\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669', '\uff11\uff12\uff13\uff14',
      'x\u00b2 + y\u00b3 = z\u2074', '\u2160\u2161\u2162 \u00bd \u2153');
  // Punctuation runs.
  add('!!!', '???', '?!?!', '...', '....', '\u2026', '---', '\u2014\u2013-', '=====', '*****',
      '~~~', '```', '###', '>>>', '<<<', '<<>>', '()[]{}', '@#$%^&*', '!@#$%^&*()_+-=[]{}|;:\'",.<>/?`~',
      '\u00ab\u00bb \u201cquoted\u201d \u2018single\u2019 \u201efoo\u201c', '\u00bfQu\u00e9? \u00a1S\u00ed!',
      'Wait... what?!', 'Hello,world!How are you?Fine.', ':-) ;-) :D <3', '->', '=>', '!=', '==',
      '===', '<=', '>=', '&&', '||', '::', '//', '/*', '*/', '#!/bin/sh');
  // Long words.
  add('Pneumonoultramicroscopicsilicovolcanoconiosis', 'supercalifragilisticexpialidocious',
      'Donaudampfschifffahrtsgesellschaftskapit\u00e4n', 'a'.repeat(1000), 'ab'.repeat(500),
      'abc'.repeat(333) + 'd', 'x'.repeat(100) + ' ' + 'y'.repeat(100), 'A'.repeat(300),
      '\u00e9'.repeat(200), '\u4e2d'.repeat(300), '9'.repeat(500), ' '.repeat(200), '\n'.repeat(100),
      '\t'.repeat(50), '-'.repeat(120), '=+'.repeat(100), 'antidisestablishmentarianism!');
  // Emoji.
  add('\u{1F600}', '\u{1F600}\u{1F603}\u{1F604}', '\u{1F44D}', '\u{1F44D}\u{1F3FD}', '\u{1F44D}\u{1F3FF} nice',
      '\u{1F468}\u200d\u{1F469}\u200d\u{1F467}\u200d\u{1F466}', '\u{1F3F3}\ufe0f\u200d\u{1F308}',
      '\u2764\ufe0f', '\u2764', '\u{1F1FA}\u{1F1F8}\u{1F1EF}\u{1F1F5}', '\u{1F9D1}\u{1F3FF}\u200d\u{1F4BB}',
      'I \u2764\ufe0f NY \u{1F5FD}', '\u{1F680} launch \u{1F680}\u{1F680}', '\u{1F937}\u200d\u2642\ufe0f',
      'a\u{1F600}b', '\u{1F600} ', ' \u{1F600}', '\u{1F4AF}%', '\u{1FAE0}\u{1FAE8}');
  // Scripts.
  add('\u4f60\u597d\uff0c\u4e16\u754c\uff01', '\u4e2d\u534e\u4eba\u6c11\u5171\u548c\u56fd\u6210\u7acb\u4e8e1949\u5e74\u3002',
      '\u673a\u5668\u5b66\u4e60\u662f\u4eba\u5de5\u667a\u80fd\u7684\u4e00\u4e2a\u5206\u652f', '\u7e41\u9ad4\u4e2d\u6587\u5b57',
      '\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\u3002', '\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57',
      '\u6771\u4eac\u90fd\u6e0b\u8c37\u533a\u3067\u30e9\u30fc\u30e1\u30f3\u3092\u98df\u3079\u305f\u3002', '\uff8a\uff9d\uff76\uff78\uff76\uff80\uff76\uff85',
      '\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4', '\ud55c\uad6d\uc5b4 \ud615\ud0dc\uc18c \ubd84\uc11d\uae30',
      '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645', '\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629\u064f \u062c\u0645\u064a\u0644\u0629\u064c',
      '\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd', '\u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea',
      '\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e', '\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e \u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f',
      '\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01', '\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07',
      '\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u043b\u043a\u0430', '\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5',
      'Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u', '\u0130stanbul \u0131\u0131 \u0130I', 'Stra\u00dfe STRASSE \u1e9e', '\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8',
      '\u12a0\u121b\u122d\u129b', '\u0ba4\u0bae\u0bbf\u0bb4\u0bcd', '\u09ac\u09be\u0982\u09b2\u09be', '\u0564\u0561\u0577\u057f',
      '\u1798\u17d2\u179a\u17b6\u1789\u17cb', '\u0f56\u0f7c\u0f51\u0f0b\u0f61\u0f72\u0f42', 'mixed English \u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 end');
  // Combining marks: NFC and NFD spellings of the same text.
  add('\u00e9', 'e\u0301', 'caf\u00e9', 'cafe\u0301', 'Cr\u00e8me br\u00fbl\u00e9e', 'Cre\u0300me bru\u0302le\u0301e',
      '\u00c5ngstr\u00f6m \u212b', 'A\u030angstro\u0308m', '\u2126 ohm', '\ud55c', '\u1112\u1161\u11ab',
      'n\u0303', '\u00f1', 'a\u0301\u0302\u0303\u0304', 'Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dalgo',
      '\ufb01 ligature', '\u00bd', '\uff21\uff22\uff23 fullwidth', '\u0071\u0307\u0323', '\u1e9b\u0323');
  // Byte-fallback look-alikes, replacement characters, private use, astral planes.
  add('<0x41>', '<0x0A>', '<0xFF><0xFE>', '<unk>', '\ufffd', '\ufffd\ufffd', '\ue000\uf8ff',
      '\u{10FFFD}', '\u{1D400}\u{1D401}', '\u{20000}\u{2A6D6}', '\u{1F0A1}', '\u0378', '\u00ad soft hyphen');
  // Code.
  add('def f(x):\n\treturn x + 1\n',
      'def main():\n    for i in range(10):\n        if i % 2 == 0:\n            print(i)\n',
      'int main(void) {\n\tprintf("hi\\n");\n\treturn 0;\n}\n',
      'func (s *Server) Run() error {\n\tfor {\n\t\tselect {\n\t\tcase <-s.done:\n\t\t\treturn nil\n\t\t}\n\t}\n}',
      'all: build\n\nbuild:\n\t$(CC) -O2 -o $@ $^\n',
      'key:\n  - a: 1\n    b: [x, y]\n  - c: "z"\n',
      'const f = async (a, b) => { await g(a ?? b); };',
      'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;',
      '#include <vector>\ntemplate <typename T>\nstd::vector<T> v{1, 2, 3};',
      'if (a&&b||!c) {x+=1;}else{y-=2;}', '    indented four', '\t\tindented two tabs',
      '        \n        x = 1\n', 'x = [\n  1,\n  2,\n]\n', 'fn main() -> Result<(), Box<dyn Error>> {}',
      '$ ls -la /usr/local/bin | grep -v "^d" > out.txt 2>&1', 'C:\\Users\\me\\Documents\\file.txt',
      '/^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$/i', 'SGVsbG8gV29ybGQhIFRoaXMgaXMgYmFzZTY0Lg==',
      'deadbeef cafebabe 0123456789abcdef', '550e8400-e29b-41d4-a716-446655440000');
  // URLs, JSON, LaTeX, markdown, HTML.
  add('https://huggingface.co/docs/tokenizers/python/latest/api/reference.html#tokenizer',
      'http://example.com/path?query=a%20b&x=1#frag', 'mailto:someone@example.org', 'www.example.co.uk',
      '{"name": "qwen", "ids": [1, 2, 3], "nested": {"ok": true, "v": null}}',
      '{\n  "a": 1,\n  "b": [\n    "x",\n    "y"\n  ]\n}', '[{"role":"user","content":"hi"}]',
      '$E = mc^2$', '\\frac{\\partial L}{\\partial \\theta} = \\sum_{i=1}^{N} \\nabla_\\theta \\log \\pi(a_i|s_i)',
      '\\begin{align}\n  x &= \\sqrt{y^2 + z^2} \\\\\n  \\alpha &\\approx 0.5\n\\end{align}',
      '| col A | col B |\n|---|---:|\n| 1 | two |\n| 3 | four |\n',
      '# Title\n\n## Subtitle\n\n- item 1\n- item 2\n  - nested\n\n> quote\n\n**bold** _italic_ `code`',
      '```python\nprint("hi")\n```', '<div class="x"><p>Hello&nbsp;&amp;&lt;world&gt;</p></div>',
      '<!-- comment --><br/><img src="a.png" alt=""/>', '[link](https://example.com) ![img](a.png)');

  // Special-token literals of each tokenizer, and near misses.
  add('<|im_start|>user\nhi<|im_end|>',
      '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n',
      '<|begin_of_text|>', '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>',
      '<|end_of_text|>', '<|eot_id|>', '<s>', '</s>', '<s>[INST] hi [/INST]', '<s> hello</s>',
      'text<s>text</s>text', ' <s> ', '<think>', '</think>', '<think>\nLet me reason.\n</think>\n\nThe answer is 4.',
      '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', '<|endoftext|>', '<|endofprompt|>',
      'a<|endoftext|>b', '<|endoftext|><|endoftext|>', '<｜begin▁of▁sentence｜>', '<｜User｜>hi<｜Assistant｜>',
      '<｜end▁of▁sentence｜>', '<|EOT|>', '<bos>', '<eos>', '<pad>', '<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n',
      '<start_of_image>', '<unused0>', '<mask>', '<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>',
      '<|reserved_special_token_5|>', '<|im_start', 'im_start|>', '<|im_start|', '<<|im_start|>>', '< |im_start| >',
      '<|IM_START|>', ' <|im_end|> ', '\n<|im_end|>\n', '<|im_end|><|im_end|>', '<s><s></s></s>', '<S>',
      '<|unknown_token|>', '<|start_header_id|>');
  // Per tokenizer: a few of its own added tokens, inside text.
  for (const name of NAMES) {
    const toks = added_tokens(tokenizer_jsons[name]);
    const special = toks.filter((t) => t.special);
    const plain = toks.filter((t) => !t.special);
    const pick = (xs, n) => xs.length <= n ? xs : [...xs.slice(0, n - 1), xs[xs.length - 1]];
    for (const t of pick(special, 4)) add(`x${t.content}y`, ` ${t.content} hi`);
    for (const t of pick(plain, 3)) add(`a ${t.content}b`);
  }

  // Seed sentences in variants (spacing, case, newlines): the tokenizers' pre-tokenizers treat
  // each differently.
  const seeds = ['Hello world', 'The quick brown fox', "don't stop", 'x = 42', '\u4f60\u597d\u4e16\u754c',
                 'caf\u00e9 cr\u00e8me', 'e = mc^2', '\u{1F600} emoji', 'tab\tseparated', 'new\nline'];
  for (const t of seeds) {
    add(` ${t}`, `${t} `, `  ${t}  `, t.toUpperCase(), `\n${t}\n`, `${t}\n\n\n${t}`, `${t}.${t}`,
        `"${t}"`);
  }

  // Cross products: digits and words around punctuation, and numbers of each length.
  for (let n = 1; n <= 12; ++n) add('1234567890'.repeat(2).slice(0, n) + ' apples');
  for (const p of ['.', ',', '!', '?', ':', ';', "'", '"', '(', ')', '-', '_', '/', '\\']) {
    add(`word${p}word`, `${p}${p}${p} x`);
  }

  // The mixed document: 20,000 characters of the strings above, shuffled with a fixed seed.
  const r = rng(20240229);
  const pool = s.filter((x) => x.length > 0 && x.length < 400);
  const seps = [' ', '\n', '\n\n', ' ', '. ', '\t', ''];
  let doc = [];
  let len = 0;
  while (len < 20000) {
    const piece = pool[Math.floor(r() * pool.length)] + seps[Math.floor(r() * seps.length)];
    const cps = Array.from(piece);
    doc.push(...cps);
    len += cps.length;
  }
  add(doc.slice(0, 20000).join(''));
  return s;
}

// ---------------------------------------------------------------------------------------------
// The expected outputs.

// Hugging Face's transformers replaces the tokenizer.json post-processor of these classes (Llama
// and Gemma, slow names included: AutoTokenizer loads their Fast versions) by one built from
// tokenizer_config.json's add_bos_token (default true) / add_eos_token (default false):
// LlamaTokenizerFast.update_post_processor. The others use tokenizer.json's post-processor as is.
const BOS_EOS_CLASSES = new Set(['LlamaTokenizer', 'LlamaTokenizerFast', 'GemmaTokenizer',
                                 'GemmaTokenizerFast', 'CodeLlamaTokenizer', 'CodeLlamaTokenizerFast']);

function token_content(t) {
  if (t == null) return null;
  return typeof t === 'string' ? t : t.content;
}

function transformers_rule(config, tok) {
  if (!BOS_EOS_CLASSES.has(config.tokenizer_class)) return null;
  const add_bos = config.add_bos_token ?? true;
  const add_eos = config.add_eos_token ?? false;
  const bos = token_content(config.bos_token), eos = token_content(config.eos_token);
  const bos_id = add_bos && bos != null ? tok.tokenToId(bos) : null;
  const eos_id = add_eos && eos != null ? tok.tokenToId(eos) : null;
  if ((add_bos && bos != null && bos_id == null) || (add_eos && eos != null && eos_id == null)) {
    throw new Error(`bos/eos token of tokenizer_config.json not in the vocabulary`);
  }
  return { bos_id, eos_id, add_bos, add_eos };
}

function link(target, at) {
  fs.rmSync(at, { force: true });
  fs.symlinkSync(path.relative(path.dirname(at), target), at);
}

function write_atomic(file, data) {
  const tmp = `${file}.tmp${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

// Strings for the split_special_tokens check: literals of the tokenizer's special tokens in text.
function split_special_texts(tok_json) {
  const special = added_tokens(tok_json).filter((t) => t.special).map((t) => t.content);
  const pick = special.length <= 6 ? special : [...special.slice(0, 5), special[special.length - 1]];
  const out = ['<|im_start|>', '<|im_start|>user\nhi<|im_end|>', '<s>hi</s>', '<|begin_of_text|>hello',
               '<bos><start_of_turn>user', '<|endoftext|>', '<｜begin▁of▁sentence｜>x'];
  for (const t of pick) out.push(t, `a ${t} b`, `${t}${t}`);
  return [...new Set(out)];
}

async function write_expected(name, corpus, tok_json_text, config) {
  const dir = path.join(OUT, name);
  fs.mkdirSync(dir, { recursive: true });
  const pkg_dir = path.join(NPM, 'node_modules', '@lenml', `tokenizer-${name}`);
  const pkg_version = JSON.parse(fs.readFileSync(path.join(pkg_dir, 'package.json'), 'utf8')).version;
  link(path.join(pkg_dir, 'models', 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  link(path.join(pkg_dir, 'models', 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));

  const tok = Tokenizer.fromString(tok_json_text);
  const rule = transformers_rule(config, tok);
  const cases = [];
  let differs = 0;
  for (let i = 0; i < corpus.length; ++i) {
    const text = corpus[i];
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const with_sp = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = plain.getIds();
    const ids_binding = with_sp.getIds();
    let ids_special = ids_binding;
    if (rule) {
      ids_special = [...(rule.add_bos && rule.bos_id != null ? [rule.bos_id] : []), ...ids,
                     ...(rule.add_eos && rule.eos_id != null ? [rule.eos_id] : [])];
    }
    const c = {
      ids,
      tokens: plain.getTokens(),
      ids_special,
      decode: await tok.decode(ids, false),
      decode_special_skip: await tok.decode(ids_special, true),
      decode_special_keep: await tok.decode(ids_special, false),
    };
    c.roundtrip = c.decode === text;
    if (JSON.stringify(ids_binding) !== JSON.stringify(ids_special)) {
      c.ids_special_binding = ids_binding;
      ++differs;
    }
    cases.push(c);
  }

  // split_special_tokens: the Node binding has no switch for it (the Rust crate's
  // AddedVocabulary::encode_special_tokens, which transformers sets for split_special_tokens=True),
  // so the same is had by loading the tokenizer with its special added tokens removed: the crate
  // then skips exactly those matches and the text goes through normalizer, pre-tokenizer and model.
  const stripped = JSON.parse(tok_json_text);
  stripped.added_tokens = stripped.added_tokens.filter((t) => !t.special);
  const tok_split = Tokenizer.fromString(JSON.stringify(stripped));
  const split_special = [];
  for (const text of split_special_texts(JSON.parse(tok_json_text))) {
    const e = await tok_split.encode(text, null, { addSpecialTokens: false });
    split_special.push({ text, ids: e.getIds(), tokens: e.getTokens() });
  }

  const special_source = rule
    ? `transformers: tokenizer_class ${config.tokenizer_class} -> ids_special = ` +
      `${rule.add_bos ? `[bos ${rule.bos_id}] + ` : ''}ids${rule.add_eos ? ` + [eos ${rule.eos_id}]` : ''} ` +
      `(tokenizer_config.json add_bos_token=${config.add_bos_token ?? '(default true)'}, add_eos_token=` +
      `${config.add_eos_token ?? '(default false)'} replace the tokenizer.json post-processor, as ` +
      `LlamaTokenizerFast/GemmaTokenizerFast.update_post_processor does); the Node binding's own ` +
      `encode(addSpecialTokens=true) is in ids_special_binding where it differs (${differs} strings)`
    : `binding: tokenizer.json post-processor (the Node binding's encode(addSpecialTokens=true)); ` +
      `transformers' ${config.tokenizer_class} does the same`;
  const expected = {
    name,
    package: `@lenml/tokenizer-${name}@${pkg_version}`,
    reference: `Hugging Face tokenizers ${TOKENIZERS_VERSION} (Rust, Node binding)`,
    corpus_strings: corpus.length,
    ids_special_source: special_source,
    fields: {
      ids: 'encode(text, add_special_tokens=false)',
      tokens: 'the token strings of ids',
      ids_special: 'encode(text, add_special_tokens=true) as transformers gives it (see ids_special_source)',
      decode: 'decode(ids, skip_special_tokens=false)',
      decode_special_skip: 'decode(ids_special, skip_special_tokens=true)',
      decode_special_keep: 'decode(ids_special, skip_special_tokens=false)',
      roundtrip: 'decode == text',
      split_special: 'encode(text, add_special_tokens=false) with split_special_tokens=true',
    },
    cases,
    split_special,
  };
  write_atomic(path.join(dir, 'expected.json'), JSON.stringify(expected));
  const rt = cases.filter((c) => c.roundtrip).length;
  console.log(`${name}: ${cases.length} strings, ${cases.reduce((a, c) => a + c.ids.length, 0)} ids, ` +
              `${rt} round-trip; ${special_source.split(';')[0]}`);
}

async function main() {
  fs.mkdirSync(OUT, { recursive: true });
  const texts = {}, jsons = {}, configs = {};
  for (const name of NAMES) {
    const models = path.join(NPM, 'node_modules', '@lenml', `tokenizer-${name}`, 'models');
    texts[name] = fs.readFileSync(path.join(models, 'tokenizer.json'), 'utf8');
    jsons[name] = JSON.parse(texts[name]);
    configs[name] = JSON.parse(fs.readFileSync(path.join(models, 'tokenizer_config.json'), 'utf8'));
  }
  const corpus = build_corpus(jsons);
  write_atomic(path.join(OUT, 'corpus.json'),
               JSON.stringify({ version: CORPUS_VERSION, strings: corpus }, null, 1));
  console.log(`corpus: ${corpus.length} strings, ${corpus.reduce((a, x) => a + x.length, 0)} UTF-16 units`);
  for (const name of NAMES) await write_expected(name, corpus, texts[name], configs[name]);
}

main().catch((e) => {
  console.error(`tokenizer_fixtures.mjs: ${e.stack || e}`);
  process.exit(1);
});
