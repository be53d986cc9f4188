"""PyTorch FSDP2 side of scripts/compare_fsdp.sh: the transformer_tp GPT (f64, AdamW) with
fully_shard on each block and the root, over `--dp` gloo processes (torchrun), on the CPU.

Prints one `torch-fsdp-result <config> <dp> <ms/step> <peak bytes>` line from rank 0: the
median step time of the slowest rank, and the largest per-rank growth of the peak resident set
(VmHWM, reset through /proc/self/clear_refs after a first, unmeasured run) while the model is
built and trained.
"""
import argparse
import gc
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

# name: vocab, width, heads, seq, batch, layers (as benches/fsdp_step.rs)
CONFIGS = {
    "compute": (512, 256, 8, 64, 8, 4),
    "params": (512, 512, 8, 8, 4, 4),
    "tiny": (32, 16, 4, 8, 4, 2),
}


def uniform(rows, cols, fan_in):
    bound = 1.0 / fan_in**0.5
    return nn.Parameter((torch.rand(rows, cols, dtype=torch.float64) * 2 - 1) * bound)


class Block(nn.Module):
    def __init__(self, w, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(w, dtype=torch.float64)
        self.wq, self.wk, self.wv, self.wo = (uniform(w, w, w) for _ in range(4))
        self.ln2 = nn.LayerNorm(w, dtype=torch.float64)
        self.w1 = uniform(w, 4 * w, w)
        self.w2 = uniform(4 * w, w, 4 * w)

    def forward(self, x):
        b, t, w = x.shape
        h = self.ln1(x)

        def heads(m):
            return (h @ m).view(b, t, self.heads, w // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(self.wq), heads(self.wk), heads(self.wv), is_causal=True)
        x = x + a.transpose(1, 2).reshape(b, t, w) @ self.wo
        return x + F.gelu(self.ln2(x) @ self.w1) @ self.w2


class Gpt(nn.Module):
    def __init__(self, vocab, w, heads, layers):
        super().__init__()
        self.wte = uniform(vocab, w, 1)
        self.blocks = nn.ModuleList(Block(w, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(w, dtype=torch.float64)
        self.head = uniform(w, vocab, w)

    def forward(self, ids):
        x = F.embedding(ids, self.wte)
        for b in self.blocks:
            x = b(x)
        return self.lnf(x) @ self.head


def rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="compute", choices=sorted(CONFIGS))
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    dist.init_process_group("gloo")
    dp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",))
    vocab, w, heads, seq, batch, layers = CONFIGS[a.config]
    if batch % dp:
        raise SystemExit(f"batch {batch} is not a multiple of dp {dp}")
    torch.manual_seed(0)
    # data: the rule t[i+1] = (5 t[i] + 3) mod vocab from random starts, this rank's sequences
    starts = torch.randint(0, vocab, (batch,))
    tok = torch.empty(batch, seq + 1, dtype=torch.long)
    tok[:, 0] = starts
    for i in range(seq):
        tok[:, i + 1] = (5 * tok[:, i] + 3) % vocab
    local = slice(dist.get_rank() * batch // dp, (dist.get_rank() + 1) * batch // dp)
    ids, targets = tok[local, :seq], tok[local, 1:]

    def train(steps, config):
        vocab, w, heads, seq, batch, layers = config
        model = Gpt(vocab, w, heads, layers)
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times = []
        for _ in range(steps + 1):  # the first step allocates AdamW's state
            start = time.perf_counter()
            opt.zero_grad()
            logits = model(ids % vocab)
            loss = F.cross_entropy(logits.reshape(-1, vocab), (targets % vocab).reshape(-1))
            loss.backward()
            opt.step()
            t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(t.item())
        return times

    # A first run of the tiny model loads what PyTorch loads once (kernels, gloo buffers,
    # thread pools) without leaving freed model-sized blocks for the measured run to reuse, so
    # the measured growth is the training's own, as the Rust side counts its heap.
    tiny = CONFIGS["tiny"]
    train(1, tiny)
    gc.collect()
    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = rss_bytes("VmRSS")
    times = train(a.steps, CONFIGS[a.config])
    peak = torch.tensor([rss_bytes("VmHWM") - base], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        ms = statistics.median(times[1:]) * 1e3
        print(f"torch-fsdp-result {a.config} {dp} {ms:.3f} {int(peak.item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
