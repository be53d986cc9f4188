#!/usr/bin/env bash
# PyTorch FSDP2 against dtensor-rs FSDP in ONE run: the transformer_tp GPT (f64, AdamW, every
# parameter fully sharded over dp), the same sizes, dp = 1, 2, 4:
#   PyTorch: scripts/fsdp_torch.py, gloo, one process per rank (torchrun), OMP_NUM_THREADS=1;
#   dtensor-rs: benches/fsdp_step.rs, one thread per rank.
# Step time: median over the steps of the slowest rank. Peak memory per rank: PyTorch's peak
# resident-set growth (VmHWM, after a first unmeasured run), ours the peak growth of the rank's
# heap (a counting allocator): the training's own memory on both sides.
#
# Usage: scripts/compare_fsdp.sh [--steps N] [--configs compute,params] [--dps 1,2,4]
# Torch: $DTENSOR_PYTHON, else .venv-torch/bin/python; without torch only the Rust side runs.
# Not part of CI (cargo test --benches runs the Rust side once, tiny).
set -euo pipefail

steps=5
configs=compute,params
dps=1,2,4
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps="$2"; shift ;;
        --configs) configs="$2"; shift ;;
        --dps) dps="$2"; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "compare_fsdp.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
log() { echo "[compare_fsdp $(date +%H:%M:%S)] $*" >&2; }

py="${DTENSOR_PYTHON:-}"
if [ -z "$py" ] && [ -x .venv-torch/bin/python ]; then py=.venv-torch/bin/python; fi
if [ -n "$py" ] && ! "$py" -c 'import torch' 2>/dev/null; then log "$py cannot import torch"; py=""; fi
[ -n "$py" ] || log "no torch (set DTENSOR_PYTHON): only the Rust side runs"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "building the bench"
cargo bench --no-run --bench fsdp_step >&2

for c in ${configs//,/ }; do
    for n in ${dps//,/ }; do
        if [ -n "$py" ]; then
            log "PyTorch FSDP2 $c dp=$n"
            OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" \
                scripts/fsdp_torch.py --config "$c" --steps "$steps" 2>/dev/null >>"$out/torch" ||
                log "PyTorch run $c dp=$n exited with $?"
        fi
        log "dtensor-rs $c dp=$n"
        DTENSOR_BENCH_FSDP_CONFIGS=$c DTENSOR_BENCH_FSDP_DPS=$n DTENSOR_BENCH_FSDP_STEPS=$steps \
            cargo bench --bench fsdp_step 2>/dev/null >>"$out/rust"
    done
done

torch_version=$([ -n "$py" ] && "$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "none")
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo
echo "FSDP: dtensor-rs vs PyTorch $torch_version FSDP2, $(date -u '+%Y-%m-%d %H:%M UTC'), $cpu, $(nproc) cores;" \
    "$steps steps; load average $load_start at start, $(cut -d' ' -f1-3 /proc/loadavg) at end"
python3 - "$out" <<'PYEOF'
import os, sys
out = sys.argv[1]
def rows(name, tag):
    p = os.path.join(out, name)
    return [l.split()[1:] for l in open(p) if l.startswith(tag + " ")] if os.path.exists(p) else []
torch = {(r[0], r[1]): (float(r[2]), int(r[3])) for r in rows("torch", "torch-fsdp-result")}
print()
print("| config | dp | PyTorch ms/step | dtensor-rs ms/step | speed-up (target >= 2) | PyTorch peak MB/rank | dtensor-rs peak MB/rank | memory ratio (target <= 1) |")
print("|---|---|---|---|---|---|---|---|")
for c, n, ms, peak in rows("rust", "fsdp-result"):
    ms, peak = float(ms), int(peak)
    t = torch.get((c, n))
    f = lambda x, s: "-" if x is None else format(x, s)
    print(f"| {c} | {n} | {f(t and t[0], '.1f')} | {ms:.1f} | {f(t and t[0] / ms, '.2f')} | "
          f"{f(t and t[1] / 1e6, '.1f')} | {peak / 1e6:.1f} | {f(t and peak / t[1], '.2f')} |")
PYEOF
