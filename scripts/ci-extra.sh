#!/usr/bin/env bash
# The parts of CI beyond `cargo test --workspace`; called by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
