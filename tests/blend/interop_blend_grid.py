"""Property test: random blend grids built by `dlm-blend build` and by megatron-core's
BlendedMegatronDatasetBuilder (GPTDataset, NullTokenizer, one gloo rank), compared array by array.

    interop_blend_grid.py [GRIDS] [SEED]    (defaults: DLM_BLEND_GRIDS or 300 grids, seed 35)

Each grid draws, from its own numpy Generator (SEED, grid number):
  datasets     2..10 per blend (drawn with replacement past 7), from a pool of 16 .bin/.idx pairs:
               1..200,000 documents of 1..4,000 tokens (lognormal, median 90) and three of 4..400
               documents of 1..6 tokens (a split may hold fewer tokens than one sample); a grid
               draws from the whole pool with probability 0.25, else from its 7 datasets of 30..200,000
               documents
  weights      log-uniform in [1e-4, 1] (repr'd floats, so both parse the same doubles), or none
               (the datasets weigh their sizes) with probability 0.2
  blend        --data-path with --split (probability 0.7), or a blend per split (each of
               train/valid/test present with probability 0.8, of 1..10 datasets)
  split        three parts, each 0 with probability 0.25, else an integer in 1..1000 (at least one
               non-zero), so splits come empty, tiny or large
  seq length   log-uniform integer in [16, 8192]
  samples      --train-samples log-uniform integer in [1, 1e6]; --eval-iters 0..200,
               --eval-interval 1..100,000 with --global-batch-size 1 (so valid and test up to ~1e6)
  seed         uniform in [0, 2^31); add_extra_token_to_sequence on with probability 0.8
A grid whose GPTDatasets would hold more than 4e6 document-index entries in all is redrawn (CI time
and memory; the ranges above still all occur).

Outcomes: where megatron-core would loop forever (a member split with no sequences and a sample
demand, which `_get_num_epochs` never leaves) megatron-core is not run and dlm-blend must refuse in
one line saying so; where megatron-core raises, dlm-blend must exit 1 with one line; otherwise both
caches must hold the same files (names, so description hashes) with the same dtype, shape and values,
and `dlm-blend inspect` must reuse megatron-core's cache whole (every array passes the invariants dlm
checks before reusing a cache; nothing rebuilt or added).

Named cases first: the two corners (six weights down to 0.001 whose sizes are 60000 / 1302 /
102, and a 639-token split under --seq-length 4096) and a split with no documents.
"""
import math
import os
import shutil
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blend_cases import cache_files, dlm_flags, megatron_build, same_caches, sizes_for  # noqa: E402

warnings.filterwarnings("ignore")
import logging  # noqa: E402

logging.disable(logging.WARNING)
np, indexed, utils, null, _ = require("numpy", "megatron.core.datasets.indexed_dataset", "megatron.core.datasets.utils",
                                      "megatron.core.tokenizers.text.libraries.null_tokenizer",
                                      "megatron.core.datasets.blended_megatron_dataset_builder")

TOOL = os.path.join(os.environ.get("DLM_BUILD_DIR", "build"), "tools/dlm-blend/dlm-blend")
if not os.path.exists(TOOL):
    print(f"skipped: {TOOL} is not built")
    sys.exit(77)
GRIDS = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("DLM_BLEND_GRIDS", "300"))
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 35
MAX_DOC_ENTRIES = 4_000_000
TOKENIZER = null.NullTokenizer(1000)

c = Checks()
root = workdir("blend_grid")
import torch.distributed  # noqa: E402

torch.distributed.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=0, world_size=1)


def write_dataset(name, lengths):
    """A uint16 .bin of zeros (the indices depend on lengths only) and its .idx, one sequence a document."""
    prefix = os.path.join(root, name)
    lengths = np.asarray(lengths, dtype=np.int64)
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum()) * 2)
    with indexed._IndexWriter(prefix + ".idx", np.uint16) as w:
        w.write(lengths.tolist(), None, list(range(len(lengths) + 1)))
    return prefix, lengths


rng0 = np.random.default_rng(SEED)
POOL = []
for i, docs in enumerate([1, 2, 3, 5, 8, 13, 30, 100, 300, 1000, 3000, 20000, 200000]):
    POOL.append(write_dataset(f"p{i}", np.clip(rng0.lognormal(4.5, 0.9, docs).astype(np.int64), 1, 4000)))
for i, docs in enumerate([4, 40, 400]):  # documents of 1..6 tokens: whole splits below one sample
    POOL.append(write_dataset(f"tiny{i}", rng0.integers(1, 7, docs)))
TINY639 = write_dataset("tiny639", [100, 91, 200, 48, 100, 100])  # 639 tokens
BIG = write_dataset("big", np.clip(rng0.lognormal(4.5, 0.9, 4000).astype(np.int64), 1, 4000))


def split_vector(text):
    parts = [float(x) for x in text.split(",")]
    s = float(np.sum(np.array(parts)))
    return [p / s for p in parts]


def megatron_ranges(n, split):
    """BlendedMegatronDatasetBuilder's [begin, end) per split (None where the split is unbuilt)."""
    from megatron.core.datasets.blended_megatron_dataset_config import convert_split_vector_to_split_matrix
    matrix = convert_split_vector_to_split_matrix(utils.normalize(split_vector(split)))
    return [None if m is None else (int(round(m[0] * float(n))), int(round(m[1] * float(n)))) for m in matrix]


def members(k):
    """(lengths, range, num_samples or None) of every GPTDataset megatron-core builds for the grid."""
    sizes = sizes_for(k)
    out = []

    def blend_members(words, ranges_of, size_of):
        prefixes, weights = utils.get_blend_from_list(words)
        by_prefix = {p: l for p, l in ALL}
        w = utils.normalize(weights) if weights else None
        for d, p in enumerate(prefixes):
            for s, size in size_of.items():
                r = ranges_of(len(by_prefix[p]))[s]
                if r is None:
                    continue
                if len(prefixes) == 1 and weights is None or (len(prefixes) == 1 and k["per_split"]):
                    n = size
                elif w is None:
                    n = None
                else:
                    n = int(math.ceil(math.ceil(size * w[d]) * 1.005))
                out.append((by_prefix[p], r, n))

    if k["data"]:
        blend_members(k["data"], lambda n: megatron_ranges(n, k["split"]), dict(enumerate(sizes)))
    else:
        for s, words in enumerate(k["per_split"]):
            if words:
                blend_members(words, lambda n, s=s: [(0, n) if i == s else None for i in range(3)], {s: sizes[s]})
    return out


def doc_entries(k):
    total = 0
    L, extra = k["seq"], int(k["extra"])
    for lengths, (b, e), n in members(k):
        tokens = int(lengths[b:e].sum())
        if e <= b or tokens == 0:
            continue
        epochs = 1 if n is None else max(1, -(-(n * L + extra) // tokens))
        total += epochs * (e - b)
    return total


def loops_forever(k):
    return any((e <= b or int(lengths[b:e].sum()) == 0) and n is not None for lengths, (b, e), n in members(k))


ALL = POOL + [TINY639, BIG]


def draw(g):
    """One grid from Generator g (ranges in the module docstring)."""
    def words(count):
        # Mostly datasets of 30 documents or more (pool 6..12), so most grids build; any of the pool
        # with probability 0.25 per grid.
        pool = range(len(POOL)) if g.random() < 0.25 else range(6, 13)
        picks = [POOL[i][0] for i in g.choice(pool, count, replace=count > len(pool))]
        if g.random() < 0.2:
            return picks
        w = 10 ** g.uniform(-4, 0, count)
        return [x for pair in zip((repr(float(v)) for v in w), picks) for x in pair]

    k = dict(seq=int(round(10 ** g.uniform(math.log10(16), math.log10(8192)))),
             train=int(round(10 ** g.uniform(0, 6))), eval_iters=int(g.integers(0, 201)),
             eval_interval=int(round(10 ** g.uniform(0, 5))), seed=int(g.integers(0, 2**31)),
             extra=bool(g.random() < 0.8), data=None, split=None, per_split=None)
    if g.random() < 0.7:
        k["data"] = words(int(g.integers(2, 11)))
        parts = [0 if g.random() < 0.25 else int(g.integers(1, 1001)) for _ in range(3)]
        if not any(parts):
            parts[int(g.integers(0, 3))] = int(g.integers(1, 1001))
        k["split"] = ",".join(map(str, parts))
    else:
        k["per_split"] = [words(int(g.integers(1, 11))) if g.random() < 0.8 else None for _ in range(3)]
        if not any(k["per_split"]):
            k["per_split"][0] = words(int(g.integers(2, 11)))
    return k


def compare(name, k, expect_forever=False):
    """Builds grid k both ways; returns 'same', 'both-refused' or 'forever-refused'."""
    dm, dd = os.path.join(root, name, "megatron"), os.path.join(root, name, "dlm")
    p = run([TOOL, "build", *dlm_flags(k, dd)], check=False)
    err_lines = p.stderr.strip().splitlines()
    last = err_lines[-1] if err_lines else ""
    if expect_forever or loops_forever(k):
        c.check(p.returncode == 1 and "loop forever" in last and last.startswith("dlm-blend: "),
                f"{name}: megatron-core loops forever on {k}; dlm-blend exited {p.returncode}: {last}")
        return "forever-refused"
    try:
        splits = megatron_build(k, dm, TOKENIZER)
        m_error = None
    except Exception as e:  # noqa: BLE001 (any refusal of megatron-core's)
        m_error = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    if m_error:
        c.check(p.returncode == 1 and last.startswith("dlm-blend: ") and "\n" not in last,
                f"{name}: megatron-core raised {m_error} on {k}; dlm-blend exited {p.returncode}: {p.stderr[-400:]}")
        REFUSALS[m_error.split(":")[0]] = REFUSALS.get(m_error.split(":")[0], 0) + 1
        if os.environ.get("DLM_BLEND_GRID_VERBOSE"):
            print(f"{name}: megatron-core: {m_error[:200]} | {last[:200]}")
        return "both-refused"
    if p.returncode != 0:
        c.check(False, f"{name}: megatron-core built {k}; dlm-blend exited {p.returncode}: {p.stderr[-400:]}")
        return "dlm-refused"
    failed = c.failed
    same_caches(c, name, dm, dd)
    # dlm reuses megatron-core's cache whole: its arrays pass every invariant dlm checks on reuse.
    before = cache_files(dm)
    q = run([TOOL, "inspect", *dlm_flags(k, dm)], check=False)
    c.check(q.returncode == 0 and "unusable" not in q.stderr and cache_files(dm) == before and
            q.stdout.count("(cached)") == q.stdout.count("sequences [") and
            q.stdout.count(", cached") == q.stdout.count("(blend of"),
            f"{name}: dlm-blend did not reuse megatron-core's cache as it is: {q.stderr[-400:]}")
    if c.failed != failed:
        print(f"{name}: the grid: {k}")
    k["_sizes"] = [None if s is None else len(s) for s in splits]
    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return "same"


def named(name, **kw):
    k = dict(seq=128, train=100, eval_iters=0, eval_interval=1000, seed=1234, extra=True, data=None, split=None,
             per_split=None)
    k.update(kw)
    return name, k


t_start = time.time()
six = [POOL[i][0] for i in (12, 11, 10, 9, 8, 7)]
weights = ["0.498", "0.3", "0.15", "0.05", "0.001", "0.001"]
REFUSALS = {}
NAMED = [
    # Corner 1: numpy sums these weights to 1.0 exactly; blended sizes 60000 / 1302 / 102.
    named("issue35-six-weights-down-to-0.001", seq=128, train=60000, eval_iters=100, eval_interval=5000,
          data=[x for pair in zip(weights, six) for x in pair], split="900,80,20"),
    # Corner 2: a 639-token dataset (every split of it) under --seq-length 4096.
    named("issue35-639-token-split", seq=4096, train=2000, eval_iters=10, eval_interval=1000,
          data=["0.3", TINY639[0], "0.7", BIG[0]], split="1,0,0"),
    named("issue35-639-token-split-alone", seq=4096, train=50, eval_iters=0, per_split=[[TINY639[0]], None, None]),
]
for name, k in NAMED:
    outcome = compare(name, k)
    c.check(outcome == "same", f"{name}: expected both to build, got {outcome}")
    print(f"{name}: {outcome}, blended sizes {k.get('_sizes')}", flush=True)
c.check(NAMED[0][1].get("_sizes") == [60000, 1302, 102], f"six weights: sizes {NAMED[0][1].get('_sizes')}")
# A split with no documents but a sample demand: megatron-core's _get_num_epochs never returns.
name, k = named("no-documents-with-demand", seq=64, train=100, eval_iters=5, data=[POOL[2][0]], split="969,30,1")
c.check(loops_forever(k), f"{name}: the grid does not leave a split empty")
print(f"{name}: {compare(name, k, expect_forever=True)}", flush=True)

outcomes = {}
redrawn = 0
REFUSALS = {}
for grid in range(GRIDS):
    g = np.random.default_rng([SEED, grid])
    k = draw(g)
    while doc_entries(k) > MAX_DOC_ENTRIES:
        redrawn += 1
        k = draw(g)
    outcome = compare(f"grid{grid}", k)
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if (grid + 1) % 50 == 0:
        print(f"{grid + 1} grids, {time.time() - t_start:.0f} s: {outcomes}", flush=True)
print(f"{GRIDS} grids (seed {SEED}, {redrawn} redrawn over the size bound) in {time.time() - t_start:.0f} s: {outcomes}; "
      f"megatron-core's refusals: {REFUSALS}")
c.check(outcomes.get("same", 0) >= GRIDS // 2, f"fewer than half the grids built: {outcomes}")
torch.distributed.destroy_process_group()
shutil.rmtree(root, ignore_errors=True)
c.finish()
