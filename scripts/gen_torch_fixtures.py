#!/usr/bin/env python3
"""Generates the PyTorch oracle fixtures of `dtensor-runtime/tests/torch_fixtures.rs`.

The fixtures are computed by PyTorch's own DTensor (CPU, gloo, one process per rank), not by
this project, so the Rust tests compare against an independent implementation:

* `chunk`: per (size, n, rank) the local size and offset of `Shard` (torch.chunk semantics,
  `Shard.local_shard_size_and_offset`);
* `layouts`: per (mesh, global shape, placements, rank) PyTorch's
  `compute_local_shape_and_global_offset` (nested sharding included);
* `chains`: a global tensor distributed with the first placements, then redistributed through
  the rest; per step and rank the local shard PyTorch holds. Chains start either from
  `distribute_tensor` or from `from_local` with Partial placements (per-rank values given by
  a formula), and may contain Shard -> Partial(sum), which PyTorch 2.15 supports.

Values are small integers (exact in f64 sums). Usage (PyTorch >= 2.15 with gloo):

    python3 scripts/gen_torch_fixtures.py > dtensor-runtime/tests/fixtures/torch_dtensor.json
"""
import json
import logging
import os
import random
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

MESHES = [[1], [2], [3], [4], [2, 2], [2, 3], [3, 2], [2, 2, 2]]
CASES_PER_MESH = 14


def value(i, seed):
    """Element i of a generated tensor (the Rust test uses the same formula)."""
    return float((i * 7919 + seed * 104729) % 97) - 48.0


def tensor(shape, seed):
    n = 1
    for s in shape:
        n *= s
    return torch.tensor([value(i, seed) for i in range(n)], dtype=torch.float64).reshape(shape)


def enc(p):
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    return f"P({p.reduce_op})"


def dec(s):
    if s == "R":
        return Replicate()
    if s.startswith("S("):
        return Shard(int(s[2:-1]))
    return Partial(s[2:-1])


def gen_cases(mesh_shape, rng):
    """Deterministic case list for one mesh (the same on every rank)."""
    m = len(mesh_shape)
    cases = []
    for c in range(CASES_PER_MESH):
        nd = rng.randint(1, 3)
        shape = [rng.randint(0, 7) for _ in range(nd)]
        seed = rng.randint(0, 10_000)

        def rand_list(allow_partial_sum):
            out = []
            for _ in range(m):
                r = rng.random()
                if r < 0.55:
                    out.append(f"S({rng.randrange(nd)})")
                elif r < 0.85 or not allow_partial_sum:
                    out.append("R")
                else:
                    out.append("P(sum)")
            return out

        start_partial = c % 3 == 2
        first = rand_list(False)
        if start_partial:
            # from_local with some mesh dims Partial(sum|max|min): per-rank values differ.
            op = rng.choice(["sum", "max", "min", "avg"])
            first = [f"P({op})" if rng.random() < 0.5 else p for p in first]
            if not any(p.startswith("P") for p in first):
                first[0] = f"P({op})"
        chain = [first]
        for _ in range(rng.randint(2, 4)):
            chain.append(rand_list(True))
        cases.append({"shape": shape, "seed": seed, "chain": chain, "from_local": start_partial})
    return cases


def legal_target(cur, nxt):
    """PyTorch's redistribute rules per mesh dim, so every generated step is legal there."""
    out = []
    for a, b in zip(cur, nxt):
        if b.startswith("P"):
            if a == b:
                out.append(b)
            elif a.startswith("S") and b == "P(sum)":
                out.append(b)
            else:
                out.append("R")
        else:
            out.append(b)
    # Mixed Partial reduce ops on one tensor are not meaningful: keep the first op only.
    ops = [p for p in out if p.startswith("P")]
    if ops:
        out = [p if (not p.startswith("P") or p == ops[0]) else "R" for p in out]
    return out


def worker(rank, world, mesh_shape, port, outdir):
    # PyTorch warns about every multi-step redistribution; the fixtures want the values only.
    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", tuple(mesh_shape))
    rng = random.Random(hash(tuple(mesh_shape)) & 0xFFFF)
    cases = gen_cases(mesh_shape, rng)
    layouts, chains = [], []
    for case in cases:
        shape, seed = case["shape"], case["seed"]
        g = tensor(shape, seed)
        first = [dec(p) for p in case["chain"][0]]
        if case["from_local"]:
            # Each rank's local tensor: the shard of the global tensor for the non-Partial
            # dims plus a variation that depends only on the coordinates along the Partial
            # mesh dims (replicas along a Replicate dim must hold equal values); the expected
            # full tensor is what PyTorch reduces it to.
            nonpartial = [Replicate() if isinstance(p, Partial) else p for p in first]
            base = distribute_tensor(g, mesh, nonpartial).to_local()
            coord = mesh.get_coordinate()
            var = sum(coord[i] * (i + 1) for i, p in enumerate(first) if isinstance(p, Partial)) - 1
            local = base + float(var)
            dt = DTensor.from_local(local, mesh, first, shape=g.shape, stride=g.stride())
        else:
            dt = distribute_tensor(g, mesh, first)
        steps = [{"placements": [enc(p) for p in dt.placements], "local": dt.to_local().flatten().tolist(),
                  "local_shape": list(dt.to_local().shape)}]
        cur = [enc(p) for p in dt.placements]
        for nxt in case["chain"][1:]:
            tgt = legal_target(cur, nxt)
            dt = dt.redistribute(mesh, [dec(p) for p in tgt])
            cur = [enc(p) for p in dt.placements]
            steps.append({"placements": cur, "local": dt.to_local().flatten().tolist(),
                          "local_shape": list(dt.to_local().shape)})
        full = dt.full_tensor().flatten().tolist()
        chains.append({"shape": shape, "seed": seed, "from_local": case["from_local"], "steps": steps, "full": full})
        # Layout table for this shape: every placement list of the chain (non-Partial part).
        for pl in case["chain"]:
            pls = [Replicate() if p.startswith("P") else dec(p) for p in pl]
            ls, off = compute_local_shape_and_global_offset(list(shape), mesh, pls)
            layouts.append({"shape": shape, "placements": [enc(p) for p in pls], "local_shape": list(ls),
                            "offset": list(off)})
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"layouts": layouts, "chains": chains}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = {"torch_version": torch.__version__, "value_formula": "((i*7919 + seed*104729) % 97) - 48",
           "chunk": [], "meshes": []}
    for size in range(0, 18):
        for n in range(1, 9):
            for r in range(n):
                sz, off = Shard.local_shard_size_and_offset(size, n, r)
                out["chunk"].append([size, n, r, int(sz), int(off)])
    port = 29600
    for mesh_shape in MESHES:
        world = 1
        for s in mesh_shape:
            world *= s
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(worker, args=(world, mesh_shape, port, d), nprocs=world)
            port += 1
            per_rank = []
            for r in range(world):
                with open(os.path.join(d, f"rank{r}.json")) as f:
                    per_rank.append(json.load(f))
        # Merge: case-major, ranks inside.
        chains = []
        for i, c in enumerate(per_rank[0]["chains"]):
            steps = []
            for k, s in enumerate(c["steps"]):
                steps.append({"placements": s["placements"],
                              "ranks": [{"shape": pr["chains"][i]["steps"][k]["local_shape"],
                                         "data": pr["chains"][i]["steps"][k]["local"]} for pr in per_rank]})
            chains.append({"shape": c["shape"], "seed": c["seed"], "from_local": c["from_local"],
                           "steps": steps, "full": c["full"]})
        layouts = []
        for i, l in enumerate(per_rank[0]["layouts"]):
            layouts.append({"shape": l["shape"], "placements": l["placements"],
                            "ranks": [[pr["layouts"][i]["local_shape"], pr["layouts"][i]["offset"]] for pr in per_rank]})
        out["meshes"].append({"mesh": mesh_shape, "layouts": layouts, "chains": chains})
        print(f"mesh {mesh_shape}: {len(chains)} chains", file=sys.stderr)
    json.dump(out, sys.stdout, separators=(",", ":"))
    print()


if __name__ == "__main__":
    main()
