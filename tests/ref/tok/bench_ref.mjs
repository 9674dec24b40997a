// bench_ref.mjs - the reference's encode throughput on the tokenizer bench
// text, and the writer of that text.
//
//   node bench_ref.mjs make-text OUT.txt [MB]   writes the mixed bench text (default 8 MB)
//   node bench_ref.mjs run TOKENIZER_DIR TEXT [RUNS]
//
// The text: strings of tests/data/tok/corpus.bin (prose, code, numbers,
// whitespace runs, many scripts, emoji, special-token text; invalid bytes
// read as U+FFFD) in a deterministic shuffled order, joined by newlines or
// spaces. Both this script and bench/tok_bench encode it in one call.
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const [cmd, a, b, c] = process.argv.slice(2);

if (cmd === "make-text") {
  const mb = Number(b ?? 8);
  const buf = fs.readFileSync(path.resolve(here, "../../data/tok/corpus.bin"));
  const td = new TextDecoder("utf-8", { ignoreBOM: true });
  const strs = [];
  for (let p = 0; p < buf.length; ) {
    const nl = buf.indexOf(10, p);
    const n = Number(buf.subarray(p, nl).toString());
    strs.push(td.decode(buf.subarray(nl + 1, nl + 1 + n)));
    p = nl + 1 + n + 1;
  }
  let seed = 12345;
  const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296);
  const parts = [];
  let size = 0;
  while (size < mb * 1e6) {
    const s = strs[Math.floor(rnd() * strs.length)] + (rnd() < 0.5 ? "\n" : " ");
    parts.push(s);
    size += Buffer.byteLength(s);
  }
  fs.writeFileSync(a, parts.join(""));
  console.log(`wrote ${a}: ${size} bytes`);
} else if (cmd === "run") {
  const runs = Number(c ?? 3);
  const t0 = performance.now();
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(a, "tokenizer.json"), "utf8")),
    JSON.parse(fs.readFileSync(path.join(a, "tokenizer_config.json"), "utf8")));
  const load = (performance.now() - t0) / 1000;
  const text = fs.readFileSync(b, "utf8");
  const bytes = Buffer.byteLength(text);
  let best = Infinity, bestCpu = Infinity, n = 0;
  for (let r = 0; r < runs; r++) {
    const t1 = performance.now(), c1 = process.cpuUsage();
    n = tok.encode(text, { add_special_tokens: false }).ids.length;
    best = Math.min(best, (performance.now() - t1) / 1000);
    const c = process.cpuUsage(c1);
    bestCpu = Math.min(bestCpu, (c.user + c.system) / 1e6);
  }
  console.log(`reference  @huggingface/tokenizers in node ${process.version}`);
  console.log(`text       ${b}: ${(bytes / 1e6).toFixed(2)} MB`);
  console.log(`load       ${load.toFixed(3)} s`);
  console.log(`encode     ${best.toFixed(3)} s  ${(bytes / 1e6 / best).toFixed(2)} MB/s  ${n} tokens  ${(n / best).toFixed(0)} tokens/s  (best of ${runs})`);
  console.log(`encode cpu ${bestCpu.toFixed(3)} s  ${(bytes / 1e6 / bestCpu).toFixed(2)} MB/s  (process CPU time, all threads, best of ${runs})`);
} else {
  console.error("usage: node bench_ref.mjs make-text OUT.txt [MB] | run TOKENIZER_DIR TEXT [RUNS]");
  process.exit(1);
}
