"""Real tokenizer files and real text for dlm's tokenizer interop tests and benchmark.

Nothing is downloaded: every file comes from a package in the virtual environment or is trained here
by the reference library's own trainer on text found on the machine. Sources are listed in
docs/tokenizers.md."""
import base64
import glob
import json
import os
import sys

STDLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
SOURCE_DIR = os.environ.get("DLM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GPTNEOX = "/work/shared/assets/gptneox-dlm"


def site_packages():
    import tokenizers
    return os.path.dirname(os.path.dirname(tokenizers.__file__))


def mistral_data():
    import mistral_common
    return os.path.join(os.path.dirname(mistral_common.__file__), "data")


def _read(path, limit):
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def multilingual_text(limit=3_000_000):
    """Non-Latin text from package data: translated .po catalogues, CLDR-style locale data, emoji names."""
    parts = []
    total = 0
    langs = ["ja", "zh_CN", "ko", "hi", "ar", "ru", "el", "he", "th", "zh_TW", "bn", "fa", "uk", "ta", "ka", "am"]
    patterns = [STDLIB + "/test/cjkencodings/*-utf8.txt"]
    patterns += [f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo" for lang in langs]
    patterns += [
        "/usr/share/locale/*/LC_MESSAGES/*.mo",
        site_packages() + "/**/locale/**/*.po",
        site_packages() + "/babel/locale-data/*.dat",
        "/usr/share/i18n/locales/*",
        "/usr/share/doc/*/README*",
    ]
    for pat in patterns:
        for p in sorted(glob.glob(pat, recursive=True)):
            data = _read(p, 25_000)
            # .mo catalogues are binary with UTF-8 strings inside: keep the valid UTF-8 runs.
            text = data.decode("utf-8", "ignore")
            text = "".join(ch for ch in text if ch.isprintable() or ch in "\n\t ")
            if not text:
                continue
            parts.append(text)
            total += len(text.encode())
            if total >= limit:
                return "\n".join(parts)
    return "\n".join(parts)


def script_samples():
    """Short hand-checked samples of scripts and edge cases that must appear in every corpus."""
    import unicodedata
    emoji = "".join(chr(c) for c in range(0x1F300, 0x1F650) if unicodedata.category(chr(c)) == "So")
    samples = [
        "漢字とひらがなとカタカナ、中文句子。한국어 문장입니다.",
        "Привет, мир! Съешь же ещё этих мягких французских булок.",
        "مرحبا بالعالم، هذه جملة عربية. ١٢٣٤",
        "नमस्ते दुनिया। यह हिन्दी वाक्य है। १२३",
        "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
        emoji, "👩‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 👍🏽",
        " " * 300 + "x" + "\t" * 40 + "\n" * 30 + "  \n \r\n\r\n" + "\u3000" * 10 + "\u00a0\u2009",
        "".join(chr(c) for c in range(0, 32)) + "\x7f\x85\u2028\u2029\ufeff\u200b",
        "I'm you're it's we've they'll I'd 'S 'LL DON'T 123456789 3.14159 1,000,000",
        "<|endoftext|> <s> </s> <unk> <|mask_token|>text<|pad_token|>",
        "e\u0301 A\u030a \ufb01 \u2126 \uff21\uff22 \u1e9b\u0323",  # combining marks, ligature: normalizers differ
    ]
    return "\n".join(samples)


def english_and_code(limit):
    parts = []
    total = 0
    files = sorted(glob.glob(STDLIB + "/**/*.py", recursive=True)) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    files += sorted(glob.glob(site_packages() + "/**/*.md", recursive=True))
    for p in files:
        data = _read(p, 400_000).decode("utf-8", "replace")
        parts.append(data)
        total += len(data.encode())
        if total >= limit:
            break
    return "\n".join(parts)


def corpus(mb=20.0):
    """Documents (str) totalling about `mb` MB: English and code, multilingual text, edge cases."""
    target = int(mb * 1e6)
    multi = multilingual_text(min(target // 4, 6_000_000))
    edge = script_samples()
    code = english_and_code(max(target - len(multi.encode()), 100_000))
    text = code + "\n" + multi
    docs = []
    step = 20_000
    for i in range(0, len(text), step):
        docs.append(text[i:i + step])
        if i % (step * 25) == 0:
            docs.append(edge)
    return docs


def invalid_utf8_samples():
    """Byte strings that are not UTF-8; the reference sees bytes.decode('utf-8', 'replace')."""
    return [
        b"abc\xffdef", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"x\xed\xa0\x80y",  # surrogate
        b"\xc0\xaf overlong", b"\xf4\x90\x80\x80 beyond", b"\x80\x80\x80", b"ok \xe2\x82\xac \xe2\x28\xa1",
        b"\xfe\xff bom-ish", b"tail \xf0\x9f",
    ]


def tekken_path():
    return os.path.join(mistral_data(), "tekken_240911.json")


def spm_model_path():
    return os.path.join(mistral_data(), "tokenizer.model.v1")


# SentencePiece models trained here by sentencepiece's own trainer, one per encoder rule dlm has
# to follow: (name, trainer options, the encoder dlm takes for it).
TRAINED_SPM = [
    ("spm_spans", dict(model_type="bpe", vocab_size=4000, normalization_rule_name="identity", split_by_whitespace=False,
                       allow_whitespace_only_pieces=True, user_defined_symbols=["<|im_start|>", "[REF]"]), "native BPE"),
    ("spm_suffix", dict(model_type="bpe", vocab_size=4000, normalization_rule_name="identity",
                        treat_whitespace_as_suffix=True, byte_fallback=True, remove_extra_whitespaces=False), "native BPE"),
    ("spm_nfkc", dict(model_type="bpe", vocab_size=4000), "libsentencepiece"),
    ("spm_unigram", dict(model_type="unigram", vocab_size=2000, input_sentence_size=50000), "native unigram"),
]


# Unigram models trained here for the native unigram encoder's interop test: (name, trainer options).
UNIGRAM_SPM = [
    ("spm_unigram_nfkc_bytes", dict(model_type="unigram", vocab_size=8000, byte_fallback=True,
                                    user_defined_symbols=["\uff21\uff22", "[X]", "ab", " q"])),
    ("spm_unigram_large", dict(model_type="unigram", vocab_size=48000, hard_vocab_limit=False,
                               input_sentence_size=400000)),
    ("spm_unigram_user_suffix", dict(model_type="unigram", vocab_size=4000, normalization_rule_name="identity",
                                     treat_whitespace_as_suffix=True, add_dummy_prefix=False,
                                     remove_extra_whitespaces=False, split_by_whitespace=False,
                                     allow_whitespace_only_pieces=True,
                                     user_defined_symbols=["<|im_start|>", "[REF]", "\u2581\u2581", "ab"])),
]


def make_unigram_files(out):
    """Trains the UNIGRAM_SPM models into `out` on the same text as make_files; returns {name: path}."""
    os.makedirs(out, exist_ok=True)
    train_file = os.path.join(out, "train.txt")
    with open(train_file, "w") as f:
        f.write(english_and_code(3_000_000) + "\n" + multilingual_text(3_000_000))
    return _train_spm(out, train_file, [(name, options, None) for name, options in UNIGRAM_SPM])


def make_files(out):
    """Writes every tokenizer file the tests use into `out`; returns {name: path-or-dict}."""
    os.makedirs(out, exist_ok=True)
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, normalizers, processors
    files = {"gptneox": GPTNEOX, "tekken": tekken_path(), "spm": spm_model_path()}
    train_text = english_and_code(3_000_000) + "\n" + multilingual_text(1_000_000)
    train_file = os.path.join(out, "train.txt")
    with open(train_file, "w") as f:
        f.write(train_text)

    # Byte-level BPE trained by tokenizers' trainer, saved as tokenizer.json and as vocab.json+merges.txt.
    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bl.train([train_file], tr)
    bl.save(os.path.join(out, "trained-bytelevel.json"))
    os.makedirs(os.path.join(out, "gpt2files"), exist_ok=True)
    bl.model.save(os.path.join(out, "gpt2files"))
    files["trained_bytelevel"] = os.path.join(out, "trained-bytelevel.json")
    files["gpt2_vocab"] = os.path.join(out, "gpt2files", "vocab.json")
    files["gpt2_merges"] = os.path.join(out, "gpt2files", "merges.txt")

    # Llama-2/Mistral style: Metaspace + byte fallback, trained by tokenizers' trainer.
    ms = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    ms.normalizer = normalizers.NFKC()
    ms.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    ms.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                    decoders.ByteFallback(), decoders.Fuse()])
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    tr = trainers.BpeTrainer(vocab_size=6000, special_tokens=["<unk>", "<s>", "</s>"] + alphabet,
                             show_progress=False, limit_alphabet=300)
    ms.train([train_file], tr)
    ms.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", 1)])
    ms.save(os.path.join(out, "trained-metaspace.json"))
    files["trained_metaspace"] = os.path.join(out, "trained-metaspace.json")

    # Converted by transformers: the SentencePiece Llama-2-style model and the tekken rank file.
    files.update(_convert_tekken(out))
    files.update(_convert_spm(out))
    files["spm_v3"] = os.path.join(mistral_data(), "mistral_instruct_tokenizer_240323.model.v3")
    files["spm_v7"] = os.path.join(mistral_data(), "mistral_instruct_tokenizer_241114.model.v7")
    files.update(_train_spm(out, train_file))
    # Megatron's TikTokenizer reads a bare JSON list of ranks; tekken files hold it under "vocab".
    ranks = os.path.join(out, "tekken-ranks.json")
    with open(ranks, "w") as f:
        json.dump(json.load(open(tekken_path()))["vocab"], f)
    files["tekken_ranks"] = ranks
    return files


def _train_spm(out, train_file, models=TRAINED_SPM):
    import sentencepiece as spm
    files = {}
    for name, options, _ in models:
        prefix = os.path.join(out, name)
        options = dict(dict(input_sentence_size=200000, shuffle_input_sentence=True, num_threads=2, minloglevel=2,
                            seed_sentencepiece_size=100000), **options)
        spm.SentencePieceTrainer.train(input=train_file, model_prefix=prefix, **options)
        files[name] = prefix + ".model"
    return files


def _convert_tekken(out):
    d = json.load(open(tekken_path()))
    nspecial = d["config"].get("default_num_special_tokens", 1000)
    nvocab = d["config"]["default_vocab_size"] - nspecial
    ranks = {base64.b64decode(x["token_bytes"]): x["rank"] for x in d["vocab"][:nvocab]}
    tok = _tiktoken_json(ranks, d["config"]["pattern"])
    path = os.path.join(out, "tekken-converted.json")
    tok.save(path)
    return {"tekken_converted": path}


def _tiktoken_json(ranks, pattern):
    """A byte-level BPE tokenizer.json laid out as transformers' TikTokenConverter lays it out (merges
    from every split of every token, ordered by rank; Split on the pattern, then ByteLevel)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, Regex
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    b2u = bytes_to_unicode()
    def tok(b):
        return "".join(b2u[x] for x in b)
    vocab = {tok(b): r for b, r in ranks.items()}
    merges = []
    for b, r in ranks.items():
        if len(b) == 1:
            continue
        local = []
        for i in range(1, len(b)):
            a, c = b[:i], b[i:]
            if a in ranks and c in ranks:
                local.append((ranks[a], ranks[c], a, c))
        local.sort()
        merges.extend((r, tok(a), tok(c)) for _, _, a, c in local)
    merges.sort(key=lambda m: m[0])
    t = Tokenizer(models.BPE(vocab, [(a, c) for _, a, c in merges], fuse_unk=False))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    return t


def _convert_spm(out):
    """Llama-2/Mistral-style tokenizer.json from the SentencePiece model, laid out as transformers'
    LlamaConverter lays it out (Metaspace prepend "first" without splitting, byte fallback, merges
    from the vocabulary ordered by the merged piece's id). transformers 5's own converter fails on
    this input, so the same layout is written here."""
    import sentencepiece as spm
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
    sp = spm.SentencePieceProcessor(model_file=spm_model_path())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, pid in vocab.items():
        if sp.is_control(pid) or sp.is_unknown(pid) or sp.is_byte(pid):
            continue
        for k in range(1, len(piece)):
            l, r = piece[:k], piece[k:]
            if l in vocab and r in vocab:
                merges.append((pid, vocab[l], vocab[r], l, r))
    merges.sort()
    t = Tokenizer(models.BPE(vocab, [(l, r) for *_, l, r in merges], unk_token="<unk>", fuse_unk=True,
                             byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.add_special_tokens([AddedToken(x, normalized=False, special=True) for x in ["<unk>", "<s>", "</s>"]])
    path = os.path.join(out, "llama-style.json")
    t.save(path)
    return {"llama_style": path}


if __name__ == "__main__":
    print(json.dumps(make_files(sys.argv[1] if len(sys.argv) > 1 else "/tmp/dlm_tok_assets"), indent=1))
