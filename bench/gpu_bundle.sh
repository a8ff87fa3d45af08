#!/usr/bin/env bash
# Packs what the GPU checks need into one folder, for a GPU machine that has neither this
# machine's Debian libraries nor a network:
#   bench/gpu_bundle.sh BUILD OUT [BASE_LIB]
# OUT/bin     bench_cuda_copy, kvtier_tests and kvtier-replay from BUILD, stripped;
# OUT/new     BUILD's libkvtier.so.0; OUT/old: BASE_LIB (another build's libkvtier.so.0.*),
#             when given, for bench/gpu_ab.sh to compare with the same binaries;
# OUT/lib     the shared libraries they need beyond glibc, libstdc++ and libgcc;
# OUT/trace.jsonl  the first 40 requests of the shipped trace; OUT/loads.jsonl  8 requests
#                  whose second four load what the first four stored;
# OUT/gpu_ab.sh    the checks (bench/gpu_ab.sh); run it there as `OUT/gpu_ab.sh`.
# Stripped, the folder is about 12 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/gpu_bundle.sh BUILD OUT [BASE_LIB]}
out=${2:?usage: bench/gpu_bundle.sh BUILD OUT [BASE_LIB]}
base=${3:-}
trace=${KVT_TRACE:-../shared/traces/conversation_trace.jsonl}
rm -rf "$out"
mkdir -p "$out/bin" "$out/new" "$out/lib"
for b in bench/bench_cuda_copy tests/kvtier_tests bin/kvtier-replay; do
  [[ -x "$build/$b" ]] || { echo "gpu_bundle: $build/$b is missing (a CUDA build?)" >&2; exit 1; }
  strip -o "$out/bin/$(basename "$b")" "$build/$b"
done
strip -o "$out/new/libkvtier.so.0" "$(readlink -f "$build/src/libkvtier.so.0")"
if [[ -n "$base" ]]; then
  mkdir -p "$out/old"
  strip -o "$out/old/libkvtier.so.0" "$(readlink -f "$base")"
fi
# What the binaries load, less what every Linux has (glibc's libraries, libstdc++, libgcc:
# the GPU machine's are newer) and kvtier itself.
for f in "$out"/bin/* "$out/new/libkvtier.so.0"; do
  LD_LIBRARY_PATH="$out/new" ldd "$f"
done | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
  grep -v "$out/" | while read -r l; do cp -L "$l" "$out/lib/"; done
head -n 40 "$trace" > "$out/trace.jsonl"
# Four requests of twelve 512-token blocks, then the same four again: with a G1 of 800
# 16-token blocks the second round loads the first round's blocks back, which the replay
# checks word by word (the 40 requests above load nothing).
for round in 0 1; do
  for k in 1 2 3 4; do
    ids=$(seq -s, $((k * 1000)) $((k * 1000 + 11)))
    echo "{\"timestamp\": $(((round * 5 + k) * 1000)), \"input_length\": 6000, \"output_length\": 8, \"hash_ids\": [$ids]}"
  done
done > "$out/loads.jsonl"
cp bench/gpu_ab.sh "$out/gpu_ab.sh"
du -sh "$out"
