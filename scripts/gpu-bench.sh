#!/usr/bin/env bash
# The GPU benchmark (issue 38), for a machine with one NVIDIA GPU and NO Rust toolchain: PyTorch
# eager and dtensor-rs on the same Llama and sizes, in one run on the same GPU.
#
#   scripts/gpu-bench.sh --prebuilt DIR [--quick]     (DIR: the output of scripts/gpu-build.sh)
#   scripts/gpu-bench.sh --bin PATH/TO/llama_bench    (a llama_bench built any way; no bandwidth rows)
#
# Rows (each a training step — loss, backward, AdamW — then greedy generation with a KV cache):
#   bf16 1x1: PyTorch eager (f32 weights, autocast bf16) vs dtensor-rs on NCCL at world 1
#             (bf16 weights, f32 masters);
#   f32  1x1: the same in f32;
#   bf16 2x2: dtensor-rs on cuda-threads (4 ranks sharing the GPU: dp 2 × tp 2) vs PyTorch 1x1.
# Then the redistribution bandwidths (DIR/tests/cuda_bandwidth: S(0)->R, P->R, P->S(0),
# S(0)->S(1) at 256 MiB and 1 GiB, as a fraction of a device memcpy measured in the same run).
# Ends with one table: per row ms/step, tokens/s, MFU, device work per step (ours: our kernel
# launches plus cuBLAS calls, over every rank of the process; PyTorch's: device kernels, cuBLAS's
# included), and dtensor-rs tokens/s ÷ PyTorch's. MFU is against the GPU's published dense peak
# (H100/H200 SXM: 989 TFLOP/s bf16, 67 f32; H100 NVL 835 / 60; H100 PCIe 756 / 51; else none;
# PEAK_BF16 / PEAK_F32 override).
# Sizes: hidden 2048, 16 layers, seq 1024, batch 8 (about 0.9 B parameters); --quick: hidden
# 1024, 8 layers, seq 512, batch 8. SIZES="--hidden .. --layers .." overrides both.
# Without a GPU (or torch, or a CUDA build) every part prints SKIP with its reason and the
# script exits 0; with a GPU it exits 1 when a run failed. Budget: BENCH_BUDGET_S (default 600 s)
# for the whole run; the dtensor-rs runs share one random checkpoint.
set -uo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
dir="" bin="" quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) dir="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --bin) bin="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-bench: unknown argument $1" >&2; usage; exit 2 ;;
  esac
done
[ -n "$dir" ] && bin="${bin:-$dir/examples/llama_bench}"
if [ -z "$bin" ]; then
  echo "gpu-bench: --prebuilt DIR or --bin PATH is required" >&2
  usage
  exit 2
fi
if [ ! -x "$bin" ]; then
  echo "gpu-bench: SKIP: no llama_bench binary at $bin (scripts/gpu-build.sh builds it)"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
budget=${BENCH_BUDGET_S:-600}
left() { echo $(( budget - ($(date +%s) - start) )); }
out=$(mktemp)
ckpt=$(mktemp -d)
links=$(mktemp -d)
trap 'rm -rf "$out" "$ckpt" "$links"' EXIT

if [ "$quick" = 1 ]; then
  sizes=${SIZES:-"--hidden 1024 --intermediate 2816 --heads 16 --kv-heads 8 --layers 8 --vocab 32000 --seq 512 --batch 8"}
else
  sizes=${SIZES:-"--hidden 2048 --intermediate 5632 --heads 16 --kv-heads 8 --layers 16 --vocab 32000 --seq 1024 --batch 8"}
fi
steps="--steps ${BENCH_STEPS:-10} --warmup 2 --new-tokens ${BENCH_NEW_TOKENS:-32}"

echo "== GPU"
gpu=""
if command -v nvidia-smi >/dev/null; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  nvidia-smi -L
else
  echo "nvidia-smi not found: no GPU here (the runs below print SKIP)"
fi
case "$gpu" in
  *H100*PCIe*) peak_bf16=756; peak_f32=51 ;;
  *H100*NVL*) peak_bf16=835; peak_f32=60 ;;
  *H100*|*H200*) peak_bf16=989; peak_f32=67 ;;
  *) peak_bf16=""; peak_f32="" ;;
esac
peak_bf16=${PEAK_BF16:-$peak_bf16}
peak_f32=${PEAK_F32:-$peak_f32}
peak() { local p; [ "$1" = bf16 ] && p=$peak_bf16 || p=$peak_f32; [ -n "$p" ] && echo "--peak-tflops $p"; }
echo "   peak TFLOP/s: bf16 ${peak_bf16:-unknown}, f32 ${peak_f32:-unknown}; sizes: $sizes"

# Library folders of the system python's nvidia-* wheels (CUDA 13, NCCL), then the usual CUDA
# places and the loader's cache (as gpu-check.sh looks), for the Rust binary.
libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))
except Exception:
    pass
PY
)
libs="$libs:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"
# cudarc's CUDA 13 bindings look for libnccl.so; the wheels and distributions ship libnccl.so.2.
nccl=""
for d in ${libs//:/ }; do [ -z "$nccl" ] && [ -e "$d/libnccl.so.2" ] && nccl="$d/libnccl.so.2"; done
[ -z "$nccl" ] && nccl=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" { print $NF; exit }')
[ -n "$nccl" ] && ln -sf "$nccl" "$links/libnccl.so"
export LD_LIBRARY_PATH="$links:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# run LABEL CMD...: one run under the budget; its BENCH and SKIP lines go to the table.
run() {
  local label=$1; shift
  local secs; secs=$(left)
  if [ "$secs" -le 10 ]; then echo "SKIPROW $label | time budget spent" >>"$out"; return; fi
  echo "== $label"
  local log; log=$(mktemp)
  timeout -k 10 "$secs" "$@" >"$log" 2>&1
  local rc=$?
  grep -v '^BENCH' "$log" | tail -3 | sed 's/^/   /'
  if grep -q '^BENCH' "$log"; then
    grep '^BENCH' "$log" | sed "s/^BENCH /BENCH [$label] /" >>"$out"
  elif grep -q ': SKIP: ' "$log"; then
    echo "SKIPROW $label | $(grep -m1 ': SKIP: ' "$log" | sed 's/^.*: SKIP: //' | cut -c1-140)" >>"$out"
  else
    echo "SKIPROW $label | FAILED (exit $rc): $(tail -1 "$log" | cut -c1-140)" >>"$out"
  fi
  rm -f "$log"
}

for dtype in bf16 f32; do
  # shellcheck disable=SC2086
  run "$dtype 1x1 pytorch" python3 -u "$here/gpu_bench_torch.py" --dtype "$dtype" $sizes $steps $(peak "$dtype")
  # shellcheck disable=SC2086
  run "$dtype 1x1 dtensor-rs" "$bin" --backend nccl --mesh 1x1 --dtype "$dtype" $sizes $steps $(peak "$dtype") \
    --checkpoint "$ckpt"
done
# shellcheck disable=SC2086
run "bf16 2x2 dtensor-rs" "$bin" --backend cuda-threads --mesh 2x2 --dtype bf16 $sizes $steps $(peak bf16) \
  --checkpoint "$ckpt"

if [ -n "$dir" ] && [ -x "$dir/tests/cuda_bandwidth" ]; then
  echo "== redistribution bandwidth (cuda-threads, vs device memcpy)"
  secs=$(left)
  if [ "$secs" -gt 10 ]; then
    # libtest prints a test's first output on its `test ... ` line: match anywhere in it
    timeout -k 10 "$secs" "$dir/tests/cuda_bandwidth" --test-threads=1 --nocapture 2>&1 | grep -o 'BANDWIDTH .*\|GPUCHECK .*' | sed 's/^/   /'
  else
    echo "   SKIP: time budget spent"
  fi
fi

echo
echo "== dtensor-rs vs PyTorch eager (${gpu:-no GPU}; $(date -u +%F))"
python3 - "$out" <<'PY'
import re, sys
rows, skips = {}, []
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if line.startswith("SKIPROW "):
        skips.append(line[8:])
        continue
    m = re.match(r"BENCH \[(.*?)\] llama (step|generate) \| (.*)", line)
    if m:
        rows[(m.group(1), m.group(2))] = [c.strip() for c in m.group(3).split("|")]
def tps(cells):
    for c in cells or []:
        m = re.match(r"([0-9.]+) tokens/s", c)
        if m:
            return float(m.group(1))
    return None
print("| run | what | ms/step | tokens/s | MFU | device work per step | tokens/s vs PyTorch |")
print("|---|---|---|---|---|---|---|")
for (label, what), cells in sorted(rows.items()):
    dtype = label.split()[0]
    base = rows.get((f"{dtype} 1x1 pytorch", what))
    ratio = f"{tps(cells) / tps(base):.2f}" if "pytorch" not in label and tps(cells) and tps(base) else ""
    if what == "step":
        print(f"| {label} | step | {cells[3]} | {cells[4]} | {cells[5]} | {cells[6] if len(cells) > 6 else ''} | {ratio} |")
    else:
        print(f"| {label} | generate | | {cells[3]} | | | {ratio} |")
for s in skips:
    print(f"SKIP {s}")
PY
# A failed run fails the benchmark where there is a GPU (without one, everything is a SKIP).
if [ -n "$gpu" ] && grep -q '^SKIPROW .* | FAILED' "$out"; then
  exit 1
fi
exit 0
