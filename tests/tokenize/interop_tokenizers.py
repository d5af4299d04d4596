"""dlm's tokenizers against the reference libraries and megatron-core, id for id.

usage: interop_tokenizers.py TOKENIZE_TOOL [--mb MB]

Every tokenizer file comes from a package or is trained here (tok_assets.py). Each corpus document
must get exactly the reference's ids; documents that the reference decodes back to themselves must
decode back with dlm too; invalid UTF-8 must give the ids the reference gives for
bytes.decode("utf-8", "replace"). megatron-core's own tokenizer classes are checked on a sample to
tie each reference call to what Megatron's tokenize() does, and for vocab_size and eod."""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "interop"))
sys.path.insert(0, os.path.dirname(__file__))
from dlm_interop import Checks, require, run, tool_and_size_args, workdir  # noqa: E402

require("tokenizers", "tiktoken", "sentencepiece", "transformers", "megatron.core")
import tok_assets  # noqa: E402
from doc_records import first_difference, read_docs, read_ids, write_docs, write_ids  # noqa: E402


class Case:
    """One tokenizer: dlm's flags, the reference encode/decode, and megatron-core's tokenizer.
    `encoder`: how dlm must encode a SentencePiece model (the start of tokenize_tool info's "encoder")."""

    def __init__(self, name, flags, encode, decode, megatron=None, roundtrip=True, encoder=None):
        self.name, self.flags, self.encode, self.decode = name, flags, encode, decode
        self.megatron, self.roundtrip, self.encoder = megatron, roundtrip, encoder


def cases(files):
    import sentencepiece as spm
    from tokenizers import Tokenizer
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer as MHF
    from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import TikTokenTokenizer as MTik
    from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import SentencePieceTokenizer as MSP

    def hf(path, name, megatron=None, special=False):
        t = Tokenizer.from_file(path if path.endswith(".json") else os.path.join(path, "tokenizer.json"))
        flags = ["--type", "HuggingFaceTokenizer", "--model", path] + (["--include-special"] if special else [])
        return Case(name, flags, lambda docs: [e.ids for e in t.encode_batch(docs, add_special_tokens=special)],
                    lambda ids: t.decode(ids, skip_special_tokens=False), megatron)

    out = [hf(files["gptneox"], "gptneox-dlm tokenizer.json (HuggingFaceTokenizer)", lambda: MHF(files["gptneox"])),
           hf(files["tekken_converted"], "tekken converted to byte-level tokenizer.json (131k)"),
           hf(files["trained_bytelevel"], "byte-level BPE trained by tokenizers"),
           hf(files["trained_metaspace"], "Metaspace+byte-fallback BPE trained by tokenizers"),
           hf(files["trained_metaspace"], "same, post-processor bos (--include-special)", special=True),
           hf(files["llama_style"], "Llama-2/Mistral-style tokenizer.json (Metaspace, no split)")]

    # What transformers' GPT2TokenizerFast builds from the two files (transformers 5 no longer
    # builds it from vocab_file/merges_file, so megatron-core cannot be run on them offline).
    g = Tokenizer(models.BPE.from_file(files["gpt2_vocab"], files["gpt2_merges"]))
    g.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    g.decoder = decoders.ByteLevel()
    g.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    out.append(Case("GPT-2 vocab.json + merges.txt (GPT2BPETokenizer)",
                    ["--type", "GPT2BPETokenizer", "--vocab-file", files["gpt2_vocab"], "--merge-file", files["gpt2_merges"]],
                    lambda docs: [e.ids for e in g.encode_batch(docs, add_special_tokens=False)],
                    lambda ids: g.decode(ids, skip_special_tokens=False)))

    mt = MTik(files["tekken_ranks"], pattern="v2")
    out.append(Case("tekken rank file (TikTokenizer, tiktoken)", ["--type", "TikTokenizer", "--model", files["tekken_ranks"],
                                                                  "--tiktoken-pattern", "v2"],
                    lambda docs: mt.tokenizer.encode_batch(docs, allowed_special="all"),
                    lambda ids: mt.tokenizer.decode_bytes(ids).decode("utf-8", "replace"), lambda: mt))

    def sentencepiece(key, name, encoder, megatron=None):
        sp = spm.SentencePieceProcessor(model_file=files[key])
        return Case(name, ["--type", "SentencePieceTokenizer", "--model", files[key]], lambda docs: sp.encode(docs),
                    lambda ids: sp.decode(ids), megatron, encoder=encoder)

    out.append(sentencepiece("spm", "mistral tokenizer.model.v1 (SentencePieceTokenizer)", "native BPE", lambda: MSP(files["spm"])))
    out.append(sentencepiece("spm_v3", "mistral .model.v3 (user-defined symbols)", "native BPE"))
    out.append(sentencepiece("spm_v7", "mistral .model.v7 (user-defined symbols)", "native BPE"))
    for key, options, encoder in tok_assets.TRAINED_SPM:
        out.append(sentencepiece(key, f"{key} trained by sentencepiece ({options['model_type']}, "
                                      f"{options.get('normalization_rule_name', 'nmt_nfkc')})", encoder))
    return out


def main():
    args = tool_and_size_args()
    c = Checks()
    tmp = workdir("tokenize")
    t0 = time.time()
    files = tok_assets.make_files(os.path.join(tmp, "assets"))
    docs = tok_assets.corpus(args.mb)
    invalid = tok_assets.invalid_utf8_samples()
    total = sum(len(d.encode()) for d in docs)
    print(f"assets + corpus: {total / 1e6:.1f} MB in {len(docs)} documents, {time.time() - t0:.0f}s")
    write_docs(docs + invalid, os.path.join(tmp, "docs.bin"))
    repaired = [b.decode("utf-8", "replace") for b in invalid]
    sample = docs[:3] + [tok_assets.script_samples(), "<s>hello", "hello<s>world</s>", " leading", "x  y"] + repaired

    for case in cases(files):
        t0 = time.time()
        run([args.tool, *case.flags, "--threads", "2", "encode", os.path.join(tmp, "docs.bin"), os.path.join(tmp, "ids.bin")])
        ours = read_ids(os.path.join(tmp, "ids.bin"))
        ref = case.encode(docs + repaired)
        bad = [i for i in range(len(ref)) if ours[i] != ref[i]]
        if case.encoder:
            encoder = json.loads(run([args.tool, *case.flags, "info"]).stdout).get("encoder", "")
            c.check(encoder.startswith(case.encoder), f"{case.name}: encoded by {case.encoder} (dlm says: {encoder})")
        c.check(not bad, f"{case.name}: ids equal on all {len(ref)} documents ({sum(map(len, ref))} ids)")
        for i in bad[:3]:
            k, a, b = first_difference(ref[i], ours[i])
            print(f"  doc {i} token {k}: reference {a} dlm {b}")
        c.check(all(ours[len(docs) + j] == ref[len(docs) + j] for j in range(len(invalid))),
                f"{case.name}: invalid UTF-8 gives the ids of its U+FFFD repair")

        # Decode: equal to the reference's decode, and the identity wherever the reference round-trips.
        write_ids(ref[:len(docs)], os.path.join(tmp, "ref_ids.bin"))
        run([args.tool, *case.flags, "decode", os.path.join(tmp, "ref_ids.bin"), os.path.join(tmp, "text.bin")])
        back = read_docs(os.path.join(tmp, "text.bin"))
        ref_back = [case.decode(v) for v in ref[:len(docs)]]
        trips = [i for i in range(len(docs)) if ref_back[i] == docs[i]]
        c.check(all(back[i] == docs[i].encode() for i in trips),
                f"{case.name}: decode(encode(x)) == x on the {len(trips)} documents the reference round-trips")
        c.check(all(back[i].decode("utf-8", "replace") == ref_back[i] for i in range(len(docs))),
                f"{case.name}: decode equals the reference's decode (after U+FFFD repair)")

        if case.megatron:
            m = case.megatron()
            c.check(all(m.text_to_ids(s) == case.encode([s])[0] for s in sample),
                    f"{case.name}: megatron-core's tokenize() gives the reference ids used here")
            info = json.loads(run([args.tool, *case.flags, "info"]).stdout)
            c.check(info["vocab_size"] == m.vocab_size, f"{case.name}: vocab_size {info['vocab_size']} == megatron-core's {m.vocab_size}")
            c.check(info["eod"] == m.eod, f"{case.name}: eod {info['eod']} == megatron-core's {m.eod}")
        print(f"{case.name}: {len(ref)} documents, {sum(map(len, ref))} reference ids, {time.time() - t0:.1f}s")

    shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
