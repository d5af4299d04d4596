"""Trains the demo's byte-level BPE tokenizer with Hugging Face `tokenizers` (the reference library) on the
demo corpus: a small vocabulary keeps the CPU demo's output layer cheap. Special tokens as MegaDLMs'
GPT-NeoX tokenizer names them: <|endoftext|> (eod, id 0), <|mask_token|> (the diffusion mask), <|pad_token|>.

usage: demo_tokenizer.py CORPUS.jsonl OUT_DIR [VOCAB]
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def texts(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def main():
    corpus, out = sys.argv[1], sys.argv[2]
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|mask_token|>", "<|pad_token|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(corpus), trainer)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    # Megatron's (and transformers') HuggingFaceTokenizer reads its special tokens from here.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
              "mask_token": "<|mask_token|>", "pad_token": "<|pad_token|>", "add_bos_token": False,
              "add_eos_token": False, "model_max_length": 2048}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    print(f"demo tokenizer: {tok.get_vocab_size()} ids -> {out}/tokenizer.json")


if __name__ == "__main__":
    main()
