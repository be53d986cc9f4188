#!/usr/bin/env python3
"""PyTorch DTensor baseline for `cargo bench --bench collectives` and `cargo bench --bench mlp_step`.

Runs the same redistributions (S(0)->R, P->R, P->S(0), S(0)->S(1) of an f32 tensor with 1024
columns on a 1-d mesh of every rank) and the same Megatron MLP training step (blocks
x + w2(gelu(w1(x))) without biases on mesh dp x tp, w1 column-parallel, w2 row-parallel, MSE
against a fixed random teacher on one fixed batch, SGD) with PyTorch
DTensor on CPU over gloo, and prints them in the same units as the Rust benches:
redistribution bandwidth as a fraction of a memcpy of the same bytes per rank, and MLP step
time per sample.

Optional dependency: without torch it prints a message and exits 0 (CI never installs torch).

    pip install torch --index-url https://download.pytorch.org/whl/cpu
    torchrun --standalone --nproc-per-node 4 scripts/bench_torch.py
    torchrun --standalone --nproc-per-node 4 scripts/bench_torch.py --sizes-mib 1,16 --dp 2 --tp 2 \
        --batch 128 --dim 256 --hidden 1024 --steps 20

The redistributions run over every rank (compare with the Rust rows of the same rank count);
the MLP defaults (2 blocks, batch 64, dim 128, hidden 512, dp x tp = world/2 x 2) match the
middle row of `cargo bench --bench mlp_step`. Each rank uses one thread, as in-process ranks do.
"""

import argparse
import os
import sys
import time

MIB = 1 << 20
COLS = 1024


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mib", default="1,16,256", help="global tensor sizes in MiB (comma-separated)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per redistribution")
    p.add_argument("--dp", type=int, default=0, help="MLP data-parallel size (default: world / tp)")
    p.add_argument("--tp", type=int, default=2, help="MLP tensor-parallel size")
    p.add_argument("--batch", type=int, default=64, help="global batch (samples per step)")
    p.add_argument("--dim", type=int, default=128, help="model width")
    p.add_argument("--hidden", type=int, default=512, help="MLP hidden width")
    p.add_argument("--layers", type=int, default=2, help="MLP blocks")
    p.add_argument("--steps", type=int, default=20, help="timed MLP steps")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-redistribute", action="store_true")
    p.add_argument("--skip-mlp", action="store_true")
    return p.parse_args()


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_torch.py: torch is not installed; skipping the PyTorch baseline "
              "(pip install torch --index-url https://download.pytorch.org/whl/cpu)")
        return 0
    if "RANK" not in os.environ:
        print("bench_torch.py: run under torchrun, e.g.\n"
              "    torchrun --standalone --nproc-per-node 4 scripts/bench_torch.py")
        return 0
    args = parse_args()
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core per rank, like the thread backend's one thread per rank
    dist.init_process_group("gloo")
    try:
        if not args.skip_redistribute:
            bench_redistribute(args)
        if not args.skip_mlp:
            bench_mlp(args)
    finally:
        dist.destroy_process_group()
    return 0


def dtensor_api():
    try:  # torch >= 2.5
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    except ImportError:  # torch 2.2 - 2.4
        from torch.distributed._tensor import DTensor, Replicate, Shard
        from torch.distributed._tensor.placement_types import _Partial as Partial
    return DTensor, Partial, Replicate, Shard


def timed(fn, iters):
    """Slowest rank's seconds per iteration of fn, between barriers."""
    import torch
    import torch.distributed as dist

    fn()  # warm-up (allocations, gloo connections)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def bench_redistribute(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    DTensor, Partial, Replicate, Shard = dtensor_api()
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("x",))
    cases = [
        ("all_gather", Shard(0), Replicate(), lambda s: s),
        ("all_reduce", Partial(), Replicate(), lambda s: s),
        ("reduce_scatter", Partial(), Shard(0), lambda s: s),
        ("all_to_all", Shard(0), Shard(1), lambda s: s // n),
    ]
    rows_out = []
    for mib in [int(x) for x in args.sizes_mib.split(",") if x]:
        s = mib * MIB
        rows = s // (COLS * 4)
        if rows % n or COLS % n:
            continue
        for name, src, dst, moved in cases:
            local_rows = rows // n if isinstance(src, Shard) else rows
            local = torch.zeros(local_rows, COLS, dtype=torch.float32)
            dt = DTensor.from_local(local, mesh, [src], run_check=False, shape=(rows, COLS),
                                    stride=(COLS, 1))
            b = moved(s) // 4
            a, c = torch.ones(b), torch.empty(b)
            t_mem = timed(lambda: c.copy_(a), args.iters)
            t_red = timed(lambda: dt.redistribute(mesh, [dst]).to_local(), args.iters)
            rows_out.append((name, n, mib, moved(s) / t_mem / 1e9, t_mem / t_red, moved(s) / t_red / 1e9))
    if dist.get_rank() == 0:
        print(f"\nPyTorch {torch.__version__} DTensor on gloo (CPU), redistribution vs memcpy of the same bytes per rank")
        print(f"{'collective':<15} {'ranks':>5} {'MiB':>7} {'memcpy GB/s':>12} {'redistribute':>13} {'redist. GB/s':>14}")
        for name, n_, mib, mem_gbs, ratio, gbs in rows_out:
            print(f"{name:<15} {n_:>5} {mib:>7} {mem_gbs:>12.2f} {ratio:>13.2f} {gbs:>14.2f}")
        for name, n_, mib, mem_gbs, ratio, gbs in rows_out:  # machine-readable, for compare_torch.sh
            print(f"torch-redist-result {name} {n_} {mib} {mem_gbs:.3f} {ratio:.3f} {gbs:.3f}")


def bench_mlp(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = dist.get_world_size()
    tp = args.tp
    dp = args.dp or world // tp
    if dp * tp != world:
        if dist.get_rank() == 0:
            print(f"MLP: dp={dp} x tp={tp} != world size {world}; skipped")
        return
    if args.batch % dp:
        if dist.get_rank() == 0:
            print(f"MLP: batch {args.batch} is not divisible by dp={dp}; skipped")
        return
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))

    class Block(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.w1 = nn.Linear(dim, hidden, bias=False)
            self.w2 = nn.Linear(hidden, dim, bias=False)

    class Mlp(nn.Module):
        """x + w2(gelu(w1(x))) per block, as examples/mlp_tp/model.rs."""

        def __init__(self, dim, hidden, layers):
            super().__init__()
            self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(layers))

        def forward(self, x):
            for b in self.blocks:
                x = x + b.w2(F.gelu(b.w1(x), approximate="tanh"))
            return x

    torch.manual_seed(args.seed)
    teacher = Mlp(args.dim, args.hidden, args.layers)
    model = Mlp(args.dim, args.hidden, args.layers)
    plan = {}
    for i in range(args.layers):
        plan[f"blocks.{i}.w1"] = ColwiseParallel()
        plan[f"blocks.{i}.w2"] = RowwiseParallel()
    model = parallelize_module(model, mesh["tp"], plan)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    dp_group = mesh.get_group("dp")
    per_dp = args.batch // dp
    dp_rank = mesh.get_local_rank("dp")
    # One fixed batch, as benches/mlp_step.rs (the data do not change the work).
    x = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(args.seed + 1))
    with torch.no_grad():
        y = teacher(x)
    xs, ys = x[dp_rank * per_dp:(dp_rank + 1) * per_dp], y[dp_rank * per_dp:(dp_rank + 1) * per_dp]
    losses = []

    def step():
        opt.zero_grad()
        loss = F.mse_loss(model(xs), ys)
        loss.backward()
        for p in model.parameters():  # data parallel: average gradients over dp
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=dp_group)
            g /= dp
        opt.step()
        losses.append(loss.item())

    t = timed(step, args.steps)
    if dist.get_rank() == 0:
        print(f"\nPyTorch MLP step on mesh dp={dp} x tp={tp}: {args.layers} blocks, batch {args.batch}, "
              f"dim {args.dim}, hidden {args.hidden}: {t * 1e3:.3f} ms/step, {t / args.batch * 1e6:.2f} us/sample; "
              f"loss {losses[0]:.5f} -> {losses[-1]:.5f}")
        print(f"torch-mlp-result {args.batch} {args.dim} {args.hidden} {dp}x{tp} {t * 1e3:.4f}")


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: with torch 2.15 a rank sometimes aborts in a
    # C++ destructor at exit ("terminate called without an active exception") after all of
    # its results were printed, which fails the torchrun job for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
