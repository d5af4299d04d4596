"""dlm's --mock-data beside megatron-core's MockGPTDataset (BlendedMegatronDatasetBuilder with no blend).

MockGPTLowLevelDataset's document lengths (numpy's default_rng(0)) must be equal, each split's length, and its first
64 and last 8 samples, token for token, for a few seeds, sequence lengths, vocabularies and split sizes.
argv: mock_tool"""
import json
import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run  # noqa: E402

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
np, gpt_dataset, builder, null_tokenizer = require(
    "numpy", "megatron.core.datasets.gpt_dataset", "megatron.core.datasets.blended_megatron_dataset_builder",
    "megatron.core.tokenizers.text.libraries.null_tokenizer")
GPTDatasetConfig, MockGPTDataset = gpt_dataset.GPTDatasetConfig, gpt_dataset.MockGPTDataset
BlendedMegatronDatasetBuilder, NullTokenizer = builder.BlendedMegatronDatasetBuilder, null_tokenizer.NullTokenizer

tool = sys.argv[1]
c = Checks()
# (seed, seq, vocab, train, valid, test); more than one epoch of a split (68M tokens) is the GPTDataset index that
# interop_blend checks; here the lengths, the tokens and the splits' indices.
CASES = [(1234, 128, 1000, 64, 16, 8), (7, 64, 50, 40, 0, 24), (99, 4096, 32000, 24, 8, 40)]
for seed, seq, vocab, *sizes in CASES:
    tok = NullTokenizer(vocab)
    cfg = GPTDatasetConfig(random_seed=seed, sequence_length=seq, blend=None, blend_per_split=None, split=None,
                           tokenizer=tok, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                           create_attention_mask=False)
    theirs = BlendedMegatronDatasetBuilder(MockGPTDataset, sizes, lambda: True, cfg).build()
    ours = json.loads(run([tool, str(seed), str(seq), str(tok.vocab_size), str(tok.eod)] + [str(s) for s in sizes]).stdout)
    if seed == CASES[0][0]:
        lengths = gpt_dataset.MockGPTLowLevelDataset(tok).sequence_lengths
        c.check(ours["lengths"] == lengths.tolist(), "MockGPTLowLevelDataset's document lengths differ")
    for name, ds, size, mine in zip(("train", "valid", "test"), theirs, ours["sizes"], ours["splits"]):
        n = len(ds) if ds is not None else 0
        c.check(n == size, f"seed {seed} seq {seq} {name}: {size} samples, megatron-core {n}")
        # The tool prints the first 64 and the last 8 samples (every sample of a split of at most 72).
        indices = list(range(n)) if n <= 72 else list(range(64)) + list(range(n - 8, n))
        c.check(len(indices) == len(mine), f"seed {seed} seq {seq} {name}: {len(mine)} samples printed")
        bad = []
        for i, got in zip(indices, mine):
            item = ds[i]
            if item["tokens"].tolist() + item["labels"].tolist()[-1:] != got:
                bad.append(i)
        c.check(not bad, f"seed {seed} seq {seq} {name}: samples {bad[:5]} differ")
    print(f"seed {seed} seq {seq} sizes {sizes}: {ours['sizes']} samples, {sum(map(len, ours['splits']))} compared")
c.finish()
