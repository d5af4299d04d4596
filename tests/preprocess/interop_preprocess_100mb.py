"""Interop at scale: dlm-preprocess on 100 MB of real-text JSONL gives the same .bin/.idx bytes as the
Python reference (tokenizers + megatron-core's IndexedDatasetBuilder, Megatron's order and eod rule).

Runs (workers, input, keys): (1, plain, 2), (2, zst, 1), (8, plain, 1), (8, zst, 2); so each worker
count, each input kind and each key count meets the 100 MB corpus. DLM_PREPROCESS_FULL=1 runs all 12
combinations. Prints each run's time (peak memory: benchmarks/preprocess). argv: dlm-preprocess"""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", "."), "tests", "interop"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlm_interop import Checks, require, workdir  # noqa: E402

require("numpy", "tokenizers", "zstandard", "megatron.core")
import corpus  # noqa: E402

tool = sys.argv[1]
checks = Checks()
if not os.path.exists(os.path.join(corpus.GPTNEOX, "tokenizer.json")):
    print("skipped: no GPT-NeoX tokenizer assets")
    sys.exit(77)
work = workdir("preprocess100")
jsonl = os.path.join(work, "corpus.jsonl")
t = time.time()
lines = corpus.write_jsonl(jsonl, 100e6, seed=2)
size = os.path.getsize(jsonl)
checks.check(size >= 100e6, f"corpus is {size} bytes, expected at least 100 MB")
corpus.compress_zst(jsonl, jsonl + ".zst")
print(f"corpus: {lines} documents, {size / 1e6:.1f} MB ({time.time() - t:.1f}s)", flush=True)

t = time.time()
corpus.Reference().run(jsonl, os.path.join(work, "ref"), ["text", "title"], append_eod=True)
print(f"reference (tokenizers encode_batch + IndexedDatasetBuilder): {time.time() - t:.1f}s", flush=True)

runs = [(1, "plain", 2), (2, "zst", 1), (8, "plain", 1), (8, "zst", 2)]
if os.environ.get("DLM_PREPROCESS_FULL") == "1":
    runs = [(w, s, k) for w in (1, 2, 8) for s in ("plain", "zst") for k in (1, 2)]
for workers, source, nkeys in runs:
    keys = ["text", "title"][:nkeys]
    prefix = os.path.join(work, f"dlm_{workers}_{source}_{nkeys}")
    cmd = [tool, "--input", jsonl + (".zst" if source == "zst" else ""), "--output-prefix", prefix, "--json-keys",
           *keys, "--workers", str(workers), "--append-eod", "--tokenizer-type", "HuggingFaceTokenizer",
           "--tokenizer-model", corpus.GPTNEOX, "--log-interval", "100000"]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    checks.check(p.returncode == 0, f"{cmd} exited {p.returncode}: {p.stderr[-500:]}")
    print(f"dlm {workers} workers, {source}, {nkeys} keys: {time.time() - t:.1f}s", flush=True)
    for key in keys:
        same = corpus.same_files(f"{prefix}_{key}_document", os.path.join(work, f"ref_{key}_document"))
        checks.check(same is True, f"{workers} workers, {source}, {nkeys} keys, {key}: {same}")
    for key in keys:
        for ext in (".bin", ".idx"):
            os.remove(f"{prefix}_{key}_document{ext}")

shutil.rmtree(work)
checks.finish()
