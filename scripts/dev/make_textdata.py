#!/usr/bin/env python3
"""The KV-cache study's corpus (scripts/device-kvstudy.sh): real English text from Debian packages, tokenized by
dlm-preprocess with MegaDLMs' GPT-NeoX tokenizer into a Megatron .bin/.idx, and held-out prompts.

Text: Python 3.11's documentation (python3.11-doc, the reST sources), The Debian Administrator's Handbook
(debian-handbook, the en-US HTML), Perl's documentation (perl-doc, POD) and the Linux man-pages project
(manpages, manpages-dev, troff), fetched with `apt-get download` and unpacked with `dpkg-deb -x` into a
temporary folder (nothing is installed). Markup is stripped to text; each file is cut at blank lines into
documents of at most --doc-chars characters. A document is held out when crc32(source/path#chunk) % 50 == 0;
--prompts of the held-out documents with at least --prompt-len + --gen tokens (taken round-robin over the
sources, in crc order) give the prompts (their first --prompt-len tokens) and the reference continuations (the
next --gen tokens, the text's own).

Writes into --out (git-ignored; carried to the GPU machine):
  text_text_document.bin/.idx   the training documents, eod-terminated (dlm-preprocess --append-eod)
  prompts.txt, references.txt   one row of space-separated ids per line (dlm-generate's NullTokenizer form)
  tokenizer/tokenizer.json      to decode examples
  SOURCE.md                     the package versions and counts
usage: .venv/bin/python scripts/dev/make_textdata.py [--out .textdata]
                                                    [--preprocess build/tools/dlm-preprocess/dlm-preprocess]
"""
import argparse
import glob
import gzip
import html.parser
import json
import os
import re
import shutil
import subprocess
import tempfile
import zlib

import numpy as np

PACKAGES = ["python3.11-doc", "debian-handbook", "perl-doc", "manpages", "manpages-dev"]
TOKENIZER = "/work/shared/assets/gptneox-dlm"


class HtmlText(html.parser.HTMLParser):
    """The text of an HTML page, blocks separated by blank lines; scripts, styles and navigation dropped."""
    BLOCKS = {"p", "div", "li", "pre", "h1", "h2", "h3", "h4", "h5", "tr", "dt", "dd", "br", "table"}
    SKIP = {"script", "style", "head", "nav"}

    def __init__(self):
        super().__init__()
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)

    def text(self):
        t = "".join(self.parts)
        t = re.sub(r"[ \t]+\n", "\n", t)
        return re.sub(r"\n{3,}", "\n\n", t)


def html_text(path):
    p = HtmlText()
    p.feed(open(path, encoding="utf-8", errors="replace").read())
    return p.text()


def pod_text(path):
    """POD without its commands' markers: headings and items keep their text, formatting codes their content."""
    out = []
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("="):
            cmd, _, rest = line.partition(" ")
            if cmd in ("=head1", "=head2", "=head3", "=head4", "=item"):
                out.append(rest.strip() + "\n")
            continue
        out.append(line)
    t = "".join(out)
    for _ in range(3):  # nested codes, innermost first
        t = re.sub(r"[BICLFSEXZ]<([^<>]*)>", lambda m: m.group(1).split("|")[0], t)
    return t


TROFF_TEXT_MACROS = re.compile(r"^\.(SH|SS|B|I|BR|RB|IR|RI|BI|IB|SM|TP|IP|HP|UR|MT)\b\s*(.*)$")
TROFF_ESCAPES = [(r"\\f(\[[^\]]*\]|\(..|.)", ""), (r"\\\(em", "--"), (r"\\\(en", "-"), (r"\\\((lq|rq|dq)", '"'),
                 (r"\\\((oq|cq)", "'"), (r"\\\(bu", "*"), (r"\\\(..", ""), (r"\\\*\(..", ""), (r"\\\*.", ""),
                 (r"\\-", "-"), (r"\\&", ""), (r"\\e", "\\\\"), (r"\\ ", " "), (r"\\[|^c%:]", "")]


def troff_text(path):
    """A man page's text: request lines dropped but for the ones that carry words (headings, fonts, items)."""
    raw = gzip.open(path, "rt", encoding="utf-8", errors="replace").read() if path.endswith(".gz") else \
        open(path, encoding="utf-8", errors="replace").read()
    if raw.startswith(".so "):
        return ""
    out = []
    for line in raw.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith(".") or line.startswith("'"):
            m = TROFF_TEXT_MACROS.match(line)
            if m and m.group(2):
                words = m.group(2).replace('"', "")
                out.append(("\n" + words + "\n") if m.group(1) in ("SH", "SS") else words)
            elif line[1:3] in ("PP", "P", "LP", "sp", "br"):
                out.append("")
            continue
        out.append(line)
    t = "\n".join(out)
    for pat, rep in TROFF_ESCAPES:
        t = re.sub(pat, rep, t)
    return t


def chunks(text, limit):
    """Paragraphs (blank-line separated) packed into pieces of at most `limit` characters (a longer paragraph
    is a piece of its own, cut at `limit`)."""
    piece = ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip("\n")
        if not para.strip():
            continue
        if piece and len(piece) + len(para) + 2 > limit:
            yield piece
            piece = ""
        piece = para[:limit] if not piece else piece + "\n\n" + para
    if piece:
        yield piece


def sources(root):
    """(source, path, text) of every file, in a fixed order."""
    doc = os.path.join(root, "usr/share/doc")
    files = [("python", p, lambda p: open(p, encoding="utf-8", errors="replace").read())
             for p in sorted(glob.glob(f"{doc}/python3.11/html/_sources/**/*.rst.txt", recursive=True))]
    files += [("handbook", p, html_text) for p in sorted(glob.glob(f"{doc}/debian-handbook/html/en-US/*.html"))]
    files += [("perl", p, pod_text) for p in sorted(glob.glob(f"{root}/usr/share/perl/*/pod/*.pod"))]
    files += [("man", p, troff_text) for p in sorted(glob.glob(f"{root}/usr/share/man/man[1-8]/*"))]
    for src, path, read in files:
        yield src, os.path.relpath(path, root), read(path)


def read_indexed(prefix):
    """Documents of a Megatron .bin/.idx (version 1: magic, version, dtype code, counts, sizes, pointers)."""
    with open(prefix + ".idx", "rb") as f:
        head = f.read(9 + 8 + 1)
        assert head[:9] == b"MMIDIDX\x00\x00", prefix
        n_seq, n_doc = np.frombuffer(f.read(16), dtype=np.int64)
        sizes = np.frombuffer(f.read(4 * int(n_seq)), dtype=np.int32)
        pointers = np.frombuffer(f.read(8 * int(n_seq)), dtype=np.int64)
    dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
             8: np.uint16}[head[17]]
    data = np.fromfile(prefix + ".bin", dtype=np.uint8)
    return [data[p:p + s * np.dtype(dtype).itemsize].view(dtype) for p, s in zip(pointers, sizes)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".textdata")
    ap.add_argument("--preprocess", default="build/tools/dlm-preprocess/dlm-preprocess")
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--doc-chars", type=int, default=8000)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="textdata-") as tmp:
        debs, root = os.path.join(tmp, "debs"), os.path.join(tmp, "root")
        os.makedirs(debs)
        subprocess.run(["apt-get", "download", "-q", *PACKAGES], cwd=debs, check=True)
        versions = []
        for deb in sorted(glob.glob(f"{debs}/*.deb")):
            subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
            versions.append(os.path.basename(deb))
        counts, held = {}, []
        with open(f"{tmp}/train.jsonl", "w") as train, open(f"{tmp}/heldout.jsonl", "w") as heldout:
            for src, path, text in sources(root):
                for i, piece in enumerate(chunks(text, args.doc_chars)):
                    key = zlib.crc32(f"{src}/{path}#{i}".encode())
                    line = json.dumps({"text": piece}) + "\n"
                    if key % 50 == 0:
                        heldout.write(line)
                        held.append((src, key))
                    else:
                        train.write(line)
                        c = counts.setdefault(src, [0, 0])
                        c[0] += 1
                        c[1] += len(piece)
        for name in ("train", "heldout"):
            subprocess.run([args.preprocess, "--input", f"{tmp}/{name}.jsonl", "--output-prefix", f"{tmp}/{name}",
                            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", args.tokenizer,
                            "--append-eod", "--workers", "2", "--quiet"], check=True)
        for ext in (".bin", ".idx"):
            shutil.move(f"{tmp}/train_text_document{ext}", f"{args.out}/text_text_document{ext}")
        docs = read_indexed(f"{tmp}/heldout_text_document")
    # Round-robin over the sources, each in crc order, over the held-out documents long enough.
    need = args.prompt_len + args.gen
    queues = {}
    for (src, key), doc in sorted(zip(held, docs), key=lambda t: t[0][1]):
        if len(doc) - 1 >= need:  # the eod excluded
            queues.setdefault(src, []).append(doc)
    picked = []
    while len(picked) < args.prompts and any(queues.values()):
        for src in sorted(queues):
            if queues[src] and len(picked) < args.prompts:
                picked.append(queues[src].pop(0))
    if len(picked) < args.prompts:
        raise SystemExit(f"make_textdata: only {len(picked)} held-out documents of >= {need} tokens")
    with open(f"{args.out}/prompts.txt", "w") as p, open(f"{args.out}/references.txt", "w") as r:
        for doc in picked:
            p.write(" ".join(map(str, doc[:args.prompt_len].tolist())) + "\n")
            r.write(" ".join(map(str, doc[args.prompt_len:need].tolist())) + "\n")
    os.makedirs(f"{args.out}/tokenizer", exist_ok=True)
    shutil.copy(os.path.join(args.tokenizer, "tokenizer.json"), f"{args.out}/tokenizer/tokenizer.json")
    tokens = os.path.getsize(f"{args.out}/text_text_document.bin") // 2
    with open(f"{args.out}/SOURCE.md", "w") as f:
        f.write("Written by scripts/dev/make_textdata.py from " + ", ".join(versions) + ".\n\n")
        f.write("| source | training documents | characters |\n| --- | --- | --- |\n")
        for src, (n, chars) in sorted(counts.items()):
            f.write(f"| {src} | {n} | {chars} |\n")
        f.write(f"\nTraining tokens (uint16 .bin, eod included): {tokens}; held-out documents: {len(docs)}; "
                f"prompts: {len(picked)} of {args.prompt_len} tokens with {args.gen}-token references.\n")
    print(open(f"{args.out}/SOURCE.md").read())


if __name__ == "__main__":
    main()
