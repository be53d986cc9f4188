#!/usr/bin/env python3
"""Generates the PyTorch / transformers oracle of `dtensor-runtime/tests/torch_op_fixtures.rs`.

The ops a Hugging Face checkpoint needs, computed by the reference implementations (not by
this project), in float64 with their gradients:

* `cross_entropy`: `torch.nn.functional.cross_entropy` with `ignore_index=-100`, every
  reduction, label smoothing, 2-d and 3-d logits, every target ignored (NaN);
* `linear`: `torch.nn.functional.linear` (weights `[out, in]`), with and without bias;
* `rotary_half`: transformers' `LlamaRotaryEmbedding` + `apply_rotary_pos_emb` (the
  rotate-half form), at positions from 0 and from an offset (a KV cache's new positions),
  plain and with Llama 3's and linear frequency scaling (`rope_parameters`);
* `rotary_interleaved`: Meta's Llama reference (`precompute_freqs_cis` + `apply_rotary_emb`,
  a complex product), as published in github.com/meta-llama/llama `model.py`.

Each case holds its inputs, an upstream weight `w` (gradients are those of `sum(out * w)`),
the output and the float inputs' gradients. Usage (torch and transformers from the package
registry; not run in CI):

    python3 scripts/gen_op_fixtures.py > dtensor-runtime/tests/fixtures/torch_ops.json
"""
import json
import math

import torch
import torch.nn.functional as F
import transformers
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)


def arr(t):
    t = t.detach().to(torch.float64)
    data = [None if math.isnan(v) else v for v in t.reshape(-1).tolist()]
    return {"shape": list(t.shape), "data": data}


def case(op, inputs, out, float_inputs, opts=None):
    w = torch.randn(out.shape)
    loss = (out * w).sum()
    grads = {}
    if loss.requires_grad and not torch.isnan(loss):
        gs = torch.autograd.grad(loss, [inputs[k] for k in float_inputs])
        grads = {k: arr(g) for k, g in zip(float_inputs, gs)}
    return {
        "op": op,
        "opts": opts or {},
        "inputs": {k: arr(v) for k, v in inputs.items()},
        "w": arr(w),
        "out": arr(out),
        "grads": grads,
    }


def cross_entropy_cases():
    cases = []
    for shape in ([7, 5], [2, 3, 6]):
        classes = shape[-1]
        logits = torch.randn(shape, requires_grad=True)
        target = torch.randint(0, classes, shape[:-1])
        ignored = target.clone()
        ignored.view(-1)[::3] = -100
        for opts, t in [
            ({"ignore_index": -100, "reduction": "mean"}, ignored),
            ({"ignore_index": -100, "reduction": "sum"}, ignored),
            ({"ignore_index": -100, "reduction": "none"}, ignored),
            ({"reduction": "mean", "label_smoothing": 0.1}, target),
            ({"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.2}, ignored),
            ({"ignore_index": -100, "reduction": "sum", "label_smoothing": 0.3}, ignored),
        ]:
            kw = dict(opts)
            out = F.cross_entropy(
                logits.reshape(-1, classes),
                t.reshape(-1),
                ignore_index=kw.get("ignore_index", -100),
                reduction=kw["reduction"],
                label_smoothing=kw.get("label_smoothing", 0.0),
            )
            if kw["reduction"] == "none":
                out = out.reshape(shape[:-1])
            cases.append(case("cross_entropy", {"logits": logits, "target": t.double()}, out, ["logits"], opts))
    # Every target ignored: the mean is 0/0.
    logits = torch.randn([3, 4], requires_grad=True)
    t = torch.full([3], -100)
    out = F.cross_entropy(logits, t, ignore_index=-100)
    cases.append(
        case("cross_entropy", {"logits": logits, "target": t.double()}, out, ["logits"], {"ignore_index": -100, "reduction": "mean"})
    )
    return cases


def linear_cases():
    cases = []
    for x_shape, out_f, bias in (([2, 3, 6], 5, True), ([4, 6], 7, False), ([3, 5], 4, True)):
        x = torch.randn(x_shape, requires_grad=True)
        w = torch.randn([out_f, x_shape[-1]], requires_grad=True)
        inputs = {"x": x, "weight": w}
        if bias:
            inputs["bias"] = torch.randn([out_f], requires_grad=True)
        out = F.linear(x, w, inputs.get("bias"))
        cases.append(case("linear", inputs, out, list(inputs)))
    return cases


def rotary_half_cases():
    cases = []
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        # Small, so that the 8 frequencies of a 16-wide head fall in all three bands.
        "original_max_position_embeddings": 64,
    }
    linear = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    for heads, seq, head_dim, rope_parameters, start in (
        (2, 5, 8, {"rope_type": "default", "rope_theta": 10000.0}, 0),
        (4, 3, 6, {"rope_type": "default", "rope_theta": 500000.0}, 4),
        (2, 6, 16, llama3, 3),
        (2, 4, 8, linear, 2),
    ):
        config = LlamaConfig(
            hidden_size=heads * head_dim,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            rope_parameters=dict(rope_parameters),
            max_position_embeddings=256,
        )
        rope = LlamaRotaryEmbedding(config)
        x = torch.randn([1, heads, seq, head_dim], requires_grad=True)
        positions = torch.arange(start, start + seq).unsqueeze(0)
        cos, sin = rope(x, positions)
        out, _ = apply_rotary_pos_emb(x, x, cos.double(), sin.double())
        opts = {"rope_parameters": rope_parameters, "heads": heads, "head_dim": head_dim, "start": start}
        cases.append(case("rotary_half", {"x": x}, out, ["x"], opts))
    return cases


def precompute_freqs_cis(dim, end, theta):
    # meta-llama/llama model.py
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].double() / dim))
    t = torch.arange(end, dtype=torch.float64)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, freqs_cis):
    # meta-llama/llama model.py (xq: [bsz, seq, heads, head_dim])
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * freqs_cis).flatten(3)


def rotary_interleaved_cases():
    cases = []
    for heads, seq, head_dim, theta, start in ((2, 5, 8, 10000.0, 0), (3, 4, 4, 10000.0, 2)):
        x = torch.randn([1, heads, seq, head_dim], requires_grad=True)
        freqs = precompute_freqs_cis(head_dim, start + seq, theta)[start:]
        out = apply_rotary_emb(x.transpose(1, 2), freqs).transpose(1, 2)
        cases.append(case("rotary_interleaved", {"x": x}, out, ["x"], {"theta": theta, "start": start}))
    return cases


def main():
    cases = cross_entropy_cases() + linear_cases() + rotary_half_cases() + rotary_interleaved_cases()
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__, "cases": cases}))


if __name__ == "__main__":
    main()
