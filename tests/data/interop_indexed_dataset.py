"""Interop: libdata's .bin/.idx against megatron-core's IndexedDataset, in both directions.

Both dtypes (uint16, int32), documents of one sequence and of several (sentence level), empty sequences.
argv: indexed_dataset_tool dlm-preprocess"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", "."), "tests", "interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

numpy, torch = require("numpy", "torch")
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder  # noqa: E402

tool, preprocess = sys.argv[1], sys.argv[2]
checks = Checks()
rng = random.Random(1234)
work = workdir("indexed")


def random_documents(vocab, sentence_level):
    docs = []
    for _ in range(300):
        n_seq = rng.randint(1, 5) if sentence_level else 1
        docs.append([[rng.randrange(vocab) for _ in range(rng.choice([0, 1, 7, 100, 1000]))] for _ in range(n_seq)])
    return docs


def megatron_reads(prefix, docs, dtype):
    ds = IndexedDataset(prefix)
    flat = [seq for doc in docs for seq in doc]
    checks.check(ds.index.dtype == dtype, f"{prefix}: dtype {ds.index.dtype} != {dtype}")
    checks.check(len(ds) == len(flat), f"{prefix}: {len(ds)} sequences != {len(flat)}")
    checks.check(all(ds[i].tolist() == flat[i] for i in range(len(flat))), f"{prefix}: sequences differ")
    expected_docs = [0]
    for doc in docs:
        expected_docs.append(expected_docs[-1] + len(doc))
    checks.check(ds.document_indices.tolist() == expected_docs, f"{prefix}: document indices differ")
    # Slices through Megatron's get(idx, offset, length).
    for i in range(0, len(flat), 37):
        if len(flat[i]) > 3:
            checks.check(ds.get(i, 1, 2).tolist() == flat[i][1:3], f"{prefix}: slice of {i} differs")


for dtype, code, vocab in [(numpy.uint16, 8, 50304), (numpy.int32, 4, 151936)]:
    for sentence_level in (False, True):
        docs = random_documents(vocab, sentence_level)
        tag = f"{numpy.dtype(dtype).name}_{'sentence' if sentence_level else 'document'}"

        # libdata writes, megatron-core reads.
        ours = os.path.join(work, f"ours_{tag}")
        run([tool, "write", ours, code], input="\n".join(json.dumps(d) for d in docs) + "\n")
        megatron_reads(ours, docs, dtype)

        # megatron-core writes, libdata reads; and the bytes are identical.
        theirs = os.path.join(work, f"theirs_{tag}")
        builder = IndexedDatasetBuilder(theirs + ".bin", dtype=dtype)
        for doc in docs:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
        builder.finalize(theirs + ".idx")
        dumped = json.loads(run([tool, "dump", theirs]).stdout)
        checks.check(dumped["dtype"] == code, f"{tag}: libdata read dtype {dumped['dtype']}")
        checks.check(dumped["sequences"] == [s for d in docs for s in d], f"{tag}: libdata read other sequences")
        for ext in (".bin", ".idx"):
            with open(ours + ext, "rb") as a, open(theirs + ext, "rb") as b:
                checks.check(a.read() == b.read(), f"{tag}: {ext} bytes differ from megatron-core's")

        # Merge: dlm-preprocess merge equals megatron-core's add_index.
        merged_ours = os.path.join(work, f"merged_ours_{tag}")
        run([preprocess, "merge", "--input", ours, theirs, "--output-prefix", merged_ours])
        merged_theirs = os.path.join(work, f"merged_theirs_{tag}")
        builder = IndexedDatasetBuilder(merged_theirs + ".bin", dtype=dtype)
        builder.add_index(ours)
        builder.add_index(theirs)
        builder.finalize(merged_theirs + ".idx")
        for ext in (".bin", ".idx"):
            with open(merged_ours + ext, "rb") as a, open(merged_theirs + ext, "rb") as b:
                checks.check(a.read() == b.read(), f"{tag}: merged {ext} differs from megatron-core's add_index")
        megatron_reads(merged_ours, docs + docs, dtype)

# A corrupt dataset: dlm-preprocess validate fails with one line naming the file.
bad = os.path.join(work, "ours_uint16_document")
with open(bad + ".bin", "r+b") as f:
    f.truncate(10)
p = run([preprocess, "validate", bad], check=False)
checks.check(p.returncode == 1, f"validate of a truncated .bin exited {p.returncode}")
checks.check(p.stderr.count("\n") == 1 and bad + ".bin: shorter than the index says" in p.stderr,
             f"validate message: {p.stderr!r}")
checks.finish()
