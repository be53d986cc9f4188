#!/usr/bin/env bash
# The dp gradient overlap (`BackwardOptions::overlap_grad_reduce`, MPI_Iallreduce buckets) on the
# MPI backend: the mlp_tp example under mpirun, plain backward against overlapped buckets, in
# paired rounds (plain, then each bucket size, back to back). Prints per mesh and bucket size the
# median training time and the median per-round ratio t(plain) / t(overlap) (> 1: overlap is
# faster). The thread backend's numbers come from `cargo bench --bench mlp_step`.
#
# Usage: scripts/overlap_mpi.sh [ROUNDS]   (default 5)
# Env: OVERLAP_MESHES (default "2x1 2x2"), OVERLAP_BUCKETS (bytes, default "0 1048576 26214400"),
#      OVERLAP_SIZE (batch dim hidden, default "256 512 2048"), OVERLAP_STEPS (default 20).
# Needs mpirun (libopenmpi-dev openmpi-bin); builds the example with --features mpi, release.
# Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-5}
meshes=${OVERLAP_MESHES:-"2x1 2x2"}
buckets=${OVERLAP_BUCKETS:-"0 1048576 26214400"}
read -r batch dim hidden <<<"${OVERLAP_SIZE:-256 512 2048}"
steps=${OVERLAP_STEPS:-20}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

cargo build --release --features mpi --example mlp_tp >&2
exe=target/release/examples/mlp_tp

# Seconds of training on the mesh (the example's own timer), for mesh $1 and extra args.
seconds() {
    local mesh=$1 np
    shift
    np=$(( ${mesh%x*} * ${mesh#*x} ))
    mpirun --allow-run-as-root --oversubscribe -np "$np" "$exe" --backend mpi --mesh "$mesh" \
        --batch "$batch" --dim "$dim" --hidden "$hidden" --steps "$steps" --lr 0.01 --progress "$@" 2>/dev/null |
        sed -n 's/.* in \([0-9.]*\) s on the mesh.*/\1/p'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "mlp_tp under mpirun, batch $batch dim $dim hidden $hidden, $steps steps, $rounds paired round(s); $(nproc) cores"
printf '%-6s %10s %12s %12s %22s\n' mesh bucket "plain ms" "overlap ms" "ratio plain/overlap"
for mesh in $meshes; do
    declare -A times=() ratios=()
    plain=()
    for _ in $(seq "$rounds"); do
        p=$(seconds "$mesh")
        plain+=("$p")
        for b in $buckets; do
            t=$(seconds "$mesh" --overlap-bucket "$b")
            times[$b]+="$t "
            ratios[$b]+="$(awk -v p="$p" -v t="$t" 'BEGIN { printf "%.4f", p / t }') "
        done
    done
    pm=$(printf '%s\n' "${plain[@]}" | median)
    for b in $buckets; do
        tm=$(tr ' ' '\n' <<<"${times[$b]}" | sed '/^$/d' | median)
        rs=$(tr ' ' '\n' <<<"${ratios[$b]}" | sed '/^$/d')
        printf '%-6s %10s %12.2f %12.2f %22s\n' "$mesh" "$b" "$(awk -v s="$pm" -v n="$steps" 'BEGIN { print s * 1000 / n }')" \
            "$(awk -v s="$tm" -v n="$steps" 'BEGIN { print s * 1000 / n }')" \
            "$(median <<<"$rs") ($(sort -g <<<"$rs" | head -1)..$(sort -g <<<"$rs" | tail -1))"
    done
    unset times ratios
done
