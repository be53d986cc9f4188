#!/usr/bin/env python3
"""Generates the transformers fixture of `examples/llama` (and its test).

Builds a tiny random Llama (grouped-query attention: 4 query heads over 2 key/value heads,
RoPE, SwiGLU, RMSNorm, untied LM head) in float32, writes it with `save_pretrained` to
`examples/llama/fixture/` (config.json + model.safetensors), and records in
`examples/llama/fixture/expected.json` what transformers computes on it:

* `input_ids` [2, 7] and `labels` (the ids with -100 at a few positions; transformers shifts
  them: the loss is the mean cross-entropy of logits[:, :-1] against labels[:, 1:] over the
  positions that are not -100);
* the logits [2, 7, vocab], the loss, and the gradients of a few weights after
  `loss.backward()`;
* greedy generation (`generate(do_sample=False)`, KV cache) of 10 new tokens from the first 5
  ids of each row, and the smallest gap between the two largest logits over those steps (a
  gap near 0 would make the argmax fragile: the weights are drawn large enough to avoid it).

A second fixture, `examples/llama/fixture-tied/`, is a Llama 3.2-style variant: the LM head
tied to the token table (no `lm_head.weight` in the file) and Llama 3's rotary scaling
(`rope_type` `llama3`).

Usage (torch and transformers from the package registry; not run in CI):

    python3 scripts/gen_llama_fixture.py
"""
import json
import os

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.join(os.path.dirname(__file__), "..", "examples", "llama")
GRADS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.1.input_layernorm.weight",
    "model.norm.weight",
    "lm_head.weight",
]


def flat(t):
    return {"shape": list(t.shape), "data": [float(v) for v in t.detach().reshape(-1).tolist()]}


def write(out, tied):
    torch.manual_seed(0 if not tied else 1)
    rope = (
        {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        if tied
        else {"rope_type": "default", "rope_theta": 10000.0}
    )
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_parameters=rope,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)

    input_ids = torch.randint(0, config.vocab_size, (2, 7))
    labels = input_ids.clone()
    labels[0, 3] = -100
    labels[1, 1] = -100
    labels[1, 5] = -100
    res = model(input_ids=input_ids, labels=labels)
    res.loss.backward()
    params = dict(model.named_parameters())
    grads = {n: flat(params[n].grad) for n in GRADS if n in params}

    model.zero_grad()
    prompt = input_ids[:, :5]
    with torch.no_grad():
        gen = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=10,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    gaps = []
    for step in gen.logits:
        top = torch.topk(step, 2, dim=-1).values
        gaps.append(float((top[:, 0] - top[:, 1]).min()))
    expected = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "input_ids": input_ids.tolist(),
        "labels": labels.tolist(),
        "logits": flat(res.logits),
        "loss": float(res.loss),
        "grads": grads,
        "prompt_len": prompt.shape[1],
        "generated": gen.sequences.tolist(),
        "min_top2_gap": min(gaps),
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"{out}: loss {float(res.loss):.6f}, generated {gen.sequences.tolist()}, min top-2 gap {min(gaps):.4f}")


def main():
    write(os.path.join(HERE, "fixture"), tied=False)
    write(os.path.join(HERE, "fixture-tied"), tied=True)


if __name__ == "__main__":
    main()
