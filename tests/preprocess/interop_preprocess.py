"""Interop: dlm-preprocess writes the same .bin/.idx bytes as Megatron's preprocess_data.py rules run
with the real libraries (tokenizers + megatron-core's IndexedDatasetBuilder), on ~5 MB of real text.

Every combination of 1, 2, 8 workers x plain / .zst x one / two json keys; --partitions 3 (Megatron's
round-robin order); no --append-eod; --split-sentences on pre-split arrays; stdin, folder and glob
inputs; then validate and inspect on the output. argv: dlm-preprocess"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", "."), "tests", "interop"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

require("numpy", "tokenizers", "zstandard", "megatron.core")
import corpus  # noqa: E402

tool = sys.argv[1]
checks = Checks()
work = workdir("preprocess")
if not os.path.exists(os.path.join(corpus.GPTNEOX, "tokenizer.json")):
    print("skipped: no GPT-NeoX tokenizer assets")
    sys.exit(77)
TOK = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", corpus.GPTNEOX]

jsonl = os.path.join(work, "corpus.jsonl")
lines = corpus.write_jsonl(jsonl, 5e6, seed=1)
zst = jsonl + ".zst"
corpus.compress_zst(jsonl, zst)
ref = corpus.Reference()
ref.run(jsonl, os.path.join(work, "ref"), ["text", "title"], append_eod=True)


def preprocess(inputs, prefix, keys, workers, *extra, stdin=None):
    cmd = [tool, "--input", *inputs, "--output-prefix", prefix, "--json-keys", *keys, "--workers", workers, *TOK,
           "--log-interval", 500, *extra]
    return run(cmd, stdin=stdin)


for workers in (1, 2, 8):
    for source, name in ((jsonl, "plain"), (zst, "zst")):
        for keys in (["text"], ["text", "title"]):
            prefix = os.path.join(work, f"dlm_{workers}_{name}_{len(keys)}")
            p = preprocess([source], prefix, keys, workers, "--append-eod")
            checks.check(f"{lines} documents" in p.stderr, f"summary names {lines} documents: {p.stderr[-300:]}")
            for key in keys:
                same = corpus.same_files(f"{prefix}_{key}_document", os.path.join(work, f"ref_{key}_document"))
                checks.check(same is True, f"{workers} workers, {name}, keys {keys}, {key}: {same}")

# --partitions 3: Megatron deals lines round-robin, then concatenates the partitions.
ref.run(jsonl, os.path.join(work, "refp"), ["text"], append_eod=True, partitions=3)
preprocess([jsonl], os.path.join(work, "part"), ["text"], 2, "--append-eod", "--partitions", 3)
same = corpus.same_files(os.path.join(work, "part_text_document"), os.path.join(work, "refp_text_document"))
checks.check(same is True, f"--partitions 3: {same}")
leftovers = [f for f in os.listdir(work) if f.startswith("part_") and not f.startswith("part_text_document")]
checks.check(leftovers == [], f"partition datasets left behind: {leftovers}")

# Without --append-eod.
ref.run(jsonl, os.path.join(work, "refnoeod"), ["title"], append_eod=False)
preprocess([zst], os.path.join(work, "noeod"), ["title"], 2)
same = corpus.same_files(os.path.join(work, "noeod_title_document"), os.path.join(work, "refnoeod_title_document"))
checks.check(same is True, f"no --append-eod: {same}")

# Pre-split sentences with --split-sentences: arrays of strings, outputs named _sentence.
split = os.path.join(work, "split.jsonl")
with open(jsonl, encoding="utf-8") as src, open(split, "w", encoding="utf-8") as dst:
    import json
    for line in src:
        d = json.loads(line)
        dst.write(json.dumps({"text": d["text"].split("\n\n")}, ensure_ascii=False) + "\n")
ref.run(split, os.path.join(work, "refss"), ["text"], append_eod=True, level="sentence")
preprocess([split], os.path.join(work, "ss"), ["text"], 2, "--append-eod", "--split-sentences")
same = corpus.same_files(os.path.join(work, "ss_text_sentence"), os.path.join(work, "refss_text_sentence"))
checks.check(same is True, f"--split-sentences on arrays: {same}")

# stdin, a folder of two files, and a glob: files in name order, one after the other.
with open(jsonl, "rb") as f:
    preprocess(["-"], os.path.join(work, "stdin"), ["text"], 2, "--append-eod", stdin=f)
same = corpus.same_files(os.path.join(work, "stdin_text_document"), os.path.join(work, "ref_text_document"))
checks.check(same is True, f"stdin: {same}")
folder = os.path.join(work, "folder")
os.mkdir(folder)
with open(jsonl, encoding="utf-8") as f:
    all_lines = f.readlines()
half = len(all_lines) // 2
with open(os.path.join(folder, "a.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(all_lines[:half])
with open(os.path.join(folder, "b.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(all_lines[half:])
corpus.compress_zst(os.path.join(folder, "b.jsonl"), os.path.join(folder, "b.jsonl.zst"))
os.remove(os.path.join(folder, "b.jsonl"))
for inputs, name in (([folder], "folder"), ([os.path.join(folder, "*.js*")], "glob")):
    preprocess(inputs, os.path.join(work, name), ["text"], 8, "--append-eod")
    same = corpus.same_files(os.path.join(work, f"{name}_text_document"), os.path.join(work, "ref_text_document"))
    checks.check(same is True, f"{name} input: {same}")

# validate and inspect on the output.
out = os.path.join(work, "dlm_2_zst_2_text_document")
v = run([tool, "validate", out])
checks.check(f"{lines} documents" in v.stdout, f"validate: {v.stdout}")
i = run([tool, "inspect", out, "--documents", 1, *TOK])
checks.check(f"{lines} documents" in i.stdout and "most frequent ids" in i.stdout, f"inspect: {i.stdout[:500]}")
first_text = next(t for t, _ in corpus.documents(1e9, seed=1))
checks.check(first_text[:200] in i.stdout, "inspect prints the first document detokenized")

shutil.rmtree(work)
checks.finish()
