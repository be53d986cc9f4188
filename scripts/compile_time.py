#!/usr/bin/env python3
"""Compile time of the typed layer against the same model in dynamic ops (issue 31, item 5).

Writes a throw-away crate (outside the workspace, depending on `dtensor` by path) with four
binaries: a Megatron MLP forward unrolled over N blocks, once with `#[distribute]` typed ops and
once with the same dynamic ops, for N = 6 and N = 96. Dependencies are built once; then each
binary is rebuilt alone (its source touched, incremental compilation off) with `cargo check` and
with `cargo build`, and the CPU time (user + sys of cargo and every rustc it runs) is measured. Median of `--repeat` runs.

    python3 scripts/compile_time.py                 # table on stdout
    python3 scripts/compile_time.py --blocks 6,96 --repeat 3 --target-dir target

The target directory defaults to the workspace's `target/`, so that `dtensor` is not rebuilt
when the tests have built it already (the crate's own profile is the workspace's `dev`).
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TYPED_HEAD = '''//! Compile-time probe: a {n}-block Megatron MLP forward, unrolled, in the typed layer.
use dtensor::distribute;
use dtensor::prelude::*;
use dtensor::typed::dims::{{dp, tp}};
use dtensor::typed::Dt;

#[distribute(mesh = "dp,tp")]
pub struct Block {{
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f32>,
}}

#[distribute(mesh = "dp,tp")]
pub struct Model {{
    pub blocks: Vec<Block>,
}}

type Act = Dt<f32, (dp, tp), (dtensor::Shard<0>, dtensor::Replicate), 2>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn forward(x: &DTensor<f32>, m: &Model) -> Result<DTensor<f32>> {{
    let mut x: Act = x.clone();
'''
TYPED_BLOCK = '''    let b = &m.blocks[{i}];
    let h = x.matmul(&b.w1)?.gelu()?;
    let y: Act = h.matmul(&b.w2)?.redistribute()?;
    x = x.add(&y)?;
'''
DYN_HEAD = '''//! Compile-time probe: the same {n}-block forward with dynamic ops.
use dtensor::prelude::*;

pub struct Block {{
    pub w1: DTensor<f32>,
    pub w2: DTensor<f32>,
}}

pub struct Model {{
    pub blocks: Vec<Block>,
}}

pub fn forward(x: &DTensor<f32>, m: &Model) -> Result<DTensor<f32>> {{
    let mut x = x.clone();
'''
DYN_BLOCK = '''    let b = &m.blocks[{i}];
    let h = x.matmul(&b.w1)?.gelu()?;
    let y = h.matmul(&b.w2)?.redistribute(&[Shard(0), Replicate])?;
    x = x.add(&y)?;
'''
TAIL = '''    Ok(x)
}

fn main() {
    let _ = forward;
}
'''


def write_crate(d, blocks):
    os.makedirs(os.path.join(d, "src", "bin"), exist_ok=True)
    with open(os.path.join(d, "Cargo.toml"), "w") as f:
        f.write(
            '[package]\nname = "ct-probe"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
            f'[dependencies]\ndtensor = {{ path = "{ROOT}" }}\n\n[workspace]\n'
        )
    names = []
    for n in blocks:
        for kind, head, block in [("typed", TYPED_HEAD, TYPED_BLOCK), ("dyn", DYN_HEAD, DYN_BLOCK)]:
            name = f"{kind}{n}"
            with open(os.path.join(d, "src", "bin", name + ".rs"), "w") as f:
                f.write(head.format(n=n) + "".join(block.format(i=i) for i in range(n)) + TAIL)
            names.append(name)
    return names


def cpu_seconds(cmd, cwd, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"`{' '.join(cmd)}` failed:\n{r.stderr[-4000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="6,96", help="comma-separated block counts (default 6,96)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported (default 3)")
    ap.add_argument("--target-dir", default=os.path.join(ROOT, "target"), help="cargo target directory")
    args = ap.parse_args()
    blocks = [int(b) for b in args.blocks.split(",") if b]
    # Without incremental compilation: a rebuild of an unchanged file would reuse its queries.
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.abspath(args.target_dir), CARGO_INCREMENTAL="0")
    with tempfile.TemporaryDirectory(prefix="ct-probe-") as d:
        names = write_crate(d, blocks)
        print(f"building dependencies once (target {env['CARGO_TARGET_DIR']}) ...", file=sys.stderr, flush=True)
        for mode in ["check", "build"]:
            cpu_seconds(["cargo", mode, "--bins"], d, env)
        # Typed and dynamic runs interleaved, so that a machine's drift falls on both alike.
        runs = {(mode, name): [] for mode in ["check", "build"] for name in names}
        for _ in range(args.repeat):
            for mode in ["check", "build"]:
                for name in names:
                    os.utime(os.path.join(d, "src", "bin", name + ".rs"))
                    runs[(mode, name)].append(cpu_seconds(["cargo", mode, "--bin", name], d, env))
        results = {}
        for (mode, name), rs in runs.items():
            results[(mode, name)] = statistics.median(rs)
            print(f"{mode:5} {name:8} {' '.join(f'{r:.2f}' for r in rs)} s", file=sys.stderr, flush=True)
    print("| cargo | blocks | typed CPU s | dynamic CPU s | typed ÷ dynamic |")
    print("|---|---:|---:|---:|---:|")
    for mode in ["check", "build"]:
        for n in blocks:
            t, y = results[(mode, f"typed{n}")], results[(mode, f"dyn{n}")]
            print(f"| {mode} | {n} | {t:.2f} | {y:.2f} | {t / y:.2f} |")


if __name__ == "__main__":
    main()
