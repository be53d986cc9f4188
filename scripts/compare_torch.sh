#!/usr/bin/env bash
# PyTorch against dtensor-rs in ONE run, same sizes, one table with the ratio per row:
#   - mlp_tp training step (2 blocks, SGD) on a 2x2 dp x tp mesh at batch/dim/hidden
#     64/128/512, 128/256/1024, 256/512/2048 (scripts/bench_torch.py vs benches/mlp_step.rs);
#   - single-thread GEMM, f32 and f64, 256^3, 512^3, 1024^3, 16x256^3
#     (scripts/gemm_torch.py vs benches/gemm.rs);
#   - redistribution bandwidth S(0)->R, P->R, P->S(0), S(0)->S(1) at 16 MiB over 2 and 4 ranks
#     and at a 1 GiB-class size over 2 ranks, each also as a fraction of a memcpy of the same
#     bytes measured in the same run (scripts/bench_torch.py vs benches/collectives.rs);
#   - the 4-byte all-reduce latency of the thread backend.
#
# Usage: scripts/compare_torch.sh [--quick] [--install-torch] [--big-mib N]
#   --quick          fewer rounds/steps/samples (about 5 minutes on 2 cores after the build)
#   --install-torch  create .venv-torch and pip-install the CPU torch wheel into it (only then
#                    is anything installed)
#   --big-mib N      size of the 1 GiB-class redistribution rows (default 1024)
# Torch: $DTENSOR_PYTHON, else .venv-torch/bin/python; without torch only the Rust side runs.
# Not part of CI. The build (cargo bench --no-run) runs first and is not counted in the budget.
set -euo pipefail

quick=0
install=0
big=1024
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --install-torch) install=1 ;;
        --big-mib) big="$2"; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "compare_torch.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
log() { echo "[compare_torch $(date +%H:%M:%S)] $*" >&2; }

py="${DTENSOR_PYTHON:-}"
if [ -z "$py" ] && [ -x .venv-torch/bin/python ]; then py=.venv-torch/bin/python; fi
if [ -z "$py" ] && [ "$install" = 1 ]; then
    log "installing torch (CPU wheel) into .venv-torch"
    python3 -m venv .venv-torch
    .venv-torch/bin/pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
    py=.venv-torch/bin/python
fi
if [ -n "$py" ] && ! "$py" -c 'import torch' 2>/dev/null; then
    log "$py cannot import torch"
    py=""
fi
[ -n "$py" ] || log "no torch (set DTENSOR_PYTHON or pass --install-torch): only the Rust side runs"

if [ "$quick" = 1 ]; then
    rounds=3; steps=5; iters=5; big_iters=2; crit=(--quick)
else
    rounds=5; steps=20; iters=10; big_iters=3; crit=()
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

log "building the benches"
cargo bench --no-run --bench gemm --bench collectives --bench mlp_step >&2

torchrun() {
    local n=$1; shift
    [ -n "$py" ] || return 0
    # gloo sometimes aborts a rank at exit ("terminate called without an active exception")
    # after the results are printed: keep the rows that came out, the table shows the rest as -.
    OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" scripts/bench_torch.py "$@" \
        2> >(grep -v -i -e warn -e _conversion_method_template -e "does not support alltoall" >&2) ||
        log "PyTorch run on $n ranks ($*) exited with $?; its printed rows are kept"
}

log "GEMM"
if [ -n "$py" ]; then "$py" scripts/gemm_torch.py --sizes 256,512,1024 --rounds "$rounds" 2>/dev/null >"$out/torch_gemm"; fi
DTENSOR_GEMM_SIZES=256,512,1024 DTENSOR_GEMM_ROUNDS=$rounds cargo bench --bench gemm 2>/dev/null >"$out/rust_gemm"

log "MLP step"
mlp_sizes="64x128x512 128x256x1024 256x512x2048"
for s in $mlp_sizes; do
    IFS=x read -r b d h <<<"$s"
    torchrun 4 --skip-redistribute --dp 2 --tp 2 --batch "$b" --dim "$d" --hidden "$h" --steps "$steps" >>"$out/torch_mlp"
done
DTENSOR_BENCH_MLP_SIZES=$(echo "$mlp_sizes" | tr ' ' ,) DTENSOR_BENCH_MESHES=2x2 \
    cargo bench --bench mlp_step -- "${crit[@]}" 2>/dev/null >"$out/rust_mlp"

log "redistribution at 16 MiB (2 and 4 ranks) and $big MiB (2 ranks)"
torchrun 2 --skip-mlp --sizes-mib 16 --iters "$iters" >>"$out/torch_redist"
torchrun 4 --skip-mlp --sizes-mib 16 --iters "$iters" >>"$out/torch_redist"
torchrun 2 --skip-mlp --sizes-mib "$big" --iters "$big_iters" >>"$out/torch_redist"
DTENSOR_BENCH_SIZES_MIB=16 DTENSOR_BENCH_RANKS=2,4 \
    cargo bench --bench collectives -- "${crit[@]}" '(memcpy|redistribute|all_reduce_4B)' 2>/dev/null >"$out/rust_redist"
DTENSOR_BENCH_SIZES_MIB=$big DTENSOR_BENCH_RANKS=2 DTENSOR_BENCH_MAX_WORLD_MIB=$((2 * big)) \
    cargo bench --bench collectives -- "${crit[@]}" '(memcpy|redistribute)/' 2>/dev/null >>"$out/rust_redist"

torch_version=$([ -n "$py" ] && "$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "none")
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo
echo "dtensor-rs vs PyTorch $torch_version, $(date -u '+%Y-%m-%d %H:%M UTC'), $cpu, $(nproc) cores;" \
    "load average $load_start at start, $(cut -d' ' -f1-3 /proc/loadavg) at end$([ "$quick" = 1 ] && echo ', --quick')"
python3 - "$out" <<'EOF'
import sys, os

out = sys.argv[1]

def lines(name, tag):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    return [l.split()[1:] for l in open(path) if l.startswith(tag + " ")]

def fmt(x, spec):
    return "-" if x is None else format(x, spec)

rows = []
# MLP: ms/step on 2x2; ratio = PyTorch time / dtensor time (target >= 2).
torch_mlp = {tuple(r[:4]): float(r[4]) for r in lines("torch_mlp", "torch-mlp-result")}
for r in lines("rust_mlp", "mlp-result"):
    key = tuple(r[:4])
    t, d = torch_mlp.get(key), float(r[4])
    rows.append((f"mlp step {r[0]}/{r[1]}/{r[2]} on {r[3]}", "ms/step", t, d, t / d if t else None, ">= 2 (faster)"))
# GEMM: GFLOP/s; ratio = dtensor / PyTorch (target >= 0.9).
torch_gemm = {tuple(r[:5]): float(r[6]) for r in lines("torch_gemm", "gemm-result")}
for r in lines("rust_gemm", "gemm-result"):
    if r[5] != "dtensor":
        continue
    t, d = torch_gemm.get(tuple(r[:5])), float(r[6])
    shape = f"{r[2]}^3" if r[1] == "1" else f"{r[1]}x{r[2]}^3"
    rows.append((f"gemm {r[0]} {shape}", "GFLOP/s", t, d, d / t if t else None, ">= 0.9"))
# Redistribution: GB/s moved per rank; ratio = dtensor / PyTorch; the memcpy fractions follow.
torch_red = {tuple(r[:3]): r for r in lines("torch_redist", "torch-redist-result")}
memfrac = []
for r in lines("rust_redist", "redist-result"):
    t = torch_red.get(tuple(r[:3]))
    tg, d = (float(t[5]) if t else None), float(r[5])
    label = f"redistribute {r[0]} {r[1]}r {r[2]} MiB"
    rows.append((label, "GB/s", tg, d, d / tg if tg else None, ""))
    memfrac.append((label, float(t[4]) if t else None, float(r[4]), float(r[6]) if len(r) > 6 and r[6] != "nan" else None))
for r in lines("rust_redist", "latency-result"):
    rows.append((f"all_reduce 4 B, {r[0]} ranks", "µs", None, float(r[1]), None, "dtensor <= 10"))

print(f"{'row':<40} {'unit':>8} {'PyTorch':>10} {'dtensor':>10} {'ratio':>7}  target")
for label, unit, t, d, ratio, target in rows:
    print(f"{label:<40} {unit:>8} {fmt(t, '10.2f')} {fmt(d, '10.2f')} {fmt(ratio, '7.2f')}  {target}")
if memfrac:
    print()
    # "fresh": a memcpy into a newly allocated buffer, what any fresh output pays at least.
    print(f"{'redistribution vs memcpy in the same run':<40} {'PyTorch':>10} {'dtensor':>10} {'fresh':>7}  target (dtensor)")
    for label, t, d, f in memfrac:
        print(f"{label:<40} {fmt(t, '10.2f')} {fmt(d, '10.2f')} {fmt(f, '7.2f')}  >= 0.8")
EOF
