// SPDX-License-Identifier: Apache-2.0
// Reference token ids for the C tokenizer's tests.
//   node reference_tokenize.mjs rust|js TOKENIZER_JSON < strings.jsonl > ids.jsonl
// rust: @anush008/tokenizers (Node binding of the Rust Hugging Face tokenizers library);
// js:   @huggingface/tokenizers (pure JavaScript), a cross-check.
// Each input line is a JSON string; each output line the JSON id array (no special tokens added).
import { createRequire } from "module";
import fs from "fs";
import readline from "readline";

const require = createRequire(process.cwd() + "/");
const [impl, path] = process.argv.slice(2);
const lines = [];
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) if (line.length) lines.push(JSON.parse(line));

if (impl === "rust") {
  const { Tokenizer } = require("@anush008/tokenizers");
  const tok = Tokenizer.fromFile(path);
  for (const s of lines) {
    const enc = await tok.encode(s, null, { addSpecialTokens: false });
    process.stdout.write(JSON.stringify(Array.from(enc.getIds())) + "\n");
  }
} else if (impl === "js") {
  const mod = require("@huggingface/tokenizers");
  const tj = JSON.parse(fs.readFileSync(path, "utf8"));
  const tok = new mod.Tokenizer(tj, {});
  for (const s of lines) process.stdout.write(JSON.stringify(tok.encode(s, { add_special_tokens: false }).ids) + "\n");
} else {
  console.error("usage: reference_tokenize.mjs rust|js TOKENIZER_JSON");
  process.exit(2);
}
