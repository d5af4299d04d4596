"""dlm-blend beside megatron-core's BlendedMegatronDatasetBuilder (PyPI, CPU, compiled helpers).

Over a grid (1 and 3 datasets, unequal weights, two seeds, a zero split part, seq 128 and 2048,
more than one epoch with and without the separate final epoch, add_extra_token_to_sequence on and
off, blend per split) both build their caches in separate folders; every cache file must have the
same name (so the same description hash) and the same array, dtype and bytes. Then each reads the
other's cache (nothing rebuilt, files untouched), and `dlm-blend sample` must equal
GPTDataset/BlendedDataset.__getitem__ (tokens, labels, loss_mask, position_ids) with the eod options.
"""
import os
import shutil
import sys
import warnings

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blend_cases import cache_files, dlm_flags, megatron_build, same_caches  # noqa: E402

warnings.filterwarnings("ignore")
(np,) = require("numpy")
try:
    import logging

    logging.disable(logging.WARNING)
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
except ImportError as e:
    print(f"skipped: megatron-core is not importable ({e})")
    sys.exit(77)

TOOL = os.path.join(os.environ.get("DLM_BUILD_DIR", "build"), "tools/dlm-blend/dlm-blend")
if not os.path.exists(TOOL):
    print(f"skipped: {TOOL} is not built")
    sys.exit(77)

VOCAB = 1000
TOKENIZER = NullTokenizer(VOCAB)
EOD = TOKENIZER.eod
c = Checks()
root = workdir("blend")
# BlendedDataset asks torch.distributed for its rank: one process, gloo, rendezvous through a file.
import torch.distributed  # noqa: E402

torch.distributed.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=0, world_size=1)


def make_dataset(name, docs, rng, dtype):
    """Documents of lognormal lengths (median ~90 tokens, a long tail), each ending with eod."""
    prefix = os.path.join(root, name)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    lengths = np.clip(rng.lognormal(4.5, 0.9, docs).astype(np.int64), 2, 4000)
    for n in lengths:
        t = rng.integers(0, EOD, n - 1).tolist() + [EOD]
        b.add_document(np.array(t, dtype=np.int64), [len(t)])
    b.finalize(prefix + ".idx")
    return prefix


rng = np.random.default_rng(5)
A = make_dataset("a", 600, rng, np.uint16)  # 969,30,1 leaves the test split 1 document
B = make_dataset("b", 120, rng, np.uint16)
C = make_dataset("c", 500, rng, np.uint16)
BIG = make_dataset("big", 900, rng, np.uint16)  # for seq 2048


# name, dlm flags (besides cache), megatron config kwargs, sizes, eod options
CASES = []


def case(name, seed, seq, train, eval_iters, eval_interval, data=None, split=None, per_split=None, extra=True,
         eod=(False, False, False)):
    CASES.append(dict(name=name, seed=seed, seq=seq, train=train, eval_iters=eval_iters, eval_interval=eval_interval,
                      data=data, split=split, per_split=per_split, extra=extra, eod=eod))


case("one-dataset", 1234, 128, 400, 3, 100, data=[A], split="969,30,1", eod=(True, True, True))
case("three-weighted", 1234, 128, 600, 5, 50, data=["0.5", A, "0.2", B, "0.3", C], split="98,2,0")
case("three-weighted-seed7-noextra", 7, 128, 900, 4, 1000, data=["3", A, "1", B, "2.5", C], split="80,0,20",
     extra=False, eod=(True, False, True))
case("three-unweighted", 7, 128, 500, 10, 100, data=[A, B, C], split="90,5,5", eod=(False, True, False))
case("seq2048", 1234, 2048, 40, 2, 1000, data=["0.7", BIG, "0.3", C], split="9,1,0", eod=(True, True, False))
case("seq2048-noextra-1ds", 7, 2048, 60, 1, 1000, data=[BIG], split="1,0,0", extra=False)
case("per-split", 1234, 128, 700, 6, 200,
     per_split=[["0.6", A, "0.4", C], [B], [A, C]], eod=(False, False, True))


def snapshot(d):
    return {f: os.stat(os.path.join(d, f)).st_mtime_ns for f in cache_files(d)}


def parse_sample(text):
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(": ")
        if key in ("tokens", "labels", "loss_mask", "position_ids"):
            out[key] = np.array([float(x) for x in rest.split()])
    return out


# `interop_blend.py NAME...` runs only the named cases.
only = set(sys.argv[1:])
seen = {"multi_epoch": 0, "separate_final": 0, "one_epoch_multi": 0}
for k in CASES:
    if only and k["name"] not in only:
        continue
    name = k["name"]
    dm, dd = os.path.join(root, name, "megatron"), os.path.join(root, name, "dlm")
    splits = megatron_build(k, dm, TOKENIZER)
    run([TOOL, "build", *dlm_flags(k, dd)])
    same_caches(c, name, dm, dd)

    # dlm reads megatron's cache: nothing rebuilt, every dataset reported as cached.
    xm = os.path.join(root, name, "dlm-reads-megatron")
    shutil.copytree(dm, xm)
    before = snapshot(xm)
    report = run([TOOL, "inspect", *dlm_flags(k, xm)]).stdout
    c.check(snapshot(xm) == before, f"{name}: dlm rewrote megatron's cache")
    c.check("sequences [" in report and report.count("(cached)") == report.count("sequences ["),
            f"{name}: dlm did not reuse every cached GPTDataset:\n{report}")
    seen["multi_epoch"] += report.count(" epochs")
    seen["separate_final"] += report.count("final epoch shuffled apart")

    # megatron reads dlm's cache: nothing rebuilt, same arrays.
    xd = os.path.join(root, name, "megatron-reads-dlm")
    shutil.copytree(dd, xd)
    before = snapshot(xd)
    again = megatron_build(k, xd, TOKENIZER)
    c.check(snapshot(xd) == before, f"{name}: megatron rewrote dlm's cache")
    for s_m, s_d in zip(splits, again):
        c.check((s_m is None) == (s_d is None) and (s_m is None or len(s_m) == len(s_d)),
                f"{name}: split sizes differ after reading dlm's cache")

    # Samples: dlm-blend sample vs __getitem__.
    eod_flags = [flag for flag, on in zip(("--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"),
                                          k["eod"]) if on]
    for si, ds in enumerate(splits):
        if ds is None:
            continue
        split = ("train", "valid", "test")[si]
        n = len(ds)
        picks = sorted({0, 1, n // 3, n // 2, n - 2, n - 1} | set(np.random.default_rng(si).integers(0, n, 3).tolist()))
        for i in picks:
            if not 0 <= i < n:
                continue
            want = ds[i]
            got = parse_sample(run([TOOL, "sample", i, "--sample-split", split, "--eod", EOD, *eod_flags,
                                    *dlm_flags(k, dd)]).stdout)
            for key in ("tokens", "labels", "loss_mask", "position_ids"):
                w = want[key].numpy().astype(np.float64)
                g = got.get(key)
                c.check(g is not None and g.shape == w.shape and np.array_equal(g, w),
                        f"{name}: {split} sample {i}: {key} differs\n megatron {w[:16]}...\n dlm      "
                        f"{None if g is None else g[:16]}...")
    print(f"{name}: compared", flush=True)

c.check(seen["multi_epoch"] > 0, "no case built more than one epoch")
c.check(seen["separate_final"] > 0, "no case took the separate-final-epoch path")
c.check(seen["multi_epoch"] > seen["separate_final"], "no multi-epoch case shuffled its final epoch with the others")
print(f"grid: {seen['multi_epoch']} multi-epoch datasets, {seen['separate_final']} with a separate final epoch")
torch.distributed.destroy_process_group()
shutil.rmtree(root, ignore_errors=True)
c.finish()
