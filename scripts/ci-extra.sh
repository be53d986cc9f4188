#!/usr/bin/env bash
# The parts of CI beyond `cargo test --workspace`; called by .ci/run after it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cuda feature: build and tests (no GPU here: the GPU tests report a skip)"
cargo build --features cuda
cargo test --features cuda
# The runtime's unit tests and the suites that reach device code with the feature on (the line
# above only builds the facade's tests with it). The other suites run host code that the
# feature does not change; building all ~75 of them a second time doubled this step's time.
cargo test -p dtensor-runtime --features cuda --lib \
  --test cuda_kernels_host --test cuda_nvrtc --test cuda_ops --test cuda_threads_prop --test cuda_bandwidth --test cuda_counters \
  --test storage_device --test buf_collectives --test background_all_reduce --test overlap_grad_reduce \
  --test redistribute_prop --test mlp_train
cargo test -p dtensor-runtime --features cuda --test cuda_gpu -- --nocapture

echo "== loom model check of the thread backend's rendezvous (own target dir: other RUSTFLAGS)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p dtensor-runtime --lib --release loom -- --nocapture
# A second full build of the dependencies: free its disk before the MPI build.
rm -rf target/loom

echo "== MPI suite under mpirun"
bash scripts/mpi-tests.sh

echo "== example: mlp_tp (small)"
cargo run --example mlp_tp -- --steps 5

echo "== example: transformer_tp (GPT-style decoder with the DSL, 2x2 vs 1 rank, collective counts)"
cargo run --example transformer_tp
cargo run --example transformer_tp -- --mesh 1x4 --layers 3 --optim sgd
cargo run --example transformer_tp -- --fsdp
cargo run --example transformer_tp -- --fsdp --mesh 4x1 --optim sgd

echo "== example: llama (HF Llama built by load_hf: transformers parity, training, KV-cache generation)"
cargo run --example llama
cargo run --example llama -- --dtype bf16
cargo run --example llama -- --model examples/llama/fixture-tied

echo "== example: llama_bench (the GPU benchmark's dtensor-rs half, tiny, on threads) and gpu-bench.sh without a GPU"
tiny="--hidden 64 --intermediate 96 --heads 4 --kv-heads 2 --layers 2 --vocab 256 --seq 16 --batch 4"
# shellcheck disable=SC2086
cargo run --example llama_bench -- $tiny --mesh 2x2 --steps 2 --warmup 1 --new-tokens 4 | tee /tmp/llama_bench.log
grep -q '^BENCH llama step | threads | 2x2 | bf16' /tmp/llama_bench.log
# every device part prints SKIP here and the script exits 0
SIZES="$tiny" BENCH_STEPS=2 bash scripts/gpu-bench.sh --bin target/debug/examples/llama_bench | tee /tmp/gpu_bench.log
grep -q 'llama_bench: SKIP: ' /tmp/gpu_bench.log

echo "== example: hf_load (Llama-shaped HF checkpoint on 2x2 vs 1 rank)"
cargo run --example hf_load
cargo run --example hf_load -- --fsdp

echo "== Hugging Face checkpoints: cross-check with Python safetensors where it is installed"
if [ -z "${DTENSOR_PYTHON:-}" ] && python3 -c "import safetensors, numpy" 2>/dev/null; then
  export DTENSOR_PYTHON=python3
fi
cargo test -p dtensor-runtime --test hf_python -- --nocapture

echo "== benches in test mode"
cargo test --benches
