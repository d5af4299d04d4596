"""Real-text JSONL corpora and the Python reference pipeline for dlm-preprocess's interop tests.

Text comes from what every machine has: Python's standard library sources and /usr/share/doc (English
prose and code, with the non-ASCII text the stdlib's tests and docs hold). Documents are runs of
paragraphs cut at random (seeded) boundaries, a few of them empty; a second key "title" holds a short
string, sometimes an array of strings (Megatron's sentence layout) with an empty member.

The reference is Megatron's tools/preprocess_data.py rule set written against the real libraries:
`tokenizers` for ids and megatron-core's IndexedDatasetBuilder for the files."""
import json
import os
import random
import sys

STDLIB = os.path.dirname(os.__file__)
TEXT_ROOTS = [STDLIB, "/usr/share/doc"]
GPTNEOX = "/work/shared/assets/gptneox-dlm"


def text_files():
    """Readable UTF-8 text files, in a fixed order."""
    files = []
    for root in TEXT_ROOTS:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith((".py", ".txt", ".rst", ".md")) or name in ("copyright", "README", "NEWS"):
                    files.append(os.path.join(dirpath, name))
    return files


def documents(target_bytes, seed=0):
    """Yields (text, title) pairs until about target_bytes of text; cycles the files with new cuts."""
    rng = random.Random(seed)
    produced = 0
    n = 0
    files = text_files()
    while True:
        for path in files:
            try:
                with open(path, encoding="utf-8") as f:
                    paragraphs = f.read().split("\n\n")
            except (UnicodeDecodeError, OSError):
                continue
            i = 0
            while i < len(paragraphs):
                k = rng.randint(1, 12)
                text = "\n\n".join(paragraphs[i:i + k])
                i += k
                if rng.random() < 0.01:
                    text = ""
                title = os.path.relpath(path, "/") + f" #{n}"
                if rng.random() < 0.2:
                    title = [title, "", text[:40]]
                yield text, title
                n += 1
                produced += len(text.encode("utf-8")) + 40
                if produced >= target_bytes:
                    return


def write_jsonl(path, target_bytes, seed=0):
    """Writes the corpus as JSONL (ensure_ascii off, so the UTF-8 reaches the parser as is)."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for text, title in documents(target_bytes, seed):
            f.write(json.dumps({"id": count, "title": title, "text": text, "meta": {"len": len(text)}},
                               ensure_ascii=False) + "\n")
            count += 1
    return count


def compress_zst(path, out):
    import zstandard
    with open(path, "rb") as src, open(out, "wb") as dst:
        zstandard.ZstdCompressor(level=3).copy_stream(src, dst)


class Reference:
    """Megatron's encode + IndexedDatasetBuilder, with `tokenizers` batch-encoding the text."""

    def __init__(self, tokenizer_dir=GPTNEOX):
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
        self.eod = self.tokenizer.token_to_id("<|endoftext|>")
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode_document(self, sentences, append_eod):
        """Megatron's Encoder.encode for one key: empty sentences dropped, eod on the last one."""
        ids, lens = [], []
        for enc in self.tokenizer.encode_batch(sentences) if sentences else []:
            if enc.ids:
                ids.extend(enc.ids)
                lens.append(len(enc.ids))
        if ids and append_eod:
            ids.append(self.eod)
            lens[-1] += 1
        return ids, lens

    def run(self, jsonl_path, prefix, keys, append_eod=True, level="document", partitions=1):
        """Writes {prefix}_{key}_{level}.bin/.idx as preprocess_data.py does (partitions: round-robin)."""
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
        dtype = DType.optimal_dtype(self.vocab_size)
        with open(jsonl_path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f]
        order = [i for p in range(partitions) for i in range(p, len(lines), partitions)]
        for key in keys:
            values = [lines[i][key] for i in order]
            sentences = [v if isinstance(v, list) else [v] for v in values]
            # One batch call for speed; the ids are those of encoding each sentence alone.
            flat = [s for doc in sentences for s in doc]
            encoded = iter(self.tokenizer.encode_batch(flat))
            builder = IndexedDatasetBuilder(f"{prefix}_{key}_{level}.bin", dtype=dtype)
            for doc in sentences:
                ids, lens = [], []
                for _ in doc:
                    enc = next(encoded).ids
                    if enc:
                        ids.extend(enc)
                        lens.append(len(enc))
                if ids and append_eod:
                    ids.append(self.eod)
                    lens[-1] += 1
                builder.add_document(ids, lens)  # a list, as preprocess_data.py passes
            builder.finalize(f"{prefix}_{key}_{level}.idx")
        return len(lines)


def same_files(a_prefix, b_prefix):
    """True when both .bin and both .idx are byte-identical; else a message saying where they differ."""
    for ext in (".bin", ".idx"):
        with open(a_prefix + ext, "rb") as a, open(b_prefix + ext, "rb") as b:
            x, y = a.read(), b.read()
        if x != y:
            at = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            return f"{ext} differs: sizes {len(x)} vs {len(y)}, first difference at byte {at}"
    return True


if __name__ == "__main__":
    print(write_jsonl(sys.argv[1], int(float(sys.argv[2]))))
