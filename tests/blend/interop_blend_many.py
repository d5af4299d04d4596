"""A blend of many datasets (default 10,000): dlm-blend build beside megatron-core's
BlendedMegatronDatasetBuilder on the same prefixes and weights; every cache file (each GPTDataset's
indices and descriptions, the BlendedDataset's dataset_index and dataset_sample_index) must have the
same name and bytes. Prints both builders' seconds and peak RSS.

    interop_blend_many.py [COUNT]     (DLM_BUILD_DIR names the build folder holding tools/dlm-blend)
"""
import logging
import os
import resource
import shutil
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
np, builder, gpt, indexed, utils, null = require(
    "numpy", "megatron.core.datasets.blended_megatron_dataset_builder", "megatron.core.datasets.gpt_dataset",
    "megatron.core.datasets.indexed_dataset", "megatron.core.datasets.utils",
    "megatron.core.tokenizers.text.libraries.null_tokenizer")

TOOL = os.path.join(os.environ.get("DLM_BUILD_DIR", "build"), "tools/dlm-blend/dlm-blend")
COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
SAMPLES = COUNT * 8
SEQ = 64
c = Checks()
root = workdir("blend_many")
import torch.distributed  # noqa: E402

torch.distributed.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=0, world_size=1)

# The datasets resources_test.cpp makes: 8 documents of 50..300 ids, weights 1..5 in turn.
t0 = time.time()
words = []
for d in range(COUNT):
    prefix = os.path.join(root, f"ds{d:05}")
    b = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in range(8):
        n = 50 + (d * 37 + doc * 101) % 251
        b.add_document(np.array([(d * 7 + doc * 13 + i) % 1000 for i in range(n)], dtype=np.int64), [n])
    b.finalize(prefix + ".idx")
    words += [str(1 + d % 5), prefix]
print(f"{COUNT} datasets written in {time.time() - t0:.1f} s")

dm, dd = os.path.join(root, "megatron"), os.path.join(root, "dlm")
t0 = time.time()
cfg = gpt.GPTDatasetConfig(random_seed=1234, sequence_length=SEQ, blend=utils.get_blend_from_list(words), split="1,0,0",
                       path_to_cache=dm, tokenizer=null.NullTokenizer(1000), reset_position_ids=False,
                       reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
builder.BlendedMegatronDatasetBuilder(gpt.GPTDataset, [SAMPLES, 0, 0], lambda: True, cfg).build()
megatron_s = time.time() - t0
megatron_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

t0 = time.time()
# /usr/bin/time measures the tool alone (a forked child's ru_maxrss would count this Python process).
p = run(["/usr/bin/time", "-f", "%M", TOOL, "build", "--split", "1,0,0", "--seq-length", SEQ, "--train-samples", SAMPLES, "--global-batch-size", 1,
     "--eval-iters", 0, "--data-cache-path", dd, "--data-path", *words])
dlm_s = time.time() - t0
dlm_rss = int(p.stderr.strip().splitlines()[-1]) / 1024
print(f"megatron-core: {megatron_s:.1f} s, peak RSS {megatron_rss:.0f} MiB (the Python process, datasets included)")
print(f"dlm-blend:     {dlm_s:.1f} s, peak RSS {dlm_rss:.0f} MiB")

fm = sorted(f for f in os.listdir(dm) if f.endswith((".npy", ".txt")))
fd = sorted(f for f in os.listdir(dd) if f.endswith((".npy", ".txt")))
c.check(fm == fd and len(fm) == 4 * COUNT + 3, f"cache file names differ: megatron {len(fm)}, dlm {len(fd)}")
for f in sorted(set(fm) & set(fd)):
    with open(os.path.join(dm, f), "rb") as x, open(os.path.join(dd, f), "rb") as y:
        c.check(x.read() == y.read(), f"{f}: bytes differ")
print(f"compared {len(set(fm) & set(fd))} cache files")
torch.distributed.destroy_process_group()
shutil.rmtree(root, ignore_errors=True)
c.finish()
