#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Generate the checkpoints and goldens the C test suite checks beyond the committed ones, with the
# PyTorch reference: second seeds, the other sampler placement, every storage layout, a config
# with other upstream-schema choices, and the bench configuration (real widths).
#   scripts/make_test_goldens.sh OUT_DIR [--no-bench]
# Each entry is OUT_DIR/<name>/{model,golden}; a stamp file makes reruns cheap.
set -euo pipefail
out=${1:?usage: make_test_goldens.sh OUT_DIR [--no-bench]}
bench=1
[ "${2:-}" = "--no-bench" ] && bench=0
root=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
ck="$py $root/reference/make_checkpoint.py"
gd="$py $root/reference/make_golden.py"
stamp_src=$(cat "$0" "$root"/reference/*.py "$root"/reference/molmoact_ref/*.py | sha256sum | cut -c1-16)
mkdir -p "$out"

entry() {  # name, then make_checkpoint args (or "asset:<dir>" to reuse a committed model), then -- golden args
  local name=$1; shift
  local dir="$out/$name"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp_src" ]; then return; fi
  rm -rf "$dir"; mkdir -p "$dir"
  local ckargs=() gargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do ckargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  gargs=("$@")
  if [[ "${ckargs[0]}" == asset:* ]]; then
    ln -s "$root/assets/${ckargs[0]#asset:}/model" "$dir/model"
  else
    $ck "${ckargs[@]}" -o "$dir/model" > /dev/null
  fi
  $gd --model "$dir/model" -o "$dir/golden" "${gargs[@]}" | sed "s|^|[$name] |"
  echo "$stamp_src" > "$dir/.stamp"
}

entry tiny-grid-seed1     asset:tiny-grid -- --seed 1
entry tiny-original-seed1 asset:tiny-original -- --seed 1
entry tiny-grid-pooling   --config tiny --variant grid --sampler-placement pooling --seed 2 -- --seed 2
entry tiny-grid-f32       --config tiny --variant grid --seed 4 --dtype f32 -- --seed 4
entry tiny-grid-bf16      --config tiny --variant grid --seed 4 --dtype bf16 -- --seed 4
entry tiny-grid-mixed     --config tiny --variant grid --seed 4 --dtype mixed -- --seed 4
entry tiny-grid-sharded   --config tiny --variant grid --seed 4 --dtype bf16 --shard-mb 4 -- --seed 4
entry tiny-grid-lerobot   --config tiny --variant original --seed 4 --dtype mixed --lerobot -- --seed 4
entry tiny-schema-variety --config tiny --variant grid --seed 3 \
  --set text_config.num_hidden_layers=6 --set action_expert_config.num_layers=6 \
  --set text_config.qk_norm_type=olmo --set text_config.qkv_bias=true --set text_config.num_key_value_heads=1 \
  --set text_config.num_attention_heads=8 --set text_config.head_dim=8 --set text_config.vocab_size=155700 \
  --set vit_config.num_key_value_heads=1 --set vit_config.num_hidden_layers=12 \
  --set action_expert_config.causal_attn=true --set action_expert_config.rope=false \
  --set action_expert_config.num_heads=4 --set adapter_config.pooling_attention_mask=false \
  --set action_mode=continuous --set text_config.norm_after=true -- --seed 3
if [ $bench = 1 ]; then
  entry bench-grid        --config bench --variant grid --seed 0 --dtype mixed -- --seed 0
  entry bench-original    --config bench --variant original --seed 0 --dtype bf16 -- --seed 0
fi
echo "test goldens ready in $out"
