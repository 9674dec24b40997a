// tokenize_corpus.mjs - writes the tokenizer test corpus and what the
// reference (npm @huggingface/tokenizers, version pinned in package.json)
// gives for it, for tests/test_tok_corpus.c.
//
//   cd tests/ref/tok && npm ci && node tokenize_corpus.mjs [SHARED_DIR]
//
// Outputs (committed):
//   tests/data/tok/variants.json     other pipelines (see "variants" below)
//   tests/data/tok/variants.expected the same records for them ("V name", then
//                                    "K <corpus index>" before each record)
//   tests/data/tok/corpus.bin        the strings, as bytes (some are not valid UTF-8)
//   tests/data/tok/<name>.expected   per tokenizer: ids with / without special
//                                    tokens, decoded texts, random-id decodes
// Formats (all records in order, one per corpus string, then the R records):
//   corpus.bin:  "<n>\n" <n bytes> "\n"
//   .expected:   "N <ids>\n"            encode(text, add_special_tokens=false)
//                "I <ids>\n"            encode(text) (the post-processor's specials),
//                                       or "I @ <ids> | <ids>": the ids before
//                                       and after those of N
//                "D <n>\n" <bytes> "\n" decode(ids of I)
//                "S <n>\n" <bytes> "\n" decode(ids of I, skip_special_tokens)
//                                       ("S =" when the same as D)
//                then for random id lists: "R <ids>\n" "D <n>\n" <bytes> "\n"
// Text reaches the reference through TextDecoder (WHATWG: each invalid UTF-8
// sequence becomes U+FFFD; a BOM is kept), which is exactly what Ember does
// with invalid input.
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../../..");
const shared = process.argv[2] ?? path.resolve(repo, "../shared");
const hf = path.join(shared, "testdata/tokenizers/hf");
const outDir = path.join(repo, "tests/data/tok");

// ---- deterministic PRNG (mulberry32) ----
let seed = 0x5eed1234;
function rnd() {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];

const td = new TextDecoder("utf-8", { ignoreBOM: true });

// ---- the corpus ----
const enc = new TextEncoder();
const corpus = []; // Uint8Array
const add = (s) => corpus.push(typeof s === "string" ? enc.encode(s) : Uint8Array.from(s));
const cat = (...parts) => {
  const arrs = parts.map((p) => (typeof p === "string" ? enc.encode(p) : Uint8Array.from(p)));
  const out = new Uint8Array(arrs.reduce((n, a) => n + a.length, 0));
  let k = 0;
  for (const a of arrs) {
    out.set(a, k);
    k += a.length;
  }
  return out;
};

const english = [
  "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
  "I'm sure you'll see it's what we've been told they'd say.", "DON'T SHOUT, IT'S RUDE; WE'LL SEE.",
  "She said: \"no\" -- and left.", "It costs $3.50 (or 3,50 EUR) per item.", "e.g. i.e. etc. Mr. Smith vs. Dr. Who",
  "hello", "HELLO", "Hello", " hello", "  hello", "hello ", "hello  ", "a", "I", "ab", "a b c d e f g",
  "supercalifragilisticexpialidocious", "antidisestablishmentarianism", "pneumonoultramicroscopicsilicovolcanoconiosis",
  "The year 2024 was followed by 2025.", "Call 555-0199 or +1 (800) 123-4567.", "Version 1.2.3-beta+build.45",
  "Don't", "don't", "DON'T", "y'all", "rock'n'roll", "O'Reilly", "the dog's bone", "'quoted'", "''", "'", "'s", "'S",
  "can't won't shan't isn't aren't wasn't", "you're we're they're", "I've you've", "I'd he'd", "I'll she'll", "I'm",
];
const numbers = [
  "0", "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890", "3.14159", "2.718281828",
  "1,000,000", "-42", "+7", "1e10", "6.022e23", "0x1F", "0b1010", "007", "1/2", "3:45", "10%", "99.9%",
  "½ ¼ ¾", "² ³ ¹", "①②③", "Ⅻ ⅻ", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "一二三", "１２３", "𝟘𝟙𝟚", "3333333", "33333333",
];
const code = [
  "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
  "const x = () => { return [1, 2, 3].map(v => v ** 2); };", "{\"key\": \"value\", \"n\": [1, 2.5, null, true]}",
  "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>", "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
  "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }", "if x == 1 and not y:\n\tpass\nelse:\n\tprint('no')",
  "fn main() { let v: Vec<u8> = vec![0; 16]; }", "$ ls -la | grep '^d' > out.txt 2>&1", "a+=b; c-=d; e*=f; g/=h; i%=j;",
  "x->y; a::b; c<<=2; d>>=3; e&&f||g", "// comment\n/* block\n   comment */", "   indented\n        more\n\t\ttabs",
  "@decorator\nclass A(B, metaclass=M):\n    __slots__ = ()", "https://example.com/path?q=1&r=two#frag",
  "user@example.org", "C:\\Users\\name\\file.txt", "~/dir/file.tar.gz", "a_b_c __init__ CamelCaseName snake_case_name",
];
const whitespace = [
  " ", "  ", "   ", "    ", "     ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", " \n", "\n ", " \t\n ",
  "a\nb", "a\n\nb", "a \nb", "a\n b", "a\t\tb", "a  b", "a   b", "a    b", "word   \n\n   word", "\n\n\n\nX",
  "line1\r\nline2\r\n", "trailing   ", "   leading", "  both  ", "\u00a0nbsp\u00a0", "em\u2003space", "ideo\u3000space",
  "zw\u200bsp", "bom\ufeffchar", "\ufeffstart", "nel\u0085next", "mvs\u180esep", "ls\u2028ps\u2029", "thin\u2009space",
  "\u000b\u000c", "tab\tthen  spaces   ", " \u00a0 \u2000 \u3000 ",
];
const scripts = [
  "Café naïve résumé façade coöperate", "Cafe\u0301 nai\u0308ve", "ñandú pingüino", "Ångström Øre Æsir ß straße",
  "Ελληνικά: Γειά σου Κόσμε", "ΑΣ ΟΔΟΣ σοφός", "Русский текст: Привет, мир!", "Українська мова ї є ґ", "Ծանր հայերեն",
  "עברית: שלום עולם", "العربية: مرحبا بالعالم", "فارسی: سلام دنیا", "हिन्दी: नमस्ते दुनिया", "বাংলা: হ্যালো বিশ্ব",
  "தமிழ்: வணக்கம் உலகம்", "తెలుగు: హలో", "ગુજરાતી", "ਪੰਜਾਬੀ", "ಕನ್ನಡ", "മലയാളം", "සිංහල", "ไทย: สวัสดีชาวโลก",
  "ລາວ: ສະບາຍດີ", "ខ្មែរ: សួស្តីពិភពលោក", "မြန်မာ: မင်္ဂလာပါ", "ქართული: გამარჯობა", "한국어: 안녕하세요 세계",
  "\u1100\u1161\u11a8 jamo", "日本語: こんにちは世界、カタカナ", "中文：你好，世界！", "繁體中文：臺灣", "ኢትዮጵያ: ሰላም",
  "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "ᠮᠣᠩᠭᠣᠯ", "བོད་ཡིག", "Tiếng Việt: Xin chào thế giới", "Türkçe: İstanbul ıiİI",
  "Polski: zażółć gęślą jaźń", "Čeština: Příliš žluťoučký kůň", "Deutsch: Größenordnung Übermaß",
  "Ελληνικά ΑΒΓΔ αβγδ", "ﬁ ﬂ ﬀ ligatures", "Ｆｕｌｌｗｉｄｔｈ　ＡＢＣ", "ｶﾀｶﾅ half", "㍿ ㈱ ℃ ℉ № ™ Ⓐ",
  "𝐀𝐁𝐂 𝑎𝑏𝑐 𝔸𝔹", "Zalgo: Z̵̛a̷l̸g̶o̴", "ȃ̦̥ combining stacks", "\u0041\u030a vs \u00c5", "\u1e9b\u0323",
  "\uac00\u11a8", "\u1112\u1161\u11ab", "e\u0301\u0301", "\u0958 nukta", "\u212b angstrom sign", "\u2126 ohm",
];
const emoji = [
  "😀", "😀😃😄", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵🇫🇷", "1️⃣ #️⃣", "❤️", "♥", "☺️", "🤖 robot", "emoji🙂inside",
  "🧑🏿‍🤝‍🧑🏻", "🫠", "⌚⌛", "✈︎ ✈️", "🔥🔥🔥🔥", "🐈‍⬛", "👁️‍🗨️", "©®", "→ ← ↑ ↓ ⇒ ⇔", "∀x∈ℝ: x²≥0 ∑ ∫ √ ∞ ≠ ≤",
  "€ £ ¥ ₹ ₿ ¢", "┌─┬─┐│ │└─┴─┘", "░▒▓█", "♠♣♥♦", "★☆", "✓✗", "…‹›«»“”‘’„", "–—―",
];
const specialText = [
  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
  "a<|endoftext|>b", "<|im_start|><|im_end|>", "<|im_start|> spaced <|im_end|>", "<|im_start", "im_end|>",
  "<|begin_of_text|>Hi", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
  "<|eot_id|>", "<|reserved_special_token_0|>", "<|start_header_id|>", "<s>", "</s>", "<unk>", "<s>hello</s>",
  " <s> x </s> ", "<s><s></s>", "[INST] hi [/INST]", "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{}</tool_call>",
  "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>", "<<|im_start|>>",
  "<|im_start|><|im_start|>", "text<|im_end|>text", "<|im_end|>\n", "\n<|im_end|>", "<|", "|>", "<>", "</", "<0x41>",
  "<0x0A>", "▁hello ▁world", "▁", "▁▁", "Ġhello", "Ċ", "##ing",
];
// invalid UTF-8 (bytes)
const invalid = [
  [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xc2], [0xe2, 0x82], [0xe2, 0x82, 0x41], [0xf0, 0x9f, 0x98],
  [0xf0, 0x9f, 0x98, 0x41], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80], [0xf5, 0x80], [0xfe],
  [0xff], [0xe0, 0x80, 0x80], [0xf0, 0x80, 0x80, 0x80], [0x41, 0x80, 0x42], [0x68, 0x69, 0xc3], [0xc3, 0x28],
  [0xa0, 0xa1], [0xe2, 0x28, 0xa1], [0xf0, 0x28, 0x8c, 0xbc], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xef, 0xbb, 0xbf, 0x41],
  [0x00], [0x00, 0x00, 0x41], [0x01, 0x02, 0x1b, 0x7f], [0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80], [0xc3, 0xa9, 0xff, 0xc3, 0xa9],
];

for (const s of [...english, ...numbers, ...code, ...whitespace, ...scripts, ...emoji, ...specialText]) add(s);
for (const b of invalid) add(b);
add("");

// character pools for random strings (assigned before Unicode 13)
const pools = [
  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  \t\n\r",
  ".,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`", "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÉÎÕÜ", "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΣΩ",
  "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГДЯ", "אבגדהוזחטיכלמנסעפצקרשת", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
  "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह्ािीुूेैोौं", "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอฮะาำิีึืุู่้๊๋",
  "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキク",
  "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生", "가나다라마바사아자차카타파하한국어",
  "😀😃😄😁😆😅😂🤣😊😇🙂🙃😉😌😍🥰😘👍👎👏🙏💪🎉🔥✨⭐❤💔", "\u0300\u0301\u0302\u0303\u0308\u0327",
  "\u00a0\u2000\u2003\u3000\u200b\u200d\ufeff\u0085\u2028", "ﬁﬂ①②ⅫⅣ½²³", "─│┌┐└┘├┤▲▼◆●○■□",
];
const poolChars = pools.map((p) => Array.from(p));
function randText(maxLen) {
  const n = 1 + ri(maxLen);
  let s = "";
  let pool = pick(poolChars);
  for (let i = 0; i < n; i++) {
    if (rnd() < 0.15) pool = pick(poolChars);
    s += pick(pool);
  }
  return s;
}
const words = [...english, ...numbers, ...scripts, ...emoji].flatMap((s) => s.split(/\s+/)).filter((w) => w);
const seps = [" ", " ", " ", "  ", "\n", "\t", ", ", ". ", "\n\n", "", "'", "-", " \n "];
function randWords() {
  const n = 1 + ri(25);
  let s = "";
  for (let i = 0; i < n; i++) s += (i ? pick(seps) : "") + pick(words);
  return s;
}
const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>", "<unk>",
  "<think>", "</think>", "<|start_header_id|>", "<|end_header_id|>", "<tool_call>"];

while (corpus.length < 1400) add(randText(60));
while (corpus.length < 2000) add(randWords());
while (corpus.length < 2300) {
  // special tokens mixed into text
  let s = "";
  for (let i = 0, n = 1 + ri(6); i < n; i++) s += rnd() < 0.4 ? pick(specials) : (rnd() < 0.5 ? pick(seps) : "") + randWords();
  add(s);
}
while (corpus.length < 2500) {
  // random bytes, often invalid
  const parts = [];
  for (let i = 0, n = 1 + ri(8); i < n; i++) {
    if (rnd() < 0.5) parts.push(randText(12));
    else parts.push(Array.from({ length: 1 + ri(4) }, () => (rnd() < 0.7 ? 0x80 + ri(0x80) : ri(0x100))));
  }
  add(cat(...parts));
}
// a few long texts
for (let i = 0; i < 6; i++) {
  let s = "";
  while (s.length < 3000) s += randWords() + pick(["\n", " ", "\n\n", ". "]) + (rnd() < 0.3 ? pick(code) : "");
  add(s);
}
add(" ".repeat(300));
add("\n".repeat(100));
add("a".repeat(500));
add("1".repeat(200));
add("😀".repeat(100));
add("🇺🇸".repeat(30));


// ---- pipeline variants: the real vocabularies with other normalizers,
// pre-tokenizers, decoders and added tokens, plus two small synthetic
// tokenizers (WordPiece, Unigram). Checked on every 8th corpus string.
const sp = (s) => ({ String: s });
const re = (r) => ({ Regex: r });
const added = (id, content, o = {}) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: false, ...o });
const variants = [
  { name: "qwen3-nfkc-lower-ws-digits-punct", base: "qwen3", patch: {
    normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Lowercase" }, { type: "Strip", strip_left: true, strip_right: true }] },
    pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "WhitespaceSplit" }, { type: "Digits", individual_digits: true },
      { type: "Punctuation", behavior: "Contiguous" }, { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false }] } } },
  { name: "qwen3-bytelevel-prefix-added", base: "qwen3", config: { clean_up_tokenization_spaces: true }, patch: {
    normalizer: { type: "NFKC" },
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true } },
    add: [added(151669, "<mask>", { lstrip: true, special: true }), added(151670, "[SEP]", { rstrip: true, special: true }),
      added(151671, "hello world", { normalized: true }), added(151672, " xyz ", { lstrip: true, rstrip: true }),
      added(151673, "ﬁ", { normalized: true })] },
  { name: "qwen3-split-behaviours", base: "qwen3", patch: {
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: re("\\p{N}+"), behavior: "Removed", invert: false },
      { type: "Split", pattern: re("[aeiou]"), behavior: "Isolated", invert: false },
      { type: "Split", pattern: re("\\S+"), behavior: "Removed", invert: true },
      { type: "Split", pattern: re("(?i:the)|\\b"), behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false }] } } },
  { name: "qwen3-replace-dollar-nodecoder", base: "qwen3", patch: {
    normalizer: { type: "Sequence", normalizers: [{ type: "Replace", pattern: re("(\\d)(\\d)"), content: "$2$1" },
      { type: "Replace", pattern: sp("o"), content: "$&0" }, { type: "Prepend", prepend: "»" }] },
    decoder: null, post_processor: null } },
  { name: "llama3-template-strip", base: "llama3", patch: {
    post_processor: { type: "TemplateProcessing", single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
      { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "<|eot_id|>", type_id: 0 } }], pair: [],
      special_tokens: {} },
    decoder: { type: "Sequence", decoders: [{ type: "ByteLevel" }, { type: "Strip", content: " ", start: 1, stop: 1 }] } } },
  { name: "mistral-metaspace-first", base: "mistral-7b-v0.1", patch: {
    normalizer: null,
    pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
    decoder: { type: "Sequence", decoders: [{ type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
      { type: "ByteFallback" }, { type: "Fuse" }] } },
    add: [added(32000, "[INST]", { lstrip: true, rstrip: true }), added(32001, "[/INST]", { special: true, rstrip: true })] },
  { name: "mistral-nfd-stripaccents", base: "mistral-7b-v0.1", patch: {
    normalizer: { type: "Sequence", normalizers: [{ type: "NFD" }, { type: "StripAccents" },
      { type: "Replace", pattern: re("\\s+"), content: " " }, { type: "Prepend", prepend: "▁" },
      { type: "Replace", pattern: sp(" "), content: "▁" }] },
    decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: sp("▁"), content: " " }, { type: "ByteFallback" },
      { type: "Fuse" }, { type: "Strip", content: " ", start: 2, stop: 3 }] } } },
  { name: "mistral-unk-fused", base: "mistral-7b-v0.1", model: { byte_fallback: false } },
];
{
  // synthetic WordPiece (BERT style)
  const freq = new Map();
  for (const b of corpus.slice(0, 2000)) for (const w of td.decode(b).toLowerCase().split(/[^a-z]+/)) if (w) freq.set(w, (freq.get(w) ?? 0) + 1);
  const words = [...freq.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, 600).map((e) => e[0]);
  const vocab = {};
  let id = 0;
  for (const t of ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) vocab[t] = id++;
  const chars = Array.from("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`éàüöñç中文日本").filter((c, i, a) => a.indexOf(c) === i);
  for (const c of chars) vocab[c] = id++;
  for (const c of chars) vocab["##" + c] = id++;
  for (const w of words) if (!(w in vocab)) vocab[w] = id++;
  for (const s of ["ing", "ed", "s", "ly", "tion", "er", "est", "ness"]) if (!(("##" + s) in vocab)) vocab["##" + s] = id++;
  variants.push({ name: "wordpiece-synthetic", config: { clean_up_tokenization_spaces: true }, tokenizer: {
    version: "1.0", truncation: null, padding: null,
    added_tokens: ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].map((c, i) => added(i, c, { special: true })),
    normalizer: { type: "BertNormalizer", clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: { type: "BertProcessing", sep: ["[SEP]", 3], cls: ["[CLS]", 2] },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##", max_input_chars_per_word: 20, vocab } } });
  // synthetic Unigram (SentencePiece style)
  const pieces = [["<unk>", 0], ["<s>", 0], ["</s>", 0], ["▁", -2.5]];
  const seen = new Set(pieces.map((p) => p[0]));
  const push = (p, sc) => { if (!seen.has(p)) { seen.add(p); pieces.push([p, sc]); } };
  for (const c of Array.from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-éü中")) push(c, -8 - (c.charCodeAt(0) % 7) / 3);
  words.forEach((w, k) => {
    push("▁" + w, -3 - Math.log(1 + k) / 2);
    if (w.length > 3) { push(w.slice(0, 3), -6 - (k % 5) / 4); push(w.slice(-3), -6.5 - (k % 3) / 4); }
  });
  variants.push({ name: "unigram-synthetic", config: {}, tokenizer: {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [added(0, "<unk>", { special: true }), added(1, "<s>", { special: true }), added(2, "</s>", { special: true })],
    normalizer: { type: "NFKC" },
    pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: false },
    post_processor: { type: "TemplateProcessing", single: [{ Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
      pair: [], special_tokens: {} },
    decoder: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: false },
    model: { type: "Unigram", unk_id: 0, vocab: pieces } } });
}
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "variants.json"), JSON.stringify(variants, null, 0));

// ---- run the reference ----
const names = ["qwen3", "llama3", "mistral-7b-v0.1"];
fs.mkdirSync(outDir, { recursive: true });
{
  const parts = [];
  for (const b of corpus) parts.push(Buffer.from(`${b.length}\n`), Buffer.from(b), Buffer.from("\n"));
  fs.writeFileSync(path.join(outDir, "corpus.bin"), Buffer.concat(parts));
}
const rec = (tag, s) => {
  const b = Buffer.from(s, "utf8");
  return [Buffer.from(`${tag} ${b.length}\n`), b, Buffer.from("\n")];
};
// N / I / D / S records of one text
function record(tok, text) {
  const n = tok.encode(text, { add_special_tokens: false }).ids;
  const i = tok.encode(text).ids;
  // I as "prefix | suffix" around N when N sits inside it (BOS / EOS)
  let iline = i.join(" ");
  for (let k = 0; k + n.length <= i.length; k++) {
    if (n.every((v, j) => v === i[k + j])) {
      iline = `@ ${i.slice(0, k).join(" ")} | ${i.slice(k + n.length).join(" ")}`.replace(/ +/g, " ").trimEnd();
      break;
    }
  }
  const out = [Buffer.from(`N ${n.join(" ")}\nI ${iline}\n`)];
  const d = i.length ? tok.decode(i) : "";
  const sk = i.length ? tok.decode(i, { skip_special_tokens: true }) : "";
  out.push(...rec("D", d));
  if (sk === d) out.push(Buffer.from("S =\n"));
  else out.push(...rec("S", sk));
  return out;
}
for (const name of names) {
  const dir = path.join(hf, name);
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tj, tc);
  const parts = [];
  for (const b of corpus) {
    const text = td.decode(b);
    parts.push(...record(tok, text));
  }
  // random id sequences: decode only
  const vocabSize = tok.model.vocab.length;
  seed = 0xdec0de + name.length;
  for (let k = 0; k < 400; k++) {
    const ids = Array.from({ length: 1 + ri(24) }, () => ri(vocabSize));
    parts.push(Buffer.from(`R ${ids.join(" ")}\n`));
    parts.push(...rec("D", tok.decode(ids)));
  }
  fs.writeFileSync(path.join(outDir, `${name}.expected`), Buffer.concat(parts));
  console.log(`${name}: ${corpus.length} strings, vocab ${vocabSize}`);
}

// ---- the variants ----
{
  const parts = [];
  const loadBase = (name) => {
    const dir = path.join(hf, name);
    return [JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
      JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"))];
  };
  for (const v of variants) {
    let tj, tc;
    if (v.tokenizer) {
      tj = JSON.parse(JSON.stringify(v.tokenizer));
      tc = { ...(v.config ?? {}) };
    } else {
      [tj, tc] = loadBase(v.base);
      Object.assign(tj, v.patch ?? {});
      Object.assign(tj.model, v.model ?? {});
      tj.added_tokens = [...tj.added_tokens, ...(v.add ?? [])];
      Object.assign(tc, v.config ?? {});
    }
    const tok = new Tokenizer(tj, tc);
    parts.push(Buffer.from(`V ${v.name}\n`));
    for (let k = 0; k < corpus.length; k += 8) {
      const text = td.decode(corpus[k]);
      parts.push(Buffer.from(`K ${k}\n`), ...record(tok, text));
    }
    const vocabSize = tok.model.vocab.length;
    seed = 0xabcdef + v.name.length;
    for (let k = 0; k < 60; k++) {
      const ids = Array.from({ length: 1 + ri(16) }, () => ri(vocabSize));
      parts.push(Buffer.from(`R ${ids.join(" ")}\n`));
      parts.push(...rec("D", tok.decode(ids)));
    }
    console.log(`variant ${v.name}: vocab ${vocabSize}`);
  }
  fs.writeFileSync(path.join(outDir, "variants.expected"), Buffer.concat(parts));
}
