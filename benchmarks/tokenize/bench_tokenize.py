"""dlm's tokenizers beside `tokenizers` (batch encode) and `tiktoken` (batch encode) on the same text,
in one run; prints MB/s and ratios.

usage: .venv/bin/python benchmarks/tokenize/bench_tokenize.py [--mb 20] [--build build] [--only unigram]
                                                             [--assets DIR]
Text: tests/tokenize/tok_assets.corpus (stdlib sources, /usr/share/doc, multilingual package data).
Byte-level BPE: the tekken rank file both as tiktoken (TikTokenizer) and as its converted 131k
tokenizer.json (HuggingFaceTokenizer), and gptneox-dlm's tokenizer.json. SentencePiece: mistral's
tokenizer.model.v1 beside sentencepiece's own encoder (dlm's native BPE path, and the same model forced
through Debian's libsentencepiece for reference), and unigram models (sentencepiece's own kyoto_ja 8k
test model, the 2k and 45k models trained here) beside it, one thread each (the issue-31 target: 3x). The peers use every core for their batch
calls; dlm is timed on 1 and 2 threads. Warm word caches on both sides (best of --repeat passes).
The one-thread SentencePiece rows also print MB per CPU second on both sides and their ratio, the
number that holds on a shared, loaded machine. --assets keeps the trained models in DIR for the next
run; --only unigram times the unigram rows alone."""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "tokenize"))
import tok_assets  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--mb", type=float, default=20.0)
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--build", default="build")
ap.add_argument("--only", choices=["all", "unigram"], default="all")
ap.add_argument("--assets", help="a folder to keep the trained models in between runs")
args = ap.parse_args()
bench = os.path.join(args.build, "benchmarks", "tokenize", "tokenize_bench")
work = args.assets or tempfile.mkdtemp(prefix="dlm_bench_tok_")
cached = os.path.join(work, "files.json")
if os.path.exists(cached):
    with open(cached) as f:
        files = json.load(f)
else:
    files = tok_assets.make_files(os.path.join(work, "assets"))
    files.update(tok_assets.make_unigram_files(os.path.join(work, "unigram")))
    with open(cached, "w") as f:
        json.dump(files, f)
docs = tok_assets.corpus(args.mb)
nbytes = sum(len(d.encode()) for d in docs)
docs_path = os.path.join(work, "docs.bin")
with open(docs_path, "wb") as f:
    for d in docs:
        b = d.encode()
        f.write(struct.pack("<I", len(b)) + b)
print(f"text: {nbytes / 1e6:.1f} MB, {len(docs)} documents; {os.cpu_count()} cores")


def ours(flags, threads):
    out = subprocess.run([bench, "--threads", str(threads), "--repeat", str(args.repeat), docs_path, *flags],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def best(fn):
    """(MB/s, ids, MB per CPU second of this process), best of --repeat."""
    t = c = 1e30
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        ids = fn()
        t, c = min(t, time.perf_counter() - t0), min(c, time.process_time() - c0)
    return nbytes / 1e6 / t, sum(len(x) for x in ids), nbytes / 1e6 / c


import sentencepiece as spm  # noqa: E402
import tiktoken  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import TikTokenTokenizer  # noqa: E402

rows = []
cpu_rows = []  # (name, dlm MB per CPU s, peer MB per CPU s): one thread each
if args.only == "all":
    tik = TikTokenTokenizer(files["tekken_ranks"], pattern="v2").tokenizer
    peers = {"tiktoken": best(lambda: tik.encode_batch(docs, allowed_special="all"))}
    hf_tekken = Tokenizer.from_file(files["tekken_converted"])
    peers["tokenizers"] = best(lambda: [e.ids for e in hf_tekken.encode_batch(docs, add_special_tokens=False)])
    for threads in (1, 2):
        r = ours(["--type", "TikTokenizer", "--model", files["tekken_ranks"], "--tiktoken-pattern", "v2"], threads)
        assert r["ids"] == peers["tiktoken"][1], "id counts differ from tiktoken"
        rows.append(("tekken 131k, TikTokenizer", threads, r["mb_per_s"], peers))
        r = ours(["--type", "HuggingFaceTokenizer", "--model", files["tekken_converted"]], threads)
        assert r["ids"] == peers["tokenizers"][1], "id counts differ from tokenizers"
        rows.append(("tekken 131k, tokenizer.json", threads, r["mb_per_s"], peers))

    neox = Tokenizer.from_file(os.path.join(files["gptneox"], "tokenizer.json"))
    neox_peer = {"tokenizers": best(lambda: [e.ids for e in neox.encode_batch(docs, add_special_tokens=False)])}
    for threads in (1, 2):
        r = ours(["--type", "HuggingFaceTokenizer", "--model", files["gptneox"]], threads)
        assert r["ids"] == neox_peer["tokenizers"][1]
        rows.append(("gptneox-dlm tokenizer.json", threads, r["mb_per_s"], neox_peer))

    sp = spm.SentencePieceProcessor(model_file=files["spm"])
    sp_peer = {"sentencepiece (1 thread)": best(lambda: [sp.encode(d) for d in docs]),
               "sentencepiece batch": best(lambda: sp.encode(docs, num_threads=os.cpu_count()))}
    for threads in (1, 2):
        r = ours(["--type", "SentencePieceTokenizer", "--model", files["spm"]], threads)
        assert r["ids"] == sp_peer["sentencepiece (1 thread)"][1], "id counts differ from sentencepiece"
        rows.append((f"mistral .model v1, SentencePieceTokenizer ({r['encoder']})", threads, r["mb_per_s"], sp_peer))
        if threads == 1:
            cpu_rows.append((f"mistral .model v1 ({r['encoder']})", r["mb_per_cpu_s"], sp_peer["sentencepiece (1 thread)"][2]))
    # The same model forced through Debian's libsentencepiece, the path non-BPE models take.
    r = ours(["--type", "SentencePieceTokenizer", "--model", files["spm"], "--sentencepiece-library"], 1)
    assert r["ids"] == sp_peer["sentencepiece (1 thread)"][1], "id counts differ from sentencepiece"
    rows.append(("mistral .model v1, libsentencepiece 0.1.97", 1, r["mb_per_s"], sp_peer))

# Unigram models: dlm's native unigram encoder beside sentencepiece's, one thread each.
unigram = [("kyoto_ja_unigram_8000 (sentencepiece's test model)",
            os.path.join(os.path.dirname(__file__), "..", "..", "tests", "tokenize", "data", "kyoto_ja_unigram_8000.model")),
           ("spm_unigram 2k, nmt_nfkc (trained here)", files["spm_unigram"]),
           ("spm_unigram_nfkc_bytes 8k, nmt_nfkc, byte fallback", files["spm_unigram_nfkc_bytes"]),
           ("spm_unigram_large 45k, nmt_nfkc (trained here)", files["spm_unigram_large"])]
for name, path in unigram:
    sp = spm.SentencePieceProcessor(model_file=path)
    peer = {"sentencepiece (1 thread)": best(lambda: [sp.encode(d) for d in docs])}
    r = ours(["--type", "SentencePieceTokenizer", "--model", path], 1)
    assert r["ids"] == peer["sentencepiece (1 thread)"][1], "id counts differ from sentencepiece"
    rows.append((f"{name} ({r['encoder']})", 1, r["mb_per_s"], peer))
    cpu_rows.append((name, r["mb_per_cpu_s"], peer["sentencepiece (1 thread)"][2]))

print(f"{'tokenizer':56} {'dlm threads':>11} {'dlm MB/s':>9}  peers (MB/s, dlm/peer)")
for name, threads, mbs, p in rows:
    cells = ", ".join(f"{k} {v[0]:.2f} ({mbs / v[0]:.2f}x)" for k, v in p.items())
    print(f"{name:56} {threads:>11} {mbs:>9.2f}  {cells}")

print(f"\none thread, MB per CPU second (load average {os.getloadavg()[0]:.2f}):")
print(f"{'tokenizer':56} {'dlm':>9} {'sentencepiece':>13} {'ratio':>7}")
for name, ours_cpu, peer_cpu in cpu_rows:
    print(f"{name:56} {ours_cpu:>9.2f} {peer_cpu:>13.2f} {ours_cpu / peer_cpu:>6.2f}x")
