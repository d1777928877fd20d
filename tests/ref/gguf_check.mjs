// Checks a GGUF file longhaul exported with two independent readers:
//  - @huggingface/gguf parses it; its metadata and tensor infos must match what the source
//    model directory's config.json (and tokenizer) imply, computed here from the Hugging Face
//    fields, not from longhaul's writer;
//  - llama.cpp (node-llama-cpp's prebuilt CPU build) loads it and generates. With --greedy, its
//    greedy continuations of the prompts must equal `longhaul generate --temperature 0`; where
//    they first differ, the two tokens must be a top-2 tie (their log-probs under longhaul's
//    `score` differ by less than 1e-4). With --corpus, llama.cpp's tokenization of every text
//    (special tokens recognised) must equal `longhaul tokenize --jsonl`.
// Usage: node gguf_check.mjs LONGHAUL_BIN JOBS.jsonl, one job per line (one process loads
// llama.cpp once for all):
//   {"model": DIR, "gguf": FILE, "type": "f32|f16|bf16|q8_0", "pre": NAME,
//    "greedy": PROMPTS.jsonl (token-id arrays), "max_new": N, "corpus": TEXTS.jsonl (strings)}
// Exits 0 when every check passes, else prints each failure and exits 1.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(path.join(path.dirname(new URL(import.meta.url).pathname),
  "gguf", "package.json"));
const { gguf } = require("@huggingface/gguf");
const { getLlama, LlamaLogLevel } = await import(require.resolve("node-llama-cpp"));

const [bin, jobsFile] = process.argv.slice(2);
if (!bin || !jobsFile) { console.error("usage: node gguf_check.mjs LONGHAUL_BIN JOBS.jsonl"); process.exit(2); }
const jobs = fs.readFileSync(jobsFile, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true, logLevel: LlamaLogLevel.error, progressLogs: false });
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-check-"));
const lh = (...a) => execFileSync(bin, a, { encoding: "utf8", maxBuffer: 1 << 28 });

const failures = [];
let current = "";
const fail = (msg) => { failures.push(msg); console.error(`FAIL ${current}: ${msg}`); };
const eq = (what, got, want) => {
  const g = typeof got === "bigint" ? Number(got) : got;
  if (JSON.stringify(g) !== JSON.stringify(want)) fail(`${what}: got ${JSON.stringify(g)}, expected ${JSON.stringify(want)}`);
};
const near = (what, got, want, rel) => {
  if (!(Math.abs(Number(got) - want) <= rel * Math.abs(want))) fail(`${what}: got ${got}, expected ${want}`);
};

async function check(args) {
  // ---------------------------------------------------------------- what config.json implies
  const cfg = JSON.parse(fs.readFileSync(path.join(args.model, "config.json"), "utf8"));
  const tokJson = JSON.parse(fs.readFileSync(path.join(args.model, "tokenizer.json"), "utf8"));
  const arch = cfg.model_type;
  const C = cfg.hidden_size, L = cfg.num_hidden_layers, H = cfg.num_attention_heads;
  const KV = cfg.num_key_value_heads ?? H, hd = cfg.head_dim ?? C / H, F = cfg.intermediate_size;
  const V = cfg.vocab_size;
  const tied = cfg.tie_word_embeddings ?? false;
  const attnBias = arch === "qwen2" ? "qkv" : cfg.attention_bias ? "qkvo" : "";
  const ropeType = cfg.rope_scaling?.rope_type ?? cfg.rope_scaling?.type ?? cfg.rope_parameters?.rope_type;
  const GT = { f32: 0, f16: 1, q8_0: 8, bf16: 30 }, FT = { f32: 0, f16: 1, q8_0: 7, bf16: 32 };
  const type2d = (ne0) => (args.type === "q8_0" && ne0 % 32 ? GT.f16 : GT[args.type]);

  const want = []; // [name, ne, type]
  const mat = (name, rows, cols) => want.push([name, [cols, rows], type2d(cols)]);
  const vec = (name, n) => want.push([name, [n], GT.f32]);
  mat("token_embd.weight", V, C);
  for (let l = 0; l < L; l++) {
    const b = `blk.${l}.`;
    vec(b + "attn_norm.weight", C);
    mat(b + "attn_q.weight", H * hd, C);
    mat(b + "attn_k.weight", KV * hd, C);
    mat(b + "attn_v.weight", KV * hd, C);
    if (attnBias.includes("q")) { vec(b + "attn_q.bias", H * hd); vec(b + "attn_k.bias", KV * hd); vec(b + "attn_v.bias", KV * hd); }
    if (arch === "qwen3") { vec(b + "attn_q_norm.weight", hd); vec(b + "attn_k_norm.weight", hd); }
    mat(b + "attn_output.weight", C, H * hd);
    if (attnBias.includes("o")) vec(b + "attn_output.bias", C);
    vec(b + "ffn_norm.weight", C);
    mat(b + "ffn_gate.weight", F, C);
    mat(b + "ffn_up.weight", F, C);
    mat(b + "ffn_down.weight", C, F);
  }
  vec("output_norm.weight", C);
  if (!tied) mat("output.weight", V, C);
  if (ropeType === "llama3") vec("rope_freqs.weight", hd / 2);

  // ---------------------------------------------------------------- @huggingface/gguf
  const parsed = await gguf(path.resolve(args.gguf), { allowLocalFile: true });
  const md = parsed.metadata;
  eq("version", md.version, 3);
  eq("general.architecture", md["general.architecture"], arch);
  eq("general.file_type", md["general.file_type"], FT[args.type]);
  eq("general.alignment", md["general.alignment"], 32);
  eq(`${arch}.block_count`, md[`${arch}.block_count`], L);
  eq(`${arch}.embedding_length`, md[`${arch}.embedding_length`], C);
  eq(`${arch}.feed_forward_length`, md[`${arch}.feed_forward_length`], F);
  eq(`${arch}.attention.head_count`, md[`${arch}.attention.head_count`], H);
  eq(`${arch}.attention.head_count_kv`, md[`${arch}.attention.head_count_kv`], KV);
  eq(`${arch}.attention.key_length`, md[`${arch}.attention.key_length`], hd);
  eq(`${arch}.context_length`, md[`${arch}.context_length`], cfg.max_position_embeddings);
  near(`${arch}.rope.freq_base`, md[`${arch}.rope.freq_base`], cfg.rope_theta ?? cfg.rope_parameters?.rope_theta ?? 10000, 1e-6);
  near(`${arch}.attention.layer_norm_rms_epsilon`, md[`${arch}.attention.layer_norm_rms_epsilon`], cfg.rms_norm_eps ?? 1e-6, 1e-6);
  eq("tokenizer.ggml.model", md["tokenizer.ggml.model"], "gpt2");
  eq("tokenizer.ggml.pre", md["tokenizer.ggml.pre"], args.pre);
  eq("tokenizer.ggml.tokens length", md["tokenizer.ggml.tokens"]?.length, V);
  eq("tokenizer.ggml.token_type length", md["tokenizer.ggml.token_type"]?.length, V);
  const merges = tokJson.model.merges ?? [];
  eq("tokenizer.ggml.merges length", md["tokenizer.ggml.merges"]?.length, new Set(merges.map((m) => (Array.isArray(m) ? m.join(" ") : m))).size);
  if (cfg.bos_token_id != null) eq("tokenizer.ggml.bos_token_id", md["tokenizer.ggml.bos_token_id"], cfg.bos_token_id);
  const eos0 = Array.isArray(cfg.eos_token_id) ? cfg.eos_token_id[0] : cfg.eos_token_id;
  if (eos0 != null) eq("tokenizer.ggml.eos_token_id", md["tokenizer.ggml.eos_token_id"], eos0);
  // every vocabulary entry and added token at its id, with its type
  const toks = md["tokenizer.ggml.tokens"] ?? [], types = md["tokenizer.ggml.token_type"] ?? [];
  for (const t of tokJson.added_tokens ?? []) {
    eq(`token ${t.id}`, toks[t.id], t.content);
    eq(`token_type ${t.id}`, types[t.id], t.special ? 3 : 4);
  }
  eq("tensor_count", parsed.tensorInfos.length, want.length);
  const infos = new Map(parsed.tensorInfos.map((t) => [t.name, t]));
  for (const [name, ne, type] of want) {
    const t = infos.get(name);
    if (!t) { fail(`tensor ${name} missing`); continue; }
    eq(`tensor ${name} shape`, t.shape.map(Number), ne);
    eq(`tensor ${name} type`, t.dtype, type);
  }
  console.log(`@huggingface/gguf: ${args.gguf}: ${parsed.tensorInfos.length} tensors, ${Object.keys(md).length} keys checked against config.json`);

  // ---------------------------------------------------------------- llama.cpp
  const model = await llama.loadModel({ modelPath: path.resolve(args.gguf), gpuLayers: 0 });

  if (args.corpus) {
    let texts = fs.readFileSync(args.corpus, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
    // llama.cpp applies no normalizer: a tokenizer.json with NFC (Qwen's) gives the same ids only
    // on text that is NFC already (JavaScript's own normalize() decides which)
    if (JSON.stringify(tokJson.normalizer ?? null).includes('"NFC"')) {
      const before = texts.length;
      texts = texts.filter((t) => t === t.normalize("NFC"));
      console.log(`tokenize: ${before - texts.length} of ${before} texts are not NFC; llama.cpp does not normalize, so they are left out`);
      if (before - texts.length > before / 4) fail("tokenize: most of the corpus is not NFC");
      const f = path.join(tmp, "nfc.jsonl");
      fs.writeFileSync(f, texts.map((t) => JSON.stringify(t)).join("\n") + "\n");
      args.corpus = f;
    }
    const ours = lh("tokenize", "--tokenizer", args.model, "--file", args.corpus, "--jsonl").trim().split("\n").map((l) => JSON.parse(l));
    let bad = 0;
    texts.forEach((text, i) => {
      const theirs = Array.from(model.tokenize(text, true));
      if (JSON.stringify(theirs) !== JSON.stringify(ours[i])) {
        if (bad++ < 5) fail(`tokenize ${JSON.stringify(text).slice(0, 80)}: llama.cpp ${JSON.stringify(theirs).slice(0, 120)}, longhaul ${JSON.stringify(ours[i]).slice(0, 120)}`);
      }
    });
    if (bad > 5) fail(`tokenize: ${bad} of ${texts.length} texts differ in all`);
    console.log(`llama.cpp tokenize: ${texts.length - bad} of ${texts.length} texts equal longhaul's`);
  }

  const maxNew = Number(args.max_new ?? 24);
  const context = await model.createContext({ contextSize: Math.min(cfg.max_position_embeddings, 256), batchSize: 256, threads: 2 });
  if (args.greedy) {
    const prompts = fs.readFileSync(args.greedy, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
    let agree = 0, total = 0, ties = 0;
    for (const prompt of prompts) {
      const gen = JSON.parse(lh("generate", "--model", args.model, "--prompt-tokens", prompt.join(","), "--temperature", "0", "--max-new", String(maxNew), "--json", "--threads", "2"));
      const seq = context.getSequence();
      const theirs = [];
      let stopped = true; // node-llama-cpp ends the generator at an end-of-generation token
      for await (const t of seq.evaluate(prompt, { temperature: 0 })) {
        theirs.push(t);
        if (theirs.length >= gen.tokens.length) { stopped = false; break; }
      }
      seq.dispose();
      // longhaul's last token is the eos it stopped at; llama.cpp stopped there without yielding it
      if (stopped && gen.finish === "eos" && theirs.length === gen.tokens.length - 1) theirs.push(gen.tokens.at(-1));
      total += gen.tokens.length;
      let i = 0;
      while (i < gen.tokens.length && theirs[i] === gen.tokens[i]) i++;
      agree += i;
      if (i === gen.tokens.length) continue;
      if (args.type !== "f32") continue; // quantised: it must load and generate, not agree
      // first difference: a top-2 tie under longhaul's forward, or a failure
      const prefix = prompt.concat(gen.tokens.slice(0, i));
      const f = path.join(tmp, "score.jsonl");
      fs.writeFileSync(f, JSON.stringify(prefix.concat([gen.tokens[i]])) + "\n" + JSON.stringify(prefix.concat([theirs[i]])) + "\n");
      const [a, b] = lh("score", "--model", args.model, "--input", f).trim().split("\n").map((l) => JSON.parse(l).logprobs.at(-1));
      if (Math.abs(a - b) < 1e-4) { ties++; continue; }
      fail(`greedy [${prompt}]: step ${i}: llama.cpp ${theirs[i]}, longhaul ${gen.tokens[i]} (log-probs ${b} vs ${a}: not a tie)`);
    }
    if (args.type !== "f32" && total > 0 && agree === 0) fail(`greedy: llama.cpp agrees with longhaul on no token of ${prompts.length} prompts`);
    console.log(`llama.cpp greedy (${args.type}): ${agree} of ${total} tokens equal longhaul's, ${ties} top-2 ties`);
  } else {
    // it loads; it must also generate
    const seq = context.getSequence();
    const out = [];
    for await (const t of seq.evaluate([0], { temperature: 0 })) { out.push(t); if (out.length >= 4) break; }
    eq("llama.cpp generated tokens", out.length, 4);
    console.log(`llama.cpp (${args.type}): loaded and generated ${out.length} tokens`);
  }
  await context.dispose();
  await model.dispose();
}

for (const job of jobs) {
  current = job.gguf;
  try {
    await check({ ...job });
  } catch (err) {
    fail(`${err.message}`);
  }
}
await llama.dispose();
fs.rmSync(tmp, { recursive: true, force: true });
if (failures.length) { console.error(`gguf_check: ${failures.length} failure(s) in ${jobs.length} files`); process.exit(1); }
console.log(`gguf_check: ${jobs.length} files: ok`);
