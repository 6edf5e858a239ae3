// Times llama.cpp (through node-llama-cpp's prebuilt CPU build) on a GGUF written by to_gguf.py,
// with the protocol of `colocated-rl bench rollout`'s probes, so the two can be put side by side:
//   prefill: 8 prompts of 512 random tokens (tok/s over all 4096 prompt tokens);
//   decode @B: B sequences with 128-token prompts, then 40 steps of one token each for all B
//              (the median step over the steps where all B decode together);
//   batch-1 decode: the same with one sequence.
// Prints one JSON line. usage: node bench.mjs MODEL.gguf THREADS DECODE_BATCH
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, threadsArg = "2", batchArg = "16"] = process.argv.slice(2);
if (!modelPath) {
  console.error("usage: node bench.mjs MODEL.gguf THREADS DECODE_BATCH");
  process.exit(2);
}
const threads = Number(threadsArg);
const decodeBatch = Number(batchArg);

// A fixed-seed generator (splitmix32) so every run feeds the same tokens.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
}
const median = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const now = () => Number(process.hrtime.bigint()) / 1e9;

const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const vocab = Number(model.fileInfo.metadata.llama.vocab_size);
const next = rng(5);
const randomTokens = (n) => Array.from({length: n}, () => 4 + (next() % (vocab - 4)));

async function decodeProbe(batch, promptLen, steps) {
  const ctx = await model.createContext({
    contextSize: batch * (promptLen + steps + 8), sequences: batch, batchSize: 512, threads,
  });
  const seqs = Array.from({length: batch}, () => ctx.getSequence());
  await Promise.all(seqs.map((s) => s.evaluateWithoutGeneratingNewTokens(randomTokens(promptLen))));
  // One token per sequence per step: the sequences' evaluate() calls of one step are queued in
  // the same tick, and node-llama-cpp decodes them as one llama_decode batch.
  const stepTimes = [];
  let last = seqs.map(() => randomTokens(1));
  for (let i = 0; i < steps; ++i) {
    const t0 = now();
    last = await Promise.all(seqs.map(async (s, j) => {
      for await (const tok of s.evaluate(last[j], {temperature: 0})) return [tok];
    }));
    stepTimes.push(now() - t0);
  }
  await ctx.dispose();
  return median(stepTimes);
}

async function prefillProbe(prompts, promptLen) {
  const ctx = await model.createContext({contextSize: promptLen + 8, sequences: 1, batchSize: 512, threads});
  const seq = ctx.getSequence();
  await seq.evaluateWithoutGeneratingNewTokens(randomTokens(64));  // warmup
  await seq.clearHistory();
  let total = 0;
  for (let i = 0; i < prompts; ++i) {
    const toks = randomTokens(promptLen);
    const t0 = now();
    await seq.evaluateWithoutGeneratingNewTokens(toks);
    total += now() - t0;
    await seq.clearHistory();
  }
  await ctx.dispose();
  return (prompts * promptLen) / total;
}

await decodeProbe(1, 16, 4);  // warmup
const stepB = await decodeProbe(decodeBatch, 128, 40);
const step1 = await decodeProbe(1, 128, 40);
const prefill = await prefillProbe(8, 512);
console.log(JSON.stringify({
  engine: "llama.cpp (node-llama-cpp prebuilt CPU build)", threads, decode_batch: decodeBatch,
  decode_step_s: stepB, decode_tok_s: decodeBatch / stepB, batch1_step_s: step1, batch1_tok_s: 1 / step1,
  prefill_tok_s: prefill,
}));
