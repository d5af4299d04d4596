#!/usr/bin/env python3
"""The GPU scripts' training corpus: random token ids as a Megatron .bin/.idx pair (megatron-core's own writer).

The GPU runs (scripts/device-gpu.sh train, device-mem1.sh, device-mp2.sh, device-dp2.sh) time the trainer and
compare its layouts; they need tokens, not text. The files sit in the repository root's .gpudata/ (untracked: copy it to
the GPU machine with the scripts). Usage: .venv/bin/python scripts/dev/make_gpudata.py [--out .gpudata/corpus_text_document]
"""
import argparse
import os

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".gpudata/corpus_text_document", help="output prefix (.bin and .idx)")
    parser.add_argument("--documents", type=int, default=1500, help="documents of 500-3499 tokens each")
    parser.add_argument("--vocab", type=int, default=50000, help="ids are drawn below this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    rng = np.random.default_rng(args.seed)
    builder = IndexedDatasetBuilder(args.out + ".bin", dtype=np.uint16 if args.vocab < 65500 else np.int32)
    for _ in range(args.documents):
        n = int(rng.integers(500, 3500))
        builder.add_document(torch.from_numpy(rng.integers(0, args.vocab, n).astype(np.int64)), [n])
    builder.finalize(args.out + ".idx")
    print(f"{args.out}: {args.documents} documents")


if __name__ == "__main__":
    main()
