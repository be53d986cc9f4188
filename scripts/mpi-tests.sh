#!/usr/bin/env bash
# MPI test suite: builds dtensor-runtime with `--features mpi` and runs its MPI tests as
# real processes under `mpirun -np $NP` (default 4, oversubscribed: fine on 2 cores):
#   mpi_collectives   every collective vs expected values (world, mesh-dim, lazily created groups,
#                     a mesh dim split after the mesh was made, FSDP resharding to a group)
#   mpi_redistribute  distribute/redistribute (uneven, 1-d and 2x2 mesh) + deterministic property test
#   mpi_failure       a failing / panicking / stuck rank ends the job (MPI_Abort), never a hang
#                     (also one failing between an FSDP forward and its reduce-scatter, and
#                     one failing while its peers prefetch)
#   mlp_tp example    `--backend mpi` must print PASS (also with `--overlap-bucket`)
#   transformer_tp    `--backend mpi` must print PASS; so must a run saving its training state
#                     on 2x2 and one resuming it on 1x4, and FSDP runs (--fsdp on 2x2 and 4x1)
# Needs: apt-get install -y libopenmpi-dev openmpi-bin libclang-dev
# Env: NP, DTENSOR_MPI_PROPTEST_CASES (default 200), CARGO_FLAGS (extra cargo flags).
set -euo pipefail
cd "$(dirname "$0")/.."

NP=${NP:-4}
export DTENSOR_MPI_PROPTEST_CASES=${DTENSOR_MPI_PROPTEST_CASES:-200}
# Containers often forbid the cross-memory-attach syscalls OpenMPI's shared-memory transport uses.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP")

if ! command -v mpirun >/dev/null; then
  echo "mpi-tests: mpirun not found (apt-get install -y libopenmpi-dev openmpi-bin libclang-dev)" >&2
  exit 1
fi

# Path of the executable cargo builds for one test target.
test_exe() {
  cargo test -p dtensor-runtime --features mpi ${CARGO_FLAGS:-} --test "$1" --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | tail -1 | sed 's/"executable":"\(.*\)"/\1/'
}

echo "== building MPI tests"
cargo test -p dtensor-runtime --features mpi ${CARGO_FLAGS:-} --test mpi_collectives --test mpi_redistribute \
  --test mpi_failure --no-run

status=0
for suite in mpi_collectives mpi_redistribute; do
  exe=$(test_exe "$suite")
  echo "== ${MPIRUN[*]} $suite"
  if ! timeout 600 "${MPIRUN[@]}" "$exe"; then
    echo "mpi-tests: $suite FAILED" >&2
    status=1
  fi
done

# A failing rank must end the whole job quickly and say why.
exe=$(test_exe mpi_failure)
for mode in error panic hang hang-started fsdp-error fsdp-hang fsdp-prefetch-error fsdp-prefetch-hang; do
  log=$(mktemp)
  start=$(date +%s)
  set +e
  DTENSOR_MPI_FAILURE_MODE=$mode DTENSOR_TIMEOUT_MS=2000 timeout 120 "${MPIRUN[@]}" "$exe" >"$log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  case $mode in
    error|fsdp-error|fsdp-prefetch-error) want="injected failure" ;;
    panic) want="injected panic" ;;
    hang|hang-started|fsdp-hang|fsdp-prefetch-hang) want="waited more than 2000 ms" ;;
  esac
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$secs" -lt 60 ] && grep -q "$want" "$log" && grep -q "MPI_Abort\|aborting the MPI job" "$log"; then
    echo "test mpi_failure[$mode] ... ok (job aborted after ${secs} s, exit $rc)"
  else
    echo "test mpi_failure[$mode] ... FAILED (exit $rc after ${secs} s)"; cat "$log"; status=1
  fi
  rm -f "$log"
done

# Builds example $1 with MPI and runs it under mpirun with the further arguments; its own
# 1-rank check must print PASS.
run_example() {
  local name=$1 log
  shift
  echo "== ${MPIRUN[*]} $name --backend mpi $*"
  cargo build --example "$name" --features mpi ${CARGO_FLAGS:-}
  log=$(mktemp)
  if timeout 600 "${MPIRUN[@]}" "target/debug/examples/$name" --backend mpi "$@" 2>&1 | tee "$log" && grep -q PASS "$log"; then
    echo "test $name[--backend mpi $*] ... ok"
  else
    echo "test $name[--backend mpi $*] ... FAILED"; status=1
  fi
  rm -f "$log"
}
run_example mlp_tp
# The dp gradients in MPI_Iallreduce buckets of 2 gradients (32 KiB each at the defaults).
run_example mlp_tp --overlap-bucket 65536 --steps 10
run_example transformer_tp
# The training state saved by 4 processes on 2x2, resumed by 4 processes on 1x4 (each rank
# reading its byte ranges of the other layout), against 6 steps on 1 rank.
ck=$(mktemp -d)
run_example transformer_tp --steps 3 --save-state "$ck"
run_example transformer_tp --steps 3 --resume "$ck" --mesh 1x4
rm -rf "$ck"
# FSDP over dp x TP over tp, and FSDP alone, as processes.
run_example transformer_tp --fsdp
run_example transformer_tp --fsdp --mesh 4x1

[ "$status" -eq 0 ] && echo "mpi-tests: all MPI suites passed" || echo "mpi-tests: FAILURES" >&2
exit "$status"
