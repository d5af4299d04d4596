#!/usr/bin/env bash
# The main job on a small embedded default: the pipeline as far as it exists.
# Real text (Python's standard library docs) -> JSONL -> dlm-preprocess -> .bin/.idx -> validate.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tools}
WORK=${WORK:-build/demo}
mkdir -p "$WORK"
echo "demo: validating the pipeline's tools in $WORK"
"$BIN/dlm-preprocess/dlm-preprocess" --help > /dev/null

# Text -> tokens: a JSONL of real text on this machine (Python's standard library sources), tokenized
# with the GPT-NeoX DLM tokenizer, then checked and summarised.
PY=${PYTHON:-$(command -v python3)}
TOKENIZER=${TOKENIZER:-/work/shared/assets/gptneox-dlm}
"$PY" - "$WORK/corpus.jsonl" <<'PYEOF'
import json, os, sys
root = os.path.dirname(os.__file__)
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for name in sorted(os.listdir(root))[:200]:
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                out.write(json.dumps({"text": f.read(), "title": name}) + "\n")
PYEOF
PRE="$BIN/dlm-preprocess/dlm-preprocess"
"$PRE" --input "$WORK/corpus.jsonl" --output-prefix "$WORK/demo" --json-keys text title --append-eod \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER" --workers 2 --quiet
"$PRE" validate "$WORK/demo_text_document" "$WORK/demo_title_document"
"$PRE" inspect "$WORK/demo_text_document" --documents 1 --top 5 \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER" > "$WORK/inspect.txt"
head -n 16 "$WORK/inspect.txt"
echo "demo: ok"
