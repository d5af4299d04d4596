"""dlm's native SentencePiece unigram encoder against Python sentencepiece (the pinned 0.2.x), id for id.

usage: interop_sentencepiece_unigram.py TOKENIZE_TOOL [--mb MB]

Models: the two unigram models that sentencepiece's own PyPI source distribution ships as test data
(tests/tokenize/data/, nfkc charsmap), and three trained here by sentencepiece's trainer on text found
on the machine (tok_assets.UNIGRAM_SPM: nmt_nfkc + byte fallback + user-defined symbols that NFKC
would change, a large vocabulary, user-defined symbols + whitespace as suffix + no dummy prefix +
identity). Text: the
translated messages of Debian's gettext catalogues (/usr/share/locale, about 190 languages in many
scripts), /usr/share/i18n locale sources, the tokenizer corpus of tok_assets, adversarial strings,
and bytes that are not UTF-8 (compared with the ids of their U+FFFD repair).
Every document must get the reference's ids (no known differences), dlm must say it took the native
unigram encoder, and decoding must equal the reference's decode byte for byte, on the encoded
documents and on random id lists (control, unknown and U+2581 pieces, runs of byte pieces)."""
import gettext
import glob
import json
import os
import random
import shutil
import sys
import time
import unicodedata

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "interop"))
sys.path.insert(0, os.path.dirname(__file__))
from dlm_interop import Checks, require, run, tool_and_size_args, workdir  # noqa: E402

require("sentencepiece")
import tok_assets  # noqa: E402
from doc_records import first_difference, read_docs, read_ids, write_docs, write_ids  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SHIPPED = ["botchan_en_unigram_1000.model", "kyoto_ja_unigram_8000.model"]


def gettext_documents(limit):
    """One document per language: the translations of its gettext catalogues (msgstr), in order."""
    docs = []
    total = 0
    per_lang = max(limit // 190, 4000)
    for lang_dir in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES")):
        parts, size = [], 0
        for mo in sorted(glob.glob(lang_dir + "/*.mo")):
            try:
                with open(mo, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except Exception:  # noqa: BLE001 - a catalogue in another charset or malformed: skipped
                continue
            for key, value in catalog.items():
                if key and isinstance(value, str):
                    parts.append(value)
                    size += len(value.encode())
            if size >= per_lang:
                break
        if parts:
            docs.append("\n".join(parts))
            total += size
        if total >= limit:
            break
    return docs


def i18n_documents(limit):
    docs, total = [], 0
    for p in sorted(glob.glob("/usr/share/i18n/locales/*")):
        try:
            text = open(p, encoding="utf-8").read(30_000)
        except (OSError, UnicodeDecodeError):
            continue
        docs.append(text)
        total += len(text.encode())
        if total >= limit:
            break
    return docs


def adversarial_documents():
    combining = "".join(chr(c) for c in range(0x300, 0x370))
    controls = "".join(chr(c) for c in range(0, 32)) + "\x7f" + "".join(chr(c) for c in range(0x80, 0xA0))
    return [
        "", " ", "  ", "\t", "\n", " \t \t ", " " * 1000, "\t" * 500, "a" + " " * 77 + "b", " x ", "x  ", "  x",
        "\u3000\u3000x\u3000\u3000", "\u00a0 \u00a0x", "\u2581", "\u2581\u2581 \u2581", "x\u2581", "\u2581x",
        controls, "a\x00b\x00\x00c", "\x00", "line\r\nline\rline\n\n\n",
        "e" + combining, combining, "a\u0301\u0302\u0303\u0304" * 50, "\u0915\u094d\u0937\u093f",
        "\ufb01\ufb02 \uff21\uff22\uff23 \u2460\u2461 \u00bd \u2126 \u212b \u1e9b\u0323 \u3300 \ufdfa",
        "\ud7a3\u1100\u1161\u11a8 \u4e00\u9fff \U00020000\U0002a6d6 \U0001f600\U0001f3fb\u200d\u2642\ufe0f",
        "\ufeff\u200b\u200c\u200d\u2060\u2028\u2029\ufffd\ufffc",
        "<unk> <s> </s> <pad> <0x41> \u2581\u2581\u2581",
        "[REF]<|im_start|>[REF]x<|im_start|><|im_start|> [REF] ",
        "\uff21\uff22 AB ab [X] [X][X]ab\u2581\u2581 x q  q \uff21\u0301\uff22 \ufb01ab",
        "".join(chr(c) for c in range(0x20, 0x7f)) * 3,
        "".join(chr(c) for c in range(0xa0, 0x800) if unicodedata.category(chr(c))[0] != "C"),
        "x" * 1_000_000, "\u3042" * 333_334, " " * 1_000_000 + "y", "ab" * 500_000,
    ]


def random_id_lists(sp, count):
    """Id lists that stress decoding: control and unknown pieces, pieces that start with U+2581 (the
    dummy prefix) or are U+2581 alone, runs of byte pieces that spell well-formed UTF-8 or not."""
    rng = random.Random(31)
    n = sp.get_piece_size()
    special = [i for i in range(n) if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)]
    marked = [i for i in range(n) if sp.id_to_piece(i).startswith("\u2581")]
    byte_id = {int(sp.id_to_piece(i)[3:5], 16): i for i in range(n) if sp.is_byte(i)}
    out = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randrange(0, 24)):
            kind = rng.random()
            if kind < 0.15 and special:
                ids.append(rng.choice(special))
            elif kind < 0.4 and marked:
                ids.append(rng.choice(marked))
            elif kind < 0.6 and byte_id:
                text = rng.choice(["\u00e9", "\u4e2d", "\U0001f600", "a", "\u2581"]).encode()
                if rng.random() < 0.4:
                    text = text[:rng.randrange(0, len(text) + 1)] + bytes([rng.randrange(256)])
                ids += [byte_id[b] for b in text if b in byte_id]
            else:
                ids.append(rng.randrange(n))
        out.append(ids)
    return out


def main():
    args = tool_and_size_args()
    import sentencepiece as spm

    c = Checks()
    tmp = workdir("unigram")
    t0 = time.time()
    files = tok_assets.make_unigram_files(os.path.join(tmp, "assets"))
    models = [(os.path.join(DATA, m), f"{m} (sentencepiece's source distribution)") for m in SHIPPED]
    models += [(files[key], f"{key} trained by sentencepiece ({options})") for key, options in tok_assets.UNIGRAM_SPM]
    budget = int(args.mb * 1e6)
    parts = {"gettext languages": gettext_documents(budget // 2), "i18n locales": i18n_documents(budget // 6),
             "tokenizer corpus": tok_assets.corpus(args.mb / 3), "adversarial": adversarial_documents()}
    docs = [d for part in parts.values() for d in part]
    # Bytes that are not UTF-8 (a WTF-8 lone surrogate among them): the reference sees their U+FFFD repair.
    invalid = tok_assets.invalid_utf8_samples()
    repaired = [b.decode("utf-8", "replace") for b in invalid]
    print(f"models + text: {sum(len(d.encode()) for d in docs) / 1e6:.1f} MB in {len(docs)} documents "
          f"({', '.join(f'{len(v)} {k}' for k, v in parts.items())}, {len(invalid)} not UTF-8), {time.time() - t0:.0f}s")
    write_docs(docs + invalid, os.path.join(tmp, "docs.bin"))

    for path, name in models:
        t0 = time.time()
        flags = ["--type", "SentencePieceTokenizer", "--model", path]
        info = json.loads(run([args.tool, *flags, "info"]).stdout)
        encoder, decoder = info.get("encoder", ""), info.get("decoder", "")
        c.check(encoder == "native unigram", f"{name}: encoded by the native unigram encoder (dlm says: {encoder})")
        c.check(decoder == "native", f"{name}: decoded natively (dlm says: {decoder})")
        run([args.tool, *flags, "--threads", "2", "encode", os.path.join(tmp, "docs.bin"), os.path.join(tmp, "ids.bin")])
        ours = read_ids(os.path.join(tmp, "ids.bin"))
        sp = spm.SentencePieceProcessor(model_file=path)
        ref = [sp.encode(d) for d in docs + repaired]
        bad = [i for i in range(len(ref)) if ours[i] != ref[i]]
        c.check(not bad, f"{name}: ids equal on all {len(ref)} documents ({sum(map(len, ref))} ids)")
        for i in bad[:5]:
            k, a, b = first_difference(ref[i], ours[i])
            print(f"  doc {i} token {k}: reference {a} {[sp.id_to_piece(x) for x in a]} dlm {b} "
                  f"{[sp.id_to_piece(x) for x in b if 0 <= x < sp.get_piece_size()]}")

        ref = ref[:len(docs)]
        random_ids = random_id_lists(sp, 3000)
        write_ids(ref + random_ids, os.path.join(tmp, "ref_ids.bin"))
        run([args.tool, *flags, "decode", os.path.join(tmp, "ref_ids.bin"), os.path.join(tmp, "text.bin")])
        back = read_docs(os.path.join(tmp, "text.bin"))
        ref_back = [sp.decode(v).encode() for v in ref + random_ids]
        c.check(all(back[i] == ref_back[i] for i in range(len(docs))),
                f"{name}: decode equals the reference's decode, byte for byte")
        wrong = [i for i in range(len(docs), len(ref_back)) if back[i] != ref_back[i]]
        c.check(not wrong, f"{name}: decode of {len(random_ids)} random id lists equals the reference's")
        for i in wrong[:3]:
            print(f"  ids {(ref + random_ids)[i]}: reference {ref_back[i]!r} dlm {back[i]!r}")
        print(f"{name}: {len(ours)} documents, {sum(map(len, ours))} ids, {len(bad)} differ, {time.time() - t0:.1f}s")

    shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
