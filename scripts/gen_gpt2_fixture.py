#!/usr/bin/env python3
"""Generates the transformers fixture of `tests/gpt2_load.rs`.

A tiny random GPT-2 (`GPT2LMHeadModel`: fused `c_attn` q/k/v weight, `[in, out]` Conv1D
weights with biases, learned positions, LM head tied to the token table, tanh GELU), float32,
written with `save_pretrained` to `tests/fixtures/gpt2/` (config.json + model.safetensors), and
`expected.json`: input ids [2, 6], labels (-100 at two positions), the logits and the loss
transformers computes.

Usage (torch and transformers from the package registry; not run in CI):

    python3 scripts/gen_gpt2_fixture.py
"""
import json
import os

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gpt2")


def main():
    torch.manual_seed(1)
    config = GPT2Config(vocab_size=80, n_positions=16, n_embd=32, n_layer=2, n_head=4, layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    ids = torch.randint(0, config.vocab_size, (2, 6))
    labels = ids.clone()
    labels[0, 2] = -100
    labels[1, 4] = -100
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    expected = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "input_ids": ids.tolist(),
        "labels": labels.tolist(),
        "logits": {"shape": list(out.logits.shape), "data": out.logits.reshape(-1).tolist()},
        "loss": float(out.loss),
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"loss {float(out.loss):.6f}")


if __name__ == "__main__":
    main()
