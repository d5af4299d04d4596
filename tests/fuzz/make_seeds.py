"""Regenerates the small seed corpora in tests/fuzz/corpus/ from real files on this machine (Python's
standard library text, mistral-common's tekken ranks, a SentencePiece model trained on real text,
Megatron's IndexedDatasetBuilder, numpy.save, safetensors). Run with the project's .venv python."""
import io, json, os, struct, subprocess, sys, tempfile

import numpy as np
import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
STDLIB = os.path.dirname(os.__file__)


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def text_lines(n=6):
    lines = [l.strip() for l in open(os.path.join(STDLIB, "this.py"), encoding="utf-8") if l.strip()]
    return lines[:n] + ["Grüße, 東京, Привет, مرحبا, 😀"]


def jsonl():
    lines = [json.dumps({"text": t, "title": "this.py"}) for t in text_lines()]
    lines.append(json.dumps({"text": ["sentence one.", "sentence two."], "id": 3}))
    lines.append('{"text": "esc \\u00e9 \\ud83d\\ude00 \\n", "title": null, "x": [1, 2.5e3, {"y": true}]}')
    for i, l in enumerate(lines):
        put("jsonl_fields", f"line{i}.json", l)
    body = ("\n".join(lines) + "\n").encode()
    c = zstandard.ZstdCompressor()
    put("jsonl_zst", "one-frame.jsonl.zst", c.compress(body))
    put("jsonl_zst", "two-frames.jsonl.zst", c.compress(body[:200]) + c.compress(body[200:]))
    put("jsonl_zst", "plain-crlf.jsonl", body.replace(b"\n", b"\r\n"))


def gpt2():
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(text_lines(20) * 5, vocab_size=300, min_frequency=1, show_progress=False)
    with tempfile.TemporaryDirectory() as d:
        tok.save_model(d)
        vocab = open(os.path.join(d, "vocab.json"), "rb").read()
        merges = open(os.path.join(d, "merges.txt"), "rb").read()
    put("gpt2", "bytelevel-300", vocab + b"\0" + merges + b"\0" + "Beautiful is better, ünïcode 😀".encode())


def tiktoken():
    import mistral_common
    tekken = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")
    ranks = json.load(open(tekken))["vocab"][:400]
    put("tiktoken", "tekken-400", json.dumps(ranks).encode() + b"\0" + "Hello world, it's 2026 ünïcode".encode())


def sentencepiece():
    # Each seed is "<text>\0<model bytes>": the text to encode (no NUL), then a .model.
    text = "Hello world,  it's 2026 \u00e9\t\ufb01 \uff21\uff22 \u2603\u2603 [X]<tag> \u2581x e\u0301 \u6f22\u5b57"
    with tempfile.TemporaryDirectory() as d:
        txt = os.path.join(d, "t.txt")
        with open(txt, "w") as f:
            f.write("\n".join(text_lines(20) * 20))
        for name, flags in (("bpe", ["--model_type=bpe", "--normalization_rule_name=identity"]),
                            ("unigram", ["--model_type=unigram", "--normalization_rule_name=identity"]),
                            ("unigram_nfkc", ["--model_type=unigram", "--user_defined_symbols=[X],<tag>",
                                              "--treat_whitespace_as_suffix=true"])):
            subprocess.run(["spm_train", f"--input={txt}", f"--model_prefix={d}/{name}", "--vocab_size=400",
                            "--byte_fallback=true", "--hard_vocab_limit=false", "--minloglevel=2", *flags],
                           check=True, capture_output=True)
            put("sentencepiece", f"{name}.model", text.encode() + b"\0" + open(f"{d}/{name}.model", "rb").read())


def indexed():
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    import torch
    for dtype, name in ((np.uint16, "u16"), (np.int32, "i32")):
        with tempfile.TemporaryDirectory() as d:
            b = IndexedDatasetBuilder(f"{d}/x.bin", dtype=dtype)
            b.add_item(torch.tensor([1, 2, 3])); b.add_item(torch.tensor([4])); b.end_document()
            b.add_document(torch.tensor([5, 6, 7, 8]), [2, 2])
            b.finalize(f"{d}/x.idx")
            bin_size = os.path.getsize(f"{d}/x.bin")
            put("indexed", name, struct.pack("<I", bin_size) + open(f"{d}/x.idx", "rb").read())


def npy():
    for name, a in (("doc-i32", np.arange(7, dtype=np.int32)), ("sample-i64", np.arange(12, dtype=np.int64).reshape(6, 2)),
                    ("shuffle-u32", np.array([3, 1, 2, 0], dtype=np.uint32)), ("empty-i64", np.zeros(0, dtype=np.int64))):
        f = io.BytesIO(); np.save(f, a); put("npy", name + ".npy", f.getvalue())


def safetensors_index():
    idx = {"metadata": {"total_size": 52}, "weight_map": {"x.weight": "a.safetensors", "y.weight": "b.safetensors", "z": "b.safetensors"}}
    put("safetensors_index", "two-shards.json", json.dumps(idx, indent=2))
    put("safetensors_index", "dotdot.json", json.dumps({"weight_map": {"x.weight": "../a.safetensors"}}))


def model_config():
    from transformers import Qwen3Config, LlamaConfig
    for name, c in (("qwen3", Qwen3Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
                    ("llama", LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2))):
        d = c.to_dict(); d["architectures"] = [type(c).__name__.replace("Config", "ForCausalLM")]
        s = json.dumps(d, indent=2, default=str)
        put("model_config", name + ".json", s if len(s) % 2 else s + " ")  # odd size: read as config.json


def train_args():
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "3", "--lr", "1e-3", "--data-path", "1.0", "corpus_text_document",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--attention-mask-type", "no_mask"]
    put("train_args", "tiny", "\0".join(argv))
    put("train_args", "help", "--help")


def blend_cache():
    # Edits of the pristine cache blend_cache_fuzz builds (its header lists the ops and file numbers).
    def edit(op, f, *rest):
        return bytes([op, f]) + b"".join(rest)
    u16 = lambda v: struct.pack("<H", v)
    seeds = {
        "reuse": b"\0", "reuse-no-rebuild": b"\1", "reuse-reset-masks": b"\2",
        "sample-index-row": b"\0" + edit(0, 8, u16(136), b"\4", struct.pack("<i", 5)),
        "shuffle-swap": b"\0" + edit(0, 9, u16(128), b"\x08", struct.pack("<II", 1, 0)),
        "document-index-of-test": b"\0" + edit(3, 7, b"\2"),
        "description-x": b"\1" + edit(2, 6, u16(1), b"x"),
        "blend-truncated": b"\0" + edit(1, 35, u16(130)),
        "blend-dataset-index": b"\0" + edit(0, 35, u16(128), b"\2", struct.pack("<h", 1)),
        "blend-header": b"\0" + edit(0, 36, u16(20), b"\2", b"i2"),
        "checksums-line": b"\0" + edit(0, 5, u16(20), b"\4", b"0000"),
    }
    for name, data in seeds.items():
        put("blend_cache", name, data)


ALL = (jsonl, gpt2, tiktoken, sentencepiece, indexed, npy, safetensors_index, model_config, train_args, blend_cache)
# Arguments name the corpora to regenerate (e.g. `make_seeds.py blend_cache`); none: every one.
for f in [g for g in ALL if g.__name__ in sys.argv[1:]] or ALL:
    try:
        f()
    except Exception as e:  # one missing peer must not stop the others
        print(f"{f.__name__}: {e}", file=sys.stderr)
