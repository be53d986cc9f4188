#!/usr/bin/env python3
"""PyTorch eager half of the GPU benchmark (scripts/gpu-bench.sh): the Llama of
examples/llama_bench.rs (transformers' LlamaForCausalLM, random weights, the same sizes), on one
GPU, printing the same `BENCH` lines:

  BENCH llama step | pytorch eager | 1x1 | DTYPE | MS ms | T tokens/s | MFU M | device work per step
  BENCH llama generate | pytorch eager | 1x1 | DTYPE | T tokens/s (batch B, N new tokens)

A step: the causal-LM loss, its backward and an AdamW step. bf16 is PyTorch's mixed-precision
recipe (f32 weights and AdamW state, the forward and backward under torch.autocast(bf16));
dtensor-rs keeps bf16 weights with f32 masters in AdamW: the same arithmetic precision of the
update, different storage. Device work per step from torch.profiler: kernel launches
(cudaLaunchKernel and friends), host-to-device and device-to-host copies.

Without torch, transformers or a CUDA device it prints `gpu_bench_torch: SKIP: <reason>` and
exits 0.
"""
import argparse
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke test of this script on a machine without a GPU (not a benchmark)")
    a = p.parse_args()
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"gpu_bench_torch: SKIP: {e}")
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench_torch: SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    torch.manual_seed(0)
    # as scripts/gen_llama_fixture.py builds its config (transformers 5: rope_parameters)
    cfg = LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.hidden // a.heads, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False, max_position_embeddings=a.seq + a.new_tokens,
        attn_implementation="sdpa",
    )
    dev = torch.device(a.device)
    model = LlamaForCausalLM(cfg).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    bf16 = a.dtype == "bf16"
    i = torch.arange(a.batch, device=dev).unsqueeze(1)
    j = torch.arange(a.seq, device=dev).unsqueeze(0)
    ids = (i * 7919 + j * 104729 + 3) % a.vocab

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.item()  # the step's one device-to-host copy, and a synchronisation

    times = []
    for s in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        step()
        if s >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median_high(times)  # as llama_bench takes it

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step()
    device = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    # kernels as the device ran them (cuBLAS's included), copies by direction
    launches = sum(not (n.startswith("Memcpy") or n.startswith("Memset")) for n in device)
    h2d = sum("HtoD" in n for n in device)
    d2h = sum("DtoH" in n for n in device)
    d2d = sum("DtoD" in n for n in device)

    tokens_per_s = a.batch * a.seq / (ms / 1e3)
    flops_per_token = 6.0 * params + 12.0 * a.layers * a.hidden * a.seq
    mfu = f"{100.0 * flops_per_token * tokens_per_s / (a.peak_tflops * 1e12):.1f} %" if a.peak_tflops else "n/a (no --peak-tflops)"
    label = f"pytorch eager | 1x1 | {a.dtype}"
    where = torch.cuda.get_device_name(0) if cuda else "cpu (smoke test)"
    print(f"gpu_bench_torch: {params} parameters on {where}, torch {torch.__version__}", flush=True)
    print(f"BENCH llama step | {label} | {ms:.2f} ms | {tokens_per_s:.0f} tokens/s | MFU {mfu} | "
          f"{launches} kernels (cuBLAS's included), {h2d} H2D, {d2h} D2H, {d2d} D2D per step (torch.profiler)", flush=True)
    if a.new_tokens > 0:
        k = min(8, a.seq)
        prompt = (torch.arange(a.batch, device=dev).unsqueeze(1) * 31 + torch.arange(k, device=dev).unsqueeze(0) + 1) % a.vocab
        with torch.no_grad(), torch.autocast(a.device, dtype=torch.bfloat16, enabled=bf16):
            model.generate(prompt, max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
            sync()
            t0 = time.perf_counter()
            model.generate(prompt, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
                           use_cache=True, pad_token_id=0)
            sync()
        g = a.batch * a.new_tokens / (time.perf_counter() - t0)
        print(f"BENCH llama generate | {label} | {g:.1f} tokens/s (batch {a.batch}, {a.new_tokens} new tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
