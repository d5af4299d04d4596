"""dlm-preprocess beside Megatron's tools/preprocess_data.py pattern, in one run, on the same cores.

The reference is preprocess_data.py's own structure: multiprocessing.Pool(workers) with the Encoder's
initializer building megatron-core's tokenizer (build_tokenizer, HuggingFaceTokenizer, GPT-NeoX DLM),
imap(encode, file, 32) over the lines, json.loads + tokenize + Megatron's eod rule in the workers,
IndexedDatasetBuilder.add_document in the parent. Both write the same bytes (checked). Also printed: the
single-thread tokenizer speed of dlm times the workers (the pipeline's ceiling), and dlm's peak RSS at
100 MB and at --rss-gb of input.

usage: .venv/bin/python benchmarks/preprocess/bench_preprocess.py --build build-pre [--mb 100] [--workers 2]"""
import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "preprocess"))
import corpus  # noqa: E402


class Encoder:
    """preprocess_data.py's Encoder (no sentence splitting), written against megatron-core."""

    def __init__(self, keys):
        self.keys = keys

    def initializer(self):
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
        Encoder.tokenizer = build_tokenizer(megatron_tokenizer_args())

    def encode(self, json_line):
        data = json.loads(json_line)
        ids, lens = {}, {}
        for key in self.keys:
            text = data[key]
            sentences = text if isinstance(text, list) else [text]
            doc_ids, sentence_lens = [], []
            for sentence in sentences:
                sentence_ids = Encoder.tokenizer.tokenize(sentence)
                if len(sentence_ids) > 0:
                    doc_ids.extend(sentence_ids)
                    sentence_lens.append(len(sentence_ids))
            if len(doc_ids) > 0:
                doc_ids.append(Encoder.tokenizer.eod)
                sentence_lens[-1] += 1
            ids[key], lens[key] = doc_ids, sentence_lens
        return ids, lens, len(json_line)


def megatron_tokenizer_args():
    return SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=corpus.GPTNEOX, vocab_file=None,
                           merge_file=None, tokenizer_special_tokens=None, tokenizer_hf_use_fast=True,
                           tokenizer_hf_no_use_fast=False, trust_remote_code=False,
                           tokenizer_hf_include_special_tokens=False, tokenizer_metadata=None)


def run_reference(jsonl, prefix, keys, workers):
    from megatron.core.datasets import indexed_dataset
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
    start = time.time()
    tokenizer = build_tokenizer(megatron_tokenizer_args())
    encoder = Encoder(keys)
    builders = {key: indexed_dataset.IndexedDatasetBuilder(
        f"{prefix}_{key}_document.bin", dtype=indexed_dataset.DType.optimal_dtype(tokenizer.vocab_size)) for key in keys}
    docs = 0
    with open(jsonl, "r", encoding="utf-8") as fin, multiprocessing.Pool(workers, initializer=encoder.initializer) as pool:
        for doc, lens, _ in pool.imap(encoder.encode, fin, 32):
            for key in doc:
                builders[key].add_document(doc[key], lens[key])
            docs += 1
    for key in keys:
        builders[key].finalize(f"{prefix}_{key}_document.idx")
    return time.time() - start, docs


def run_dlm(tool, jsonl, prefix, keys, workers):
    """Wall seconds and peak RSS (MB) of one dlm-preprocess run."""
    cmd = [tool, "--input", jsonl, "--output-prefix", prefix, "--json-keys", *keys, "--workers", str(workers),
           "--append-eod", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", corpus.GPTNEOX,
           "--quiet"]
    # Peak RSS through /usr/bin/time: a child forked from this Python process inherits its high-water
    # mark (torch and megatron-core are loaded here), so wait4's ru_maxrss would report ours, not dlm's.
    start = time.time()
    p = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", *cmd], stderr=subprocess.PIPE, text=True)
    seconds = time.time() - start
    if p.returncode != 0:
        sys.exit(f"dlm-preprocess failed: {p.stderr}")
    rss_kb = int(p.stderr.strip().splitlines()[-1].split("=")[1])
    return seconds, rss_kb / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rss-gb", type=float, default=1.0, help="also measure peak RSS at this input size (0: skip)")
    args = ap.parse_args()
    tool = os.path.join(args.build, "tools", "dlm-preprocess", "dlm-preprocess")
    bench = os.path.join(args.build, "benchmarks", "preprocess", "preprocess_tokenize_bench")
    work = tempfile.mkdtemp(prefix="dlm_bench_preprocess_")
    try:
        jsonl = os.path.join(work, "corpus.jsonl")
        docs = corpus.write_jsonl(jsonl, args.mb * 1e6, seed=3)
        mb = os.path.getsize(jsonl) / 1e6
        keys = ["text"]
        print(f"corpus: {docs} documents, {mb:.1f} MB of JSONL (Python stdlib + /usr/share/doc text); "
              f"{args.workers} workers on {os.cpu_count()} cores", flush=True)

        ref_s, ref_docs = run_reference(jsonl, os.path.join(work, "ref"), keys, args.workers)
        dlm_s, dlm_rss = run_dlm(tool, jsonl, os.path.join(work, "dlm"), keys, args.workers)
        same = corpus.same_files(os.path.join(work, "dlm_text_document"), os.path.join(work, "ref_text_document"))
        single = subprocess.run([bench, jsonl, corpus.GPTNEOX], capture_output=True, text=True, check=True)
        one_mbs, one_docs, _ = single.stdout.split()
        ceiling = float(one_mbs) * min(args.workers, os.cpu_count())

        print(f"\n| pipeline | MB/s | docs/s | seconds |")
        print(f"| --- | --- | --- | --- |")
        print(f"| Megatron pattern (Pool({args.workers}).imap, megatron-core tokenizer + builder) | "
              f"{mb / ref_s:.2f} | {ref_docs / ref_s:.0f} | {ref_s:.1f} |")
        print(f"| dlm-preprocess --workers {args.workers} | {mb / dlm_s:.2f} | {docs / dlm_s:.0f} | {dlm_s:.1f} |")
        print(f"\nratio dlm / Megatron pattern: {ref_s / dlm_s:.2f}x   (outputs byte-identical: {same is True})")
        print(f"dlm tokenizer alone, 1 thread: {float(one_mbs):.2f} MB/s; x {min(args.workers, os.cpu_count())} = "
              f"{ceiling:.2f} MB/s; pipeline reaches {100 * mb / dlm_s / ceiling:.0f}% of it")
        print(f"dlm peak RSS at {mb:.0f} MB: {dlm_rss:.0f} MB")
        if args.rss_gb > 0:
            big = os.path.join(work, "big.jsonl")
            with open(big, "wb") as dst:
                while dst.tell() < args.rss_gb * 1e9:
                    with open(jsonl, "rb") as src:
                        shutil.copyfileobj(src, dst)
            big_mb = os.path.getsize(big) / 1e6
            os.remove(os.path.join(work, "dlm_text_document.bin"))
            big_s, big_rss = run_dlm(tool, big, os.path.join(work, "big"), keys, args.workers)
            print(f"dlm peak RSS at {big_mb:.0f} MB: {big_rss:.0f} MB ({big_mb / big_s:.2f} MB/s)")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
