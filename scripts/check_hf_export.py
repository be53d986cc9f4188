#!/usr/bin/env python3
"""transformers' logits on weights dtensor-rs exported, against dtensor-rs's own.

    cargo run --example transformer_tp -- --export-hf /tmp/gpt2   # trains on 2x2, exports
    python3 scripts/check_hf_export.py /tmp/gpt2

Needs torch and transformers (pip install torch transformers); not run in CI. Loads the
directory with `GPT2LMHeadModel.from_pretrained` (the sharded files through their index),
runs it in f64 on the ids in `dtensor_logits.json` and compares with the logits dtensor-rs
computed on its mesh. Prints the largest differences and PASS or FAIL (exit status 0 or 1).
"""
import json
import sys

import torch
from transformers import GPT2LMHeadModel

TOL = 1e-10  # relative to the largest logit; f64 throughout, so only rounding differs


def main(path):
    ref = json.load(open(f"{path}/dtensor_logits.json"))
    ids = torch.tensor(ref["ids"]["data"], dtype=torch.long).reshape(ref["ids"]["shape"])
    ours = torch.tensor(ref["logits"]["data"], dtype=torch.float64).reshape(ref["logits"]["shape"])
    model = GPT2LMHeadModel.from_pretrained(path, torch_dtype=torch.float64, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
    diff = (theirs - ours).abs().max().item()
    scale = ours.abs().max().item()
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}")
    print(f"logits {list(ours.shape)}: max |transformers - dtensor-rs| = {diff:.3e}, "
          f"relative to max |logit| {scale:.3e}: {diff / scale:.3e} (tolerance {TOL:.0e})")
    ok = diff <= TOL * scale
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpt2"))
