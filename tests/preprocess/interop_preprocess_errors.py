"""dlm-preprocess on bad input: each case asserts the one-line message (FILE:LINE: what was expected),
the exit code, and that no output file (final or temporary) is left. argv: dlm-preprocess"""
import os
import re
import resource
import shutil
import signal
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", "."), "tests", "interop"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

require("zstandard")
import corpus  # noqa: E402

tool = sys.argv[1]
checks = Checks()
if not os.path.exists(os.path.join(corpus.GPTNEOX, "tokenizer.json")):
    print("skipped: no GPT-NeoX tokenizer assets")
    sys.exit(77)
TOK = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", corpus.GPTNEOX]
GOOD = '{"text": "Hello world.", "title": "t"}\n'


def case(name, content, expected, *extra, code=1, keys=("text", "title"), preexec=None, input_name="in.jsonl"):
    """Runs the tool on `content` (str/bytes, or None: `input_name` is used as given)."""
    work = workdir("pp_err")
    path = os.path.join(work, input_name)
    if content is not None:
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
    before = set(os.listdir(work))
    p = run([tool, "--input", path if content is not None else input_name, "--output-prefix",
             os.path.join(work, "out"), "--json-keys", *keys, "--workers", 2, *TOK, *extra],
            check=False, preexec_fn=preexec)
    message = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    expected = expected.replace("FILE", re.escape(path))
    checks.check(p.returncode == code, f"{name}: exit {p.returncode}, expected {code}: {p.stderr[-300:]}")
    checks.check(re.fullmatch(expected, message) is not None, f"{name}: message {message!r} !~ {expected!r}")
    left = sorted(set(os.listdir(work)) - before)
    checks.check(left == [], f"{name}: files left behind: {left}")
    shutil.rmtree(work)


many_good = GOOD * 5000  # several blocks, so the error comes after output has been written
case("json syntax", many_good + '{"text": "a", "title": }\n',
     r"dlm-preprocess: FILE:5001: invalid JSON: .+")
case("missing key", many_good + GOOD + '{"title": "no text"}\n',
     r'dlm-preprocess: FILE:5002: missing key "text": expected it in every JSON object')
case("non-string value", GOOD + '{"text": "a", "title": 3.5}\n',
     r'dlm-preprocess: FILE:2: key "title": expected a string or an array of strings, found a number')
case("array holding a non-string", GOOD + '{"text": ["a", {"b": 1}], "title": "t"}\n',
     r'dlm-preprocess: FILE:2: key "text": expected a string or an array of strings, found an array holding an object')
case("invalid utf-8", GOOD.encode() * 3 + b'{"text": "caf\xe9", "title": "t"}\n',
     r"dlm-preprocess: FILE:4: invalid UTF-8: expected UTF-8 text")
case("empty line", GOOD + "\n" + GOOD, r"dlm-preprocess: FILE:2: expected a JSON object, found an empty line")
case("trailing content", GOOD + '{"text": "a", "title": "b"} x\n',
     r"dlm-preprocess: FILE:2: invalid JSON: .+")

import zstandard  # noqa: E402
packed = zstandard.ZstdCompressor().compress((many_good * 4).encode())
case("truncated zst", packed[: len(packed) - 7], r"dlm-preprocess: FILE: offset \d+: truncated \.zst: the input ends inside a frame",
     input_name="in.jsonl.zst")
case("corrupt zst", packed[:2000] + b"\0" * 64 + packed[2064:], r"dlm-preprocess: FILE: offset \d+: corrupt \.zst: .+",
     input_name="in.jsonl.zst")
case("missing file", None, r"dlm-preprocess: /nonexistent/in\.jsonl: cannot open: No such file or directory",
     input_name="/nonexistent/in.jsonl")
# Unreadable: a file that opens but cannot be read (EIO), what a failing disk looks like.
case("unreadable file", None, r"dlm-preprocess: /proc/self/mem: read failed at offset 0: Input/output error",
     input_name="/proc/self/mem")
case("split sentences on plain text", GOOD, r"dlm-preprocess: FILE:1: --split-sentences expects .+", "--split-sentences")


def full_disk():
    # A file-size limit makes writes fail with EFBIG, as a full disk makes them fail with ENOSPC.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


case("full disk", many_good * 10, r"dlm-preprocess: .*out_text_document\.bin.*: File too large", preexec=full_disk)

# --skip-invalid: bad lines skipped, counted and named; exit 0; the output holds only the good lines.
work = workdir("pp_skip")
path = os.path.join(work, "in.jsonl")
with open(path, "w") as f:
    f.write(GOOD + "oops\n" + GOOD + '{"title": "x"}\n' + GOOD)
p = run([tool, "--input", path, "--output-prefix", os.path.join(work, "out"), "--json-keys", "text", "title", *TOK,
         "--skip-invalid"], check=False)
checks.check(p.returncode == 0, f"--skip-invalid exit {p.returncode}: {p.stderr}")
checks.check("skipped 2 invalid lines" in p.stderr and f"{path}:2: invalid JSON" in p.stderr
             and f'{path}:4: missing key "text"' in p.stderr, f"--skip-invalid summary: {p.stderr}")
v = run([tool, "validate", os.path.join(work, "out_text_document")])
checks.check("3 documents" in v.stdout, f"--skip-invalid output: {v.stdout}")

# Usage errors exit 2.
p = run([tool, "--input", path, *TOK], check=False)
checks.check(p.returncode == 2 and "output-prefix" in p.stderr, f"missing --output-prefix: {p.returncode} {p.stderr}")
p = run([tool, "--input", path, "--output-prefix", os.path.join(work, "o"), "--workers", "x", *TOK], check=False)
checks.check(p.returncode == 2, f"bad --workers: {p.returncode} {p.stderr}")
shutil.rmtree(work)
checks.finish()
