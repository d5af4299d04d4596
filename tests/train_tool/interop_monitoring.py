"""Megatron-LM's monitoring from dlm-train, read by the readers Megatron users have: a short CPU run with every
monitoring flag (--log-throughput, --log-params-norm, --log-num-zeros-in-grad, --log-progress,
--log-timers-to-tensorboard, --log-memory-to-tensorboard, --log-validation-ppl-to-tensorboard,
--tensorboard-log-interval, --tensorboard-queue-size, --wandb-project/-exp-name/-save-dir/-entity). Its
TensorBoard events are read by the `tensorboard` package's own EventAccumulator: every scalar tag that Megatron's
training.py writes for those flags is there, at the right steps, with the values of the JSONL metrics file, the
LR schedule (Megatron's OptimizerParamScheduler formula, recomputed here) and Megatron's FLOP count. The log
lines match Megatron's iteration line and validation block; progress.txt has Megatron's lines.

usage: interop_monitoring.py DLM_TRAIN"""
import json
import math
import os
import re
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

np, _ = require("numpy", "tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402

DLM_TRAIN = sys.argv[1]
c = Checks()

# The run's shape.
LAYERS, HIDDEN, FFN, HEADS, SEQ, MICRO, GBS, VOCAB, ITERS, LOG, EVAL = 2, 32, 64, 4, 16, 2, 4, 200, 10, 5, 5
LR, MIN_LR, WARMUP = 3e-3, 3e-4, 3


def write_corpus(prefix):
    """Megatron's MMIDIDX .bin/.idx (uint16), 300 documents of a repetitive toy language over ids 1..198, eod 0."""
    rng = np.random.default_rng(5)
    docs = []
    for _ in range(300):
        start, n = int(rng.integers(1, 150)), int(rng.integers(20, 60))
        docs.append([start + (i * 7 + int(rng.integers(0, 3))) % 48 for i in range(n)] + [0])
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.array(d, dtype=np.uint16).tobytes())
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * 2)]).astype(np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def megatron_lr(iteration):
    """OptimizerParamScheduler.get_lr after `iteration` steps (linear warmup from 0, cosine decay over ITERS)."""
    step, warmup, decay = iteration * GBS, WARMUP * GBS, ITERS * GBS
    if step <= warmup:
        return LR * step / warmup
    ratio = (step - warmup) / (decay - warmup)
    return MIN_LR + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (LR - MIN_LR)


def megatron_flops():
    """training.py num_floating_point_operations (dense, SwiGLU, no GQA) for one global batch."""
    padded_vocab = -(-(VOCAB + 1) // 128) * 128  # NullTokenizer: --vocab-size + 1 (its eod), padded to 128
    q = k = HIDDEN
    tokens = GBS * SEQ
    per_token = 3 * 2 * (HIDDEN * FFN * 3 * LAYERS + LAYERS * (HIDDEN * (q + 2 * k) + q * HIDDEN) + HIDDEN * padded_vocab)
    return tokens * per_token + GBS * SEQ * SEQ * 3 * 2 * q * LAYERS


f32 = lambda v: float(np.float32(v))  # noqa: E731  (TensorBoard keeps simple_value as float32)
close = lambda a, b, rel=1e-6: abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)  # noqa: E731

w = workdir("monitoring")
try:
    prefix = os.path.join(w, "corpus_text_document")
    write_corpus(prefix)
    save, wandb_dir = os.path.join(w, "ckpt"), os.path.join(w, "wandb")
    metrics = os.path.join(w, "metrics.jsonl")
    p = run([DLM_TRAIN, "--num-layers", LAYERS, "--hidden-size", HIDDEN, "--ffn-hidden-size", FFN,
             "--num-attention-heads", HEADS, "--seq-length", SEQ, "--max-position-embeddings", SEQ,
             "--micro-batch-size", MICRO, "--global-batch-size", GBS, "--train-iters", ITERS, "--lr", LR,
             "--min-lr", MIN_LR, "--lr-warmup-iters", WARMUP, "--lr-decay-style", "cosine",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", VOCAB, "--mask-token", 199,
             "--data-path", prefix, "--split", "90,10,0", "--data-cache-path", os.path.join(w, "cache"),
             "--threads", 1, "--seed", 7, "--device", "cpu", "--save", save, "--metrics-file", metrics,
             "--log-interval", LOG, "--eval-interval", EVAL, "--eval-iters", 2, "--save-interval", 5,
             "--log-throughput", "--log-params-norm", "--log-num-zeros-in-grad", "--log-progress",
             "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
             "--tensorboard-log-interval", 1, "--tensorboard-queue-size", 7,
             "--wandb-project", "dlm-proj", "--wandb-exp-name", "run-7", "--wandb-save-dir", wandb_dir,
             "--wandb-entity", "lab"])
    tb_dir = os.path.join(wandb_dir, "tensorboard")

    # ---- W&B: one start-up line with the command that uploads the events --------------------------------------
    want = f"WANDB_DIR={wandb_dir} wandb sync --sync-tensorboard -p dlm-proj -e lab --id run-7 {tb_dir}"
    c.check(p.stderr.count(want) == 1, f"the wandb sync line, once: {want!r} in\n{p.stderr}")
    c.check(os.path.isdir(wandb_dir), "the wandb folder exists")
    c.check("no effect" not in p.stderr, f"no flag is named as without effect:\n{p.stderr}")

    # ---- the JSONL file keeps its keys ---------------------------------------------------------------------------
    rows = [json.loads(line) for line in open(metrics)]
    train_rows = {r["iteration"]: r for r in rows if "loss" in r}
    # The periodic evaluations at 5 and 10, then the one at the end of training (10 again, the iterator continuing):
    # valid_rows holds the first of each iteration, valid_last the last.
    valid_all = [(r["iteration"], r["valid_loss"]) for r in rows if "valid_loss" in r]
    valid_rows, valid_last = {}, dict(valid_all)
    for it, v in valid_all:
        valid_rows.setdefault(it, v)
    c.check(sorted(train_rows) == [5, 10] and [it for it, _ in valid_all] == [5, 10, 10], f"JSONL rows {rows}")
    for r in train_rows.values():
        c.check({"loss", "lr", "grad_norm", "tokens_per_second", "consumed_samples"} <= set(r), f"JSONL keys {r}")

    # ---- TensorBoard, by tensorboard's reader ----------------------------------------------------------------
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    per_iteration = ["learning-rate", "batch-size", "lm loss", "loss-scale", "grad-norm", "num-zeros", "params-norm"]
    expected = set(per_iteration) | {t + " vs samples" for t in per_iteration} | {
        "mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes", "iteration-time", "throughput",
        "lm loss validation", "lm loss validation vs samples", "lm loss validation ppl", "lm loss validation ppl vs samples"}
    c.check(tags == expected, f"tags: missing {sorted(expected - tags)}, unexpected {sorted(tags - expected)}")
    S = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    steps = list(range(1, ITERS + 1))
    for t in per_iteration + ["mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes"]:
        c.check(sorted(S.get(t, {})) == steps, f"{t} at every iteration: {sorted(S.get(t, {}))}")
    for t in per_iteration:
        c.check(sorted(S.get(t + " vs samples", {})) == [i * GBS for i in steps], f"{t} vs samples: steps are samples")
        c.check(all(S[t + " vs samples"][i * GBS] == S[t][i] for i in steps), f"{t} vs samples: the same values")
    loss = S.get("lm loss", {})
    c.check(all(math.isfinite(v) and 0 < v < 10 for v in loss.values()), f"lm loss finite, sane: {loss}")
    for end in (5, 10):  # the JSONL loss is the interval's mean of the iterations' losses
        mean = sum(loss.get(i, math.nan) for i in range(end - 4, end + 1)) / 5
        c.check(close(mean, train_rows[end]["loss"], 1e-6), f"lm loss mean to {end} {mean} vs JSONL {train_rows[end]['loss']}")
        c.check(S["grad-norm"].get(end) == f32(train_rows[end]["grad_norm"]), f"grad-norm at {end} = JSONL")
        c.check(S["params-norm"].get(end) == f32(train_rows[end]["params_norm"]), f"params-norm at {end} = JSONL")
        c.check(S["num-zeros"].get(end) == f32(train_rows[end]["num_zeros"]), f"num-zeros at {end} = JSONL")
        # TensorBoard keeps the last value written at a step: at 10, the end-of-training evaluation's.
        c.check(S["lm loss validation"].get(end) == f32(valid_last[end]), f"lm loss validation at {end} = JSONL")
        c.check(close(S["lm loss validation ppl"][end], math.exp(valid_last[end]), 1e-6), f"ppl at {end}")
    for i in steps:
        c.check(close(S["learning-rate"][i], megatron_lr(i), 1e-6), f"learning-rate {i}: {S['learning-rate'][i]} vs {megatron_lr(i)}")
    # The JSONL "lr" is the rate the update used, lr(iteration - 1) (Megatron steps its scheduler after the update).
    c.check(all(close(train_rows[i]["lr"], megatron_lr(i - 1), 1e-12) for i in (5, 10)), "JSONL lr = lr(iteration - 1)")
    c.check(set(S["batch-size"].values()) == {GBS} and set(S["loss-scale"].values()) == {1.0}, "batch-size, loss-scale")
    n_params = LAYERS * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN + 2 * HIDDEN) + HIDDEN + 256 * HIDDEN
    c.check(all(0 <= v < n_params for v in S["num-zeros"].values()), f"num-zeros within the parameters: {S['num-zeros']}")
    c.check(all(v > 0 for v in S["params-norm"].values()), "params-norm positive")
    mem = [S[t] for t in ("mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes")]
    c.check(all(1e6 < v < 1e11 for m in mem for v in m.values()), f"host memory in bytes: {mem[0]}")
    c.check(all(mem[2][i] >= mem[0][i] for i in steps), "peak resident >= resident")
    # Timers at the log lines that close an interval (not the first iteration's line), throughput from the FLOPs.
    c.check(sorted(S["iteration-time"]) == [5, 10] and sorted(S["throughput"]) == [5, 10], "timer steps")
    for i in (5, 10):
        t = S["iteration-time"][i]
        c.check(0 < t < 60, f"iteration-time {t} s")
        c.check(close(S["throughput"][i], megatron_flops() / (t * 1e12), 1e-5), f"throughput at {i} = FLOPs / time")
    c.check(sorted(S["lm loss validation"]) == [5, 10], "validation steps")

    # ---- stderr: Megatron's lines -------------------------------------------------------------------------------
    line = re.compile(
        r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration +(\d+)/ +10 \| consumed samples: +(\d+) \| "
        r"elapsed time per iteration \(ms\): [\d.]+ \| throughput per GPU \(TFLOP/s/GPU\): [\d.]+ \| "
        r"learning rate: (\d\.\d{6}E[-+]\d\d) \| global batch size: +4 \| lm loss: (\d\.\d{6}E[-+]\d\d) \| "
        r"loss scale: 1\.0 \| grad norm: [\d.]+ \| num zeros: \d+ \| params norm: [\d.]+ \| "
        r"number of skipped iterations: +0 \| number of nan iterations: +0 \|$")
    lines = [m for m in (line.match(x) for x in p.stderr.splitlines()) if m]
    c.check([int(m.group(1)) for m in lines] == [1, 5, 10], f"iteration lines 1, 5, 10 in\n{p.stderr}")
    for m in lines:
        it = int(m.group(1))
        c.check(int(m.group(2)) == it * GBS, f"consumed samples at {it}")
        c.check(m.group(3) == f"{megatron_lr(it):.6E}", f"learning rate at {it}: {m.group(3)}")
        if it in train_rows:
            c.check(m.group(4) == f"{train_rows[it]['loss']:.6E}", f"lm loss at {it}: {m.group(4)}")
    for it in (5, 10):
        v = valid_rows[it]
        mid = f" validation loss at iteration {it} | lm loss value: {v:.6E} | lm loss PPL: {math.exp(min(20, v)):.6E} | "
        block = "-" * (len(mid) + 1) + "\n" + mid + "\n" + "-" * (len(mid) + 1) + "\n"
        c.check(block in p.stderr, f"validation block at {it}: {mid!r}")
    v = valid_last[ITERS]
    mid = (f" validation loss at iteration {ITERS} on validation set | lm loss value: {v:.6E} | "
           f"lm loss PPL: {math.exp(min(20, v)):.6E} | ")
    c.check(mid in p.stderr, f"the end-of-training validation block: {mid!r}")

    # ---- progress.txt ------------------------------------------------------------------------------------------
    progress = open(os.path.join(save, "progress.txt")).read().splitlines()
    fields = [x.split("\t") for x in progress]
    c.check(len(fields) == 3, f"progress.txt: start, checkpoints 5 and 10 \n{progress}")
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
    c.check(all(stamp.match(f[0]) and f[1] == f"Job ID: {os.environ.get('SLURM_JOB_ID', '')}" and f[2] == "# GPUs: 1"
                for f in fields), f"progress.txt prefixes {fields}")
    c.check(fields[0][3:] == ["Starting job"], f"first line {fields[0]}")
    last = fields[-1]
    c.check(last[3:5] == ["Saved checkpoint", "Iteration: 10"], f"last line {last}")
    c.check(re.fullmatch(r"Job throughput: [\d.]+ TFLOP/s/GPU", last[5]) is not None, last[5])
    c.check(re.fullmatch(r"Cumulative throughput: [\d.]+ TFLOP/s/GPU", last[6]) is not None, last[6])
    c.check(last[7] == f"Floating-point operations: {10 * megatron_flops():.2e}", f"{last[7]} vs {10 * megatron_flops():.2e}")
    c.check(last[8] == f"Tokens (in billions): {10 * GBS * SEQ / 1e9:.2f}", last[8])
finally:
    shutil.rmtree(w, ignore_errors=True)
c.finish()
