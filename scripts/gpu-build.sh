#!/usr/bin/env bash
# Builds, on a machine WITHOUT CUDA (cudarc loads the CUDA libraries at run time), the stripped
# release binaries the GPU check runs on a machine without a Rust toolchain:
#   - every CUDA test executable of dtensor-runtime (tests/cuda_*.rs, tests/nccl_*.rs, but not
#     the host emulation cuda_kernels_host), built with `--features cuda`;
#   - the examples the GPU scripts run (mlp_tp and transformer_tp for gpu-check.sh, llama_bench
#     for gpu-bench.sh), built with `--features cuda` (the others stay here: the folder must fit
#     the device tool's carry limit).
# Output: DIR (default gpu-prebuilt/, git-ignored) with tests/, examples/, MANIFEST (commit,
# binaries, the newest glibc symbol version they need). Fails if DIR exceeds 60 MiB.
# Then copy DIR to the GPU machine and run: scripts/gpu-check.sh --prebuilt DIR (the check),
# scripts/gpu-bench.sh --prebuilt DIR (the benchmark against PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-prebuilt}"
limit_mib=60

export CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_PROFILE_RELEASE_DEBUG=false
tests=()
for f in dtensor-runtime/tests/cuda_*.rs dtensor-runtime/tests/nccl_*.rs; do
  name=$(basename "$f" .rs)
  # The host emulation of the kernels needs a C++ compiler, not a GPU: CI runs it.
  [ -e "$f" ] && [ "$name" != cuda_kernels_host ] && tests+=(--test "$name")
done
json=$(mktemp)
trap 'rm -f "$json"' EXIT
echo "gpu-build: cargo test --no-run --release --features cuda ${tests[*]}"
cargo test -p dtensor-runtime --release --features cuda --no-run --message-format=json "${tests[@]}" >"$json"
examples=(--example mlp_tp --example transformer_tp --example llama_bench)
echo "gpu-build: cargo build --release --features cuda ${examples[*]}"
cargo build -p dtensor --release --features cuda "${examples[@]}" --message-format=json >>"$json"

rm -rf "$out"
mkdir -p "$out/tests" "$out/examples"
# Executables of test and example targets (a test's file name carries a hash: drop it).
python3 - "$json" "$out" <<'PY'
import json, shutil, sys, os
src, out = sys.argv[1], sys.argv[2]
for line in open(src):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind = m["target"]["kind"][0]
    if kind not in ("test", "example"):
        continue
    dst = os.path.join(out, "tests" if kind == "test" else "examples", m["target"]["name"])
    shutil.copy2(m["executable"], dst)
    print(f"gpu-build: {kind:8} {m['target']['name']}")
PY
command -v strip >/dev/null && strip "$out"/tests/* "$out"/examples/* 2>/dev/null || true

glibc=$(objdump -T "$out"/tests/* "$out"/examples/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) on $(ldd --version | head -1)"
  echo "needs ${glibc:-unknown} or newer on the GPU machine"
  (cd "$out" && find tests examples -type f | sort)
} >"$out/MANIFEST"
size_kib=$(du -sk "$out" | cut -f1)
echo "gpu-build: $out = $((size_kib / 1024)) MiB ($size_kib KiB), $(find "$out/tests" "$out/examples" -type f | wc -l) binaries, needs ${glibc:-?}"
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu-build: $out exceeds $limit_mib MiB" >&2
  exit 1
fi
