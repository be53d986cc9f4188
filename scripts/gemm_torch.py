#!/usr/bin/env python3
"""PyTorch single-thread GEMM, for `cargo bench --bench gemm` (run side by side by compare_torch.sh).

Same rows and method as the Rust bench: square n x n @ n x n per size plus a batched
16 x [256 x 256] @ 16 x [256 x 256], f32 and f64, median GFLOP/s over rounds of ~0.15 s each.
Prints `gemm-result DTYPE BATCH M K N torch GFLOPS` lines. Without torch it says so and exits 0.

    python3 scripts/gemm_torch.py --sizes 256,512,1024 --rounds 5
"""

import argparse
import statistics
import time

ROUND_SECS = 0.15


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="256,512,1024")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("gemm_torch.py: torch is not installed; skipping the PyTorch GEMM baseline")
        return 0
    torch.set_num_threads(1)
    rows = [(1, s, s, s) for s in map(int, args.sizes.split(","))] + [(16, 256, 256, 256)]
    for name, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        for batch, m, k, n in rows:
            a = torch.rand(batch, m, k, dtype=dtype) - 0.5
            b = torch.rand(batch, k, n, dtype=dtype) - 0.5
            out = torch.empty(batch, m, n, dtype=dtype)
            flop = 2.0 * batch * m * k * n
            gflops = []
            for _ in range(max(args.rounds, 1)):
                torch.bmm(a, b, out=out)
                calls, t0 = 0, time.perf_counter()
                while calls == 0 or time.perf_counter() - t0 < ROUND_SECS:
                    torch.bmm(a, b, out=out)
                    calls += 1
                gflops.append(flop * calls / (time.perf_counter() - t0) / 1e9)
            print(f"gemm-result {name} {batch} {m} {k} {n} torch {statistics.median(gflops):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
