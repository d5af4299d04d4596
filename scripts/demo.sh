#!/usr/bin/env bash
# The main job on a small embedded default, the whole way from text to a trained model and generated text:
#   real text (the machine's /usr/share/doc/*/copyright files) -> JSONL -> a byte-level BPE tokenizer
#   trained by Hugging Face `tokenizers` -> dlm-preprocess -> .bin/.idx -> dlm-blend (Megatron's split
#   indices) -> dlm-train (a tiny masked-diffusion LM on the CPU, a few minutes; its loss must end well
#   below the unigram entropy it prints) -> checkpoint -> dlm-ckpt convert to Hugging Face -> validate
#   -> dlm-generate (diffusion sampling) from the exported folder.
# Knobs: ITERS (default 300), THREADS (default: all cores), WORK (default build/demo), BIN, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tools}
WORK=${WORK:-build/demo}
ITERS=${ITERS:-300}
THREADS=${THREADS:-0}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
rm -rf "$WORK" && mkdir -p "$WORK"
step() { echo; echo "== demo: $*"; }

step "text -> JSONL ($WORK/corpus.jsonl)"
"$PY" - "$WORK/corpus.jsonl" <<'PYEOF'
import glob, json, sys
n = 0
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if text.strip():
            out.write(json.dumps({"text": text, "package": path.split("/")[4]}) + "\n")
            n += 1
print(f"{n} documents")
PYEOF

step "a 2048-id byte-level BPE tokenizer, trained by Hugging Face tokenizers"
"$PY" scripts/demo_tokenizer.py "$WORK/corpus.jsonl" "$WORK/tokenizer" 2048
TOK=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$WORK/tokenizer")

step "dlm-preprocess: JSONL -> Megatron .bin/.idx"
"$BIN/dlm-preprocess/dlm-preprocess" --input "$WORK/corpus.jsonl" --output-prefix "$WORK/corpus" --append-eod \
  "${TOK[@]}" --workers 2 --quiet
"$BIN/dlm-preprocess/dlm-preprocess" validate "$WORK/corpus_text_document"
"$BIN/dlm-preprocess/dlm-preprocess" inspect "$WORK/corpus_text_document" --documents 0 --top 5 "${TOK[@]}" | head -n 12

DATA=(--data-path "$WORK/corpus_text_document" --split 98,2,0 --seq-length 128 --global-batch-size 32
      --train-iters "$ITERS" --eval-interval 100 --eval-iters 2 --data-cache-path "$WORK/cache")
step "dlm-blend: Megatron's GPTDataset indices (cached; dlm-train reuses them)"
"$BIN/dlm-blend/dlm-blend" inspect "${DATA[@]}"

step "dlm-train: a 4-layer masked-diffusion LM on the CPU, $ITERS iterations"
"$BIN/dlm-train/dlm-train" "${DATA[@]}" "${TOK[@]}" --num-layers 4 --hidden-size 128 --ffn-hidden-size 384 \
  --num-attention-heads 4 --micro-batch-size 16 --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 20 \
  --lr-decay-style cosine --log-interval 20 --threads "$THREADS" --save "$WORK/checkpoint" \
  --metrics-file "$WORK/metrics.jsonl" | tee "$WORK/train.txt"
# The run must have learned more than token frequencies: final loss at most 90% of the unigram entropy.
"$PY" - "$WORK/train.txt" <<'PYEOF'
import re, sys
m = re.search(r"final loss ([0-9.]+) \(unigram baseline ([0-9.]+)\)", open(sys.argv[1]).read())
loss, base = float(m.group(1)), float(m.group(2))
print(f"final loss {loss:.4f} = {loss / base:.0%} of the unigram entropy {base:.4f}")
if loss > 0.9 * base:
    sys.exit("demo: the model did not learn beyond token frequencies")
PYEOF

step "dlm-ckpt: native checkpoint -> Hugging Face folder, validated"
"$BIN/dlm-ckpt/dlm-ckpt" validate "$WORK/checkpoint" | tail -n 1
"$BIN/dlm-ckpt/dlm-ckpt" convert --from native --to hf --tokenizer "$WORK/tokenizer" "$WORK/checkpoint" "$WORK/hf"
"$BIN/dlm-ckpt/dlm-ckpt" validate "$WORK/hf" | tail -n 1

step "dlm-generate: diffusion sampling (64 tokens, 64 steps, blocks of 16, low-confidence remasking)"
"$BIN/dlm-generate/dlm-generate" --load "$WORK/hf" "${TOK[@]}" --max-new-tokens 64 --sample-steps 64 \
  --inference-block-size 16 --seed 1 --threads "$THREADS" \
  --prompt "Permission is hereby granted, free of charge," "This program is free software;"
echo
echo "demo: ok"
