"""A small English corpus for the CPU interop tests that train with dlm-train: documents of four facts
from a list of ten, tokenized with the MegaDLMs GPT-NeoX tokenizer (ids up to 50288), each ending with
eos, written by megatron-core's IndexedDatasetBuilder. Skips (77) when megatron-core is missing."""
import os
import sys

import numpy as np

try:
    import logging

    logging.disable(logging.WARNING)
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
except ImportError as e:
    print(f"skipped: megatron-core is not importable ({e})")
    sys.exit(77)

TOKENIZER = "/work/shared/assets/gptneox-dlm"
FACTS = ["The capital of France is Paris.", "The capital of Italy is Rome.", "Water boils at one hundred degrees.",
         "Water freezes at zero degrees.", "The largest planet of the solar system is called Jupiter.",
         "The smallest planet of the solar system is called Mercury.", "The sun rises in the east.",
         "Cats and dogs are animals.", "The capital of Spain is Madrid.", "Ice is frozen water."]


def make_corpus(w, tok, docs=400):
    """Writes w/facts_text_document.{bin,idx}; returns the prefix."""
    rng = np.random.default_rng(3)
    prefix = os.path.join(w, "facts_text_document")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(docs):
        text = " ".join(FACTS[i] for i in rng.integers(0, len(FACTS), 4))
        ids = tok(text)["input_ids"] + [tok.eos_token_id]
        b.add_document(np.array(ids, dtype=np.int64), [len(ids)])
    b.finalize(prefix + ".idx")
    return prefix
