#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and NO Rust toolchain: runs the binaries
# scripts/gpu-build.sh prepared on a CPU machine.
#
#   scripts/gpu-check.sh --prebuilt DIR      (DIR: the output of scripts/gpu-build.sh)
#
# Prints `nvidia-smi -L`, the glibc and NCCL versions, where the CUDA 13 libraries were found
# (the nvidia-* wheels of the system python, /usr/local/cuda, or the loader's cache), runs every
# device test binary (one process each, one test thread, a shared time budget) and the
# examples' GPU runs, then the cuda-threads tests and mlp_tp again with collectives staged
# through the host (DTENSOR_CUDA_THREADS_STAGE=host, rows tagged [staged]; the default moves
# device shards device to device), and ends with one `name | result | detail` table built from the
# `GPUCHECK name | result | detail` lines the tests print (a test that fails before printing
# shows up as FAIL with its panic message). The whole run stays under 4 minutes
# (GPU_CHECK_BUDGET_S, default 210 s). A second table follows with the `BANDWIDTH` lines the
# tests print (tests/cuda_bandwidth.rs: redistribution vs device memcpy).
# GPU_CHECK_LOGS=DIR writes the per-binary logs to DIR (created) instead of a temporary folder.
# Exit status: 0 when nothing failed (a SKIP fails too unless ALLOW_SKIP=1), 1 otherwise,
# 2 on bad usage.
set -uo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) dir="${2:-}"; shift 2 || { usage; exit 2; } ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; usage; exit 2 ;;
  esac
done
if [ -z "$dir" ] || [ ! -d "$dir/tests" ]; then
  echo "gpu-check: --prebuilt DIR is required (DIR/tests from scripts/gpu-build.sh)" >&2
  exit 2
fi
dir=$(cd "$dir" && pwd)
start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-210}
left() { echo $(( budget - ($(date +%s) - start) )); }

echo "== GPUs"
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi not found"
echo "== glibc: $(ldd --version 2>/dev/null | head -1)"
[ -f "$dir/MANIFEST" ] && sed -n '1,3p' "$dir/MANIFEST" | sed 's/^/   binaries: /'

echo "== CUDA 13 libraries"
# Library folders of the nvidia-* wheels (nvidia/<pkg>/lib, nvidia/cu13/lib) of the system python.
wheel_dirs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    for p in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(p, "*", "lib"))):
            print(d)
except Exception:
    pass
PY
)
search="$wheel_dirs /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu"
find_lib() {
  for d in $search; do
    if [ -e "$d/$1" ]; then echo "$d/$1"; return; fi
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }'
}
links=$(mktemp -d)
trap 'rm -rf "$links"' EXIT
libpath="$links"
for lib in libcuda.so.1 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  p=$(find_lib "$lib")
  if [ -z "$p" ]; then
    echo "   $lib: NOT FOUND"
    continue
  fi
  echo "   $lib: $p"
  d=$(dirname "$p")
  case ":$libpath:" in *":$d:"*) ;; *) libpath="$libpath:$d" ;; esac
  # cudarc's cuda-13000 bindings try libX.so, libX.so.13, ...: never libnccl.so.2.
  [ "$lib" = libnccl.so.2 ] && ln -sf "$p" "$links/libnccl.so"
done
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nccl=$(find_lib libnccl.so.2)
if [ -n "$nccl" ]; then
  real=$(basename "$(readlink -f "$nccl")")
  pipv=$(python3 -c 'import importlib.metadata as m
for n in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl"):
    try: print(n, m.version(n)); break
    except Exception: pass' 2>/dev/null)
  echo "== NCCL: $real${pipv:+ (wheel $pipv)}"
else
  echo "== NCCL: not found"
fi

rows=$(mktemp)
if [ -n "${GPU_CHECK_LOGS:-}" ]; then
  logs=$GPU_CHECK_LOGS
  mkdir -p "$logs" || { echo "gpu-check: cannot create GPU_CHECK_LOGS=$logs" >&2; exit 2; }
else
  logs=$(mktemp -d)
fi
row() { printf '%s | %s | %s\n' "$1" "$2" "$3" >>"$rows"; }

# run_test BINARY TAG [FILTER] [VAR=VALUE ...]: one test binary (one process, one test thread,
# the shared time budget); its GPUCHECK rows get TAG appended to their names.
run_test() {
  local t=$1 tag=$2 filter=${3:-}; shift 3 || shift $#
  local name; name=$(basename "$t")$tag
  local log="$logs/${name//[^A-Za-z0-9_]/_}.log"
  local secs; secs=$(left)
  if [ "$secs" -le 5 ]; then row "$name" SKIP "time budget spent"; return; fi
  local t0; t0=$(date +%s)
  timeout "$secs" env "$@" "$t" $filter --test-threads=1 --nocapture >"$log" 2>&1
  local rc=$?
  echo "   $name: exit $rc in $(( $(date +%s) - t0 )) s ($(grep -c 'GPUCHECK ' "$log") checks)"
  grep -o 'GPUCHECK .*' "$log" | sed 's/^GPUCHECK //' | awk -F'|' -v tag="$tag" 'BEGIN { OFS = "|" }
    { sub(/ +$/, "", $1); $1 = $1 tag " "; print }' >>"$rows"
  # Failed tests, from the harness's closing `failures:` list (with --nocapture a test's own
  # output splits its `test X ... FAILED` line); the panic message is the detail.
  local failed f msg
  failed=$(sed -n '/^failures:$/,/^test result/p' "$log" | sed -n 's/^    \([A-Za-z0-9_:]*\)$/\1/p' | sort -u)
  for f in $failed; do
    msg=$(grep -A1 "thread '$f'.*panicked" "$log" | tail -1 | cut -c1-160)
    row "$name::$f" FAIL "${msg:-see the log}"
  done
  if [ "$rc" -eq 124 ]; then row "$name" FAIL "timed out (budget)"; fi
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ -z "$failed" ]; then
    row "$name" FAIL "exit $rc: $(tail -1 "$log" | cut -c1-160)"
  fi
}

echo "== device tests"
for t in "$dir"/tests/*; do
  [ -x "$t" ] || continue
  run_test "$t" "" "" GPU_PROP_SECONDS=15
done
# The cuda-threads host-staged path (not the default): its tests again, rows tagged [staged].
echo "== cuda-threads host-staged path"
for spec in "cuda_gpu cuda_threads" "cuda_threads_prop " "cuda_bandwidth "; do
  set -- $spec
  [ -x "$dir/tests/$1" ] || continue
  run_test "$dir/tests/$1" " [staged]" "${2:-}" DTENSOR_CUDA_THREADS_STAGE=host GPU_PROP_SECONDS=15
done

echo "== examples"
# (label, binary, args, env): a backend the build does not know is a SKIP.
run_example() {
  local label=$1 bin=$2; shift 2
  if [ ! -x "$dir/examples/$bin" ]; then row "$label" SKIP "no $bin binary"; return; fi
  local secs; secs=$(left)
  if [ "$secs" -le 5 ]; then row "$label" SKIP "time budget spent"; return; fi
  local log="$logs/${label//[^A-Za-z0-9_]/_}.log"
  timeout "$secs" env "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && tail -1 "$log" | grep -q '^PASS'; then
    row "$label" PASS "$(grep -m1 'max relative\|relative diff\|mesh dp' "$log" | cut -c1-120)"
  elif [ $rc -eq 0 ] && grep -q ': SKIP: ' "$log"; then
    # The examples print `NAME: SKIP: reason` and exit 0 when the backend cannot run here.
    row "$label" SKIP "$(grep -m1 ': SKIP: ' "$log" | sed 's/^.*: SKIP: //' | cut -c1-120)"
  else
    row "$label" FAIL "exit $rc: $(tail -1 "$log" | cut -c1-120)"
  fi
}
# cuda-threads: 4 thread ranks sharing the GPU(s); NCCL at world 1 in both launch modes
# (process mode from torchrun's variables, thread mode without them).
run_example mlp_tp_cuda_threads_2x2 mlp_tp "$dir/examples/mlp_tp" --backend cuda-threads --mesh 2x2 --steps 5
run_example "mlp_tp_cuda_threads_2x2 [staged]" mlp_tp DTENSOR_CUDA_THREADS_STAGE=host \
  "$dir/examples/mlp_tp" --backend cuda-threads --mesh 2x2 --steps 5
# FSDP (issue 35) on cuda-threads: FSDP over dp × TP over tp, and FSDP only, against the CPU
# run on one rank (the example's reference).
run_example transformer_tp_fsdp_cuda_threads_2x2 transformer_tp "$dir/examples/transformer_tp" \
  --backend cuda-threads --fsdp --steps 3
run_example transformer_tp_fsdp_cuda_threads_4x1 transformer_tp "$dir/examples/transformer_tp" \
  --backend cuda-threads --fsdp --mesh 4x1 --steps 3
run_example mlp_tp_nccl_process_world1 mlp_tp RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
  "$dir/examples/mlp_tp" --backend nccl --mesh 1x1 --steps 5
run_example mlp_tp_nccl_threads_world1 mlp_tp -u RANK -u OMPI_COMM_WORLD_RANK -u PMI_RANK \
  "$dir/examples/mlp_tp" --backend nccl --mesh 1x1 --steps 5

echo
printf '%-56s | %-6s | %s\n' name result detail
printf '%-56s-+-%-6s-+-%s\n' "$(printf -- '-%.0s' {1..56})" ------ "$(printf -- '-%.0s' {1..40})"
while IFS='|' read -r n r d; do
  printf '%-56s | %-6s | %s\n' "$(echo "$n" | xargs)" "$(echo "$r" | xargs)" "$(echo "$d" | sed 's/^ *//')"
done <"$rows"
# The bandwidth tables, one per pass: `BANDWIDTH transition | ranks | size | ms | GB/s | x memcpy`
# lines, the first of which is the header.
for bwlog in "$logs"/cuda_bandwidth*.log; do
  [ -f "$bwlog" ] || continue
  bw=$(grep -o 'BANDWIDTH .*' "$bwlog" | sed 's/^BANDWIDTH //')
  [ -n "$bw" ] || continue
  echo
  case "$bwlog" in *staged*) echo "cuda-threads, host-staged path:" ;; *) echo "cuda-threads, device-to-device path:" ;; esac
  echo "$bw" | awk -F'|' '{
    for (i = 1; i <= NF; i++) { gsub(/^ +| +$/, "", $i) }
    printf "%-30s | %5s | %-7s | %9s | %8s | %8s\n", $1, $2, $3, $4, $5, $6
    if (NR == 1) printf "%s-+-%s-+-%s-+-%s-+-%s-+-%s\n", "------------------------------", "-----", "-------", "---------", "--------", "--------"
  }'
done
fails=$(awk -F'|' '$2 ~ /FAIL/' "$rows" | wc -l)
skips=$(awk -F'|' '$2 ~ /SKIP/' "$rows" | wc -l)
passes=$(awk -F'|' '$2 ~ /PASS/' "$rows" | wc -l)
echo
echo "gpu-check: $passes PASS, $fails FAIL, $skips SKIP in $(( $(date +%s) - start )) s (logs: $logs)"
if [ "$fails" -gt 0 ] || { [ "$skips" -gt 0 ] && [ "${ALLOW_SKIP:-0}" != 1 ]; }; then
  exit 1
fi
