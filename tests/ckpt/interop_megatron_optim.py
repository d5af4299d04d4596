"""Megatron checkpoints with Adam state -> dlm native, checked against megatron-core 0.16's own optimizers
on the CPU.

Each case builds megatron-core's GPTModel (local spec, RMSNorm, SwiGLU, RoPE, GQA, no biases, bf16
parameters) in tp*pp*dp gloo processes, wraps it in megatron's DistributedDataParallel, and trains 3 steps
with get_megatron_optimizer (Adam, bf16 with fp32 masters; use_distributed_optimizer False:
Float16OptimizerWithFloat16Params, True: DistributedOptimizer). It then saves as
megatron/training/checkpointing.py does: legacy (model_optim_rng.pt with optimizer.state_dict(), and
distrib_optim.pt from save_parameter_state for the distributed optimizer) and torch_dist
(dist_checkpointing.save of the model's and the optimizer's sharded_state_dict; the distributed optimizer
as fully_reshardable and as dp_reshardable, Megatron-LM's default). Independently of those files, every rank writes what its optimizer holds for each
of its parameters (the master, exp_avg, exp_avg_sq, and for the distributed optimizer the range of the
flattened parameter this DP rank owns); merged here in numpy (DP ranges, then TP and PP as
interop_megatron.py merges weights), every tensor of the converted model.h5 (/model = the fp32 masters,
/exp_avg, /exp_avg_sq) must equal them exactly, and the step, iteration and consumed samples must travel.

Then `dlm-train --load` continues the converted checkpoint (CPU, the same model: RMSNorm, SwiGLU, RoPE, GQA,
no biases, causal, the AR objective; NullTokenizer data) for one iteration: its metrics start at the
checkpoint's iteration + 1, the consumed samples and the optimizer step go on from the checkpoint's, and
its loss equals megatron-core's on the same batch (the converted weights in megatron's TP1 fp32 GPTModel; the
samples taken through megatron's index files; softmax over the real vocabulary: dlm leaves the padded rows
out, megatron keeps them), and the saved state is exactly one AdamW step from the carried one: with g = (m1 - b1 m0) / (1 - b1),
v1 = b2 v0 + (1 - b2) g^2 (fresh moments would break it), and the weights moved by
lr / (1 - b1^4) * m1 / (sqrt(v1) / sqrt(1 - b2^4) + eps) after decay, step 4 = megatron's 3 + 1 (a restarted
step count would give a 1.7x larger update).

usage: interop_megatron_optim.py DLM_CKPT DLM_TRAIN"""
import argparse
import contextlib
import glob
import json
import os
import shutil
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_megatron as im  # noqa: E402  (its checks, model shape and merge rules)
from dlm_interop import run, workdir  # noqa: E402

torch, np, h5py, dist, mp, F = im.torch, im.np, im.h5py, im.dist, im.mp, im.F
DLM_CKPT, DLM_TRAIN = sys.argv[1:3]
ITERATION, CONSUMED, STEPS, LR = 42, 1344, 3, 1e-3
BATCH, SEQ = 2, 8
c = im.c


def cpu_megatron():
    """CPU stand-ins for the CUDA calls megatron-core's DDP and optimizers make (gloo does the rest)."""
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.is_available = lambda: False

    def cpu_device(fn):
        def wrapped(*a, **k):
            if str(k.get("device", "")).startswith("cuda"):
                k["device"] = "cpu"
            return fn(*a, **k)
        return wrapped
    for n in ("tensor", "zeros", "empty", "ones", "full", "arange"):
        setattr(torch, n, cpu_device(getattr(torch, n)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    plain_type = torch.Tensor.type

    def cuda_type(self, *a, **k):  # Float16OptimizerWithFloat16Params accepts only torch.cuda.* types
        r = plain_type(self, *a, **k)
        return r.replace("torch.", "torch.cuda.", 1) if not a and not k and isinstance(r, str) else r
    torch.Tensor.type = cuda_type
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker = lambda: types.SimpleNamespace(fork=contextlib.nullcontext)
    import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async
    fs_async._process_memory = lambda: 0  # needs psutil


def build_model(tp, pp, tied):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    cfg = TransformerConfig(num_layers=im.LAYERS, hidden_size=im.HIDDEN, num_attention_heads=im.HEADS, num_query_groups=im.GROUPS,
                            ffn_hidden_size=im.FFN, kv_channels=im.KV, gated_linear_unit=True, activation_func=F.silu,
                            normalization="RMSNorm", add_bias_linear=False, qk_layernorm=False, use_cpu_initialization=True,
                            layernorm_epsilon=1e-6, bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
                            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, hidden_dropout=0.0,
                            attention_dropout=0.0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=im.PADDED, max_sequence_length=128,
                     position_embedding_type="rope", share_embeddings_and_output_weights=tied,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())
    return cfg, model.to(torch.bfloat16)


def megatron_args(tp, pp, dp, distopt, tied, root, fmt):
    from megatron.core.transformer.enums import AttnBackend
    return argparse.Namespace(
        num_layers=im.LAYERS, hidden_size=im.HIDDEN, ffn_hidden_size=im.FFN, num_attention_heads=im.HEADS, group_query_attention=True,
        num_query_groups=im.GROUPS, kv_channels=im.KV, padded_vocab_size=im.PADDED, vocab_size=None, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=dp, params_dtype=torch.bfloat16, bf16=True,
        attention_backend=AttnBackend.auto, consumed_train_samples=CONSUMED, swiglu=True, normalization="RMSNorm",
        qk_layernorm=False, add_bias_linear=False, untie_embeddings_and_output_weights=not tied, position_embedding_type="rope",
        rotary_base=10000, norm_epsilon=1e-6, max_position_embeddings=128, seq_length=128, init_method_std=0.02, ckpt_format=fmt,
        save=root, lr=LR, optimizer="adam", use_distributed_optimizer=distopt, overlap_grad_reduce=False, weight_decay=0.1,
        adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8)


def train_and_save(rank, world, tp, pp, dp, distopt, tied, base, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cpu_megatron()
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    ps.initialize_model_parallel(tp, pp)
    torch.manual_seed(1234)
    cfg, model = build_model(tp, pp, tied)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distopt), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=LR, bf16=True, params_dtype=torch.bfloat16, weight_decay=0.1,
                                                 use_distributed_optimizer=distopt, clip_grad=0.0), [ddp])
    gen = torch.Generator().manual_seed(7)
    pos = torch.arange(SEQ).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    for _ in range(STEPS):
        tokens = torch.randint(0, im.PADDED, (BATCH, SEQ), generator=gen)
        stage_input = torch.randn(SEQ, BATCH, im.HIDDEN, generator=gen).to(torch.bfloat16)
        ddp.zero_grad_buffer()
        opt.zero_grad()
        # Each stage on its own (no pipeline schedule): a middle or last stage gets a random input, the
        # first stage's loss is its output's mean square. The optimizer step is megatron's own.
        if not ps.is_pipeline_first_stage():
            ddp.module.set_input_tensor(stage_input.requires_grad_())
        out = ddp(tokens, pos, mask, labels=tokens if ps.is_pipeline_last_stage() else None)
        (out.float().mean() if ps.is_pipeline_last_stage() else out.float().pow(2).mean()).backward()
        ddp.finish_grad_sync()
        ok, _, _ = opt.step()
        assert ok
    tr, pr, dr = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank()

    # What the optimizer holds, per parameter, read from its objects (not from any saved file).
    inner = opt.chained_optimizers[0]
    held = {}
    for name, p in ddp.module.named_parameters():
        if distopt:
            if p not in inner.model_param_group_index_map:
                continue
            r = inner._get_model_param_range_map(p)["param"]
            t = inner._get_main_param_and_optimizer_states(p)
            held[name] = dict(shape=tuple(p.shape), start=r.start, end=r.end, **{k: t[k].detach().clone() for k in ("param", "exp_avg", "exp_avg_sq")})
        else:
            st = inner.optimizer.state[p.main_param]
            held[name] = dict(shape=tuple(p.shape), start=0, end=p.numel(), param=p.main_param.detach().flatten().clone(),
                              exp_avg=st["exp_avg"].flatten().clone(), exp_avg_sq=st["exp_avg_sq"].flatten().clone(), step=float(st["step"]))
    os.makedirs(f"{base}/held", exist_ok=True)
    torch.save({"tp": tr, "pp": pr, "dp": dr, "params": held}, f"{base}/held/rank{rank}.pt")

    # Legacy, as checkpointing.py: DP rank 0 writes the rank file; save_parameter_state gathers over DP.
    root = f"{base}/legacy"
    d = f"{root}/iter_{ITERATION:07d}/mp_rank_{tr:02d}" + (f"_{pr:03d}" if pp > 1 else "")
    os.makedirs(d, exist_ok=True)
    state = opt.state_dict()
    if distopt:
        opt.save_parameter_state(f"{d}/distrib_optim.pt")
    if dr == 0:
        torch.save({"args": megatron_args(tp, pp, dp, distopt, tied, root, "torch"), "checkpoint_version": 3.0, "iteration": ITERATION,
                    "model": ddp.module.state_dict_for_save_checkpoint(), "optimizer": state,
                    "rng_state": [{"torch_rng_state": torch.get_rng_state()}], "num_floating_point_operations_so_far": 1.0e9},
                   f"{d}/model_optim_rng.pt")
    if rank == 0:
        with open(f"{root}/latest_checkpointed_iteration.txt", "w") as f:
            f.write(str(ITERATION))
    # torch_dist, as checkpointing.py: the model's and the optimizer's sharded state dicts together.
    layouts = ["fully_reshardable", "dp_reshardable"] if distopt else [None]
    for layout in layouts:
        root = f"{base}/dist_{layout}"
        model_sd = ddp.module.sharded_state_dict()
        sd = dict(model_sd)
        sd["optimizer"] = opt.sharded_state_dict(model_sd, metadata={"distrib_optim_sharding_type": layout} if layout else None)
        sd.update(args=megatron_args(tp, pp, dp, distopt, tied, root, "torch_dist"), iteration=ITERATION, checkpoint_version=3.0)
        os.makedirs(f"{root}/iter_{ITERATION:07d}", exist_ok=True)
        dist_checkpointing.save(sd, f"{root}/iter_{ITERATION:07d}")
        if rank == 0:
            with open(f"{root}/latest_checkpointed_iteration.txt", "w") as f:
                f.write(str(ITERATION))
    dist.destroy_process_group()


def expected_state(base, tp, pp, tied):
    """{slot: {dlm name: array}} from what the ranks' optimizers held: DP ranges joined, then TP/PP merged."""
    per_rank = {}  # (tp, pp) -> {name: {slot: flat array}}
    steps = set()
    for path in glob.glob(f"{base}/held/rank*.pt"):
        h = torch.load(path, weights_only=False)
        mine = per_rank.setdefault((h["tp"], h["pp"]), {})
        for name, v in h["params"].items():
            full = mine.setdefault(name, {"shape": v["shape"], **{k: np.full(int(np.prod(v["shape"])), np.nan, np.float32)
                                                                  for k in ("param", "exp_avg", "exp_avg_sq")}})
            for k in ("param", "exp_avg", "exp_avg_sq"):
                full[k][v["start"]:v["end"]] = v[k].float().numpy()
            if "step" in v:
                steps.add(v["step"])
    out = {}
    for slot in ("param", "exp_avg", "exp_avg_sq"):
        merged, offset = {}, 0
        for p in range(pp):
            shards = {}
            for t in range(tp):
                for name, v in per_rank[(t, p)].items():
                    if tied and name == "output_layer.weight":
                        continue
                    a = v[slot].reshape(v["shape"])
                    c.check(not np.isnan(a).any(), f"{name}: the DP ranks' ranges do not cover it")
                    shards.setdefault(im.dlm_name(name, offset), []).append(a)
            offset += im.merge_tp(shards, merged)
        out[slot] = merged
    return out, steps


def check_converted(out, expected, steps, tag):
    meta = json.load(open(f"{out}/iter_{ITERATION:07d}/metadata.json"))
    tr = meta["training"]
    c.check(tr["iteration"] == ITERATION and tr["consumed_samples"] == CONSUMED and tr["optimizer_steps"] == STEPS,
            f"{tag}: iteration {tr['iteration']}, consumed {tr['consumed_samples']}, optimizer steps {tr['optimizer_steps']}")
    c.check(not steps or steps == {float(STEPS)}, f"{tag}: megatron's own step {steps}")
    with h5py.File(f"{out}/iter_{ITERATION:07d}/model.h5", "r") as h5:
        for group, slot in (("model", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
            want = expected[slot]
            names = set(h5[group].keys()) if group in h5 else set()
            c.check(names == set(want), f"{tag}: /{group} names differ: {sorted(names ^ set(want))}")
            for name in sorted(names & set(want)):
                got = h5[group][name][()]
                c.check(got.shape == want[name].shape and np.array_equal(got, want[name]),
                        f"{tag}: /{group}/{name} differs (max |diff| {np.abs(got - want[name]).max() if got.shape == want[name].shape else got.shape})")
    return meta


def megatron_loss(base, converted, vocab, seq, gbs, dlm_loss, tag):
    """megatron-core's GPTModel (TP1, fp32) with the converted weights, on the batch of iteration 43 as
    megatron's GPTDataset reads it from the index files dlm-train wrote in megatron's cache format
    (shuffle -> sample -> document index): its loss over the real vocabulary must be dlm-train's."""
    import contextlib
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    tokens_ds = IndexedDataset(f"{base}/tokens_text_document")
    prefix = glob.glob(f"{base}/cache/*-GPTDataset-train-document_index.npy")[0][:-len("document_index.npy")]
    doc, smp, shf = (np.load(prefix + n) for n in ("document_index.npy", "sample_index.npy", "shuffle_index.npy"))

    def sample(i):  # GPTDataset._query_document_sample_shuffle_indices: seq + 1 tokens
        (b, bo), (e, eo) = smp[shf[i]], smp[shf[i] + 1]
        if b == e:
            return tokens_ds.get(doc[b], offset=bo, length=eo - bo + 1)
        return np.concatenate([tokens_ds.get(doc[b], offset=bo)] + [tokens_ds.get(doc[k]) for k in range(b + 1, e)]
                              + [tokens_ds.get(doc[e], length=eo + 1)])
    batch = torch.from_numpy(np.stack([sample(i) for i in range(CONSUMED, CONSUMED + gbs)]).astype(np.int64))
    c.check(tuple(batch.shape) == (gbs, seq + 1), f"{tag}: batch shape {tuple(batch.shape)}")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(im.free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    model = im.build_model(1, 1, False, False)
    sd = model.state_dict()
    with h5py.File(f"{converted}/iter_{ITERATION:07d}/model.h5", "r") as h5:
        for k in list(sd):
            if isinstance(sd[k], torch.Tensor) and im.dlm_name(k, 0) in h5["model"]:
                sd[k] = torch.from_numpy(h5["model"][im.dlm_name(k, 0)][()])
    model.load_state_dict(sd)
    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker = lambda: types.SimpleNamespace(fork=contextlib.nullcontext)
    pos = torch.arange(seq).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        logits = model(batch[:, :-1], pos, mask).float()  # [b, s, padded vocab]
    labels = batch[:, 1:].reshape(-1)
    real = F.cross_entropy(logits[..., :vocab + 1].reshape(-1, vocab + 1), labels).item()
    padded = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels).item()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    c.check(dlm_loss is not None and abs(real - dlm_loss) < 1e-5,
            f"{tag}: iteration {ITERATION + 1} loss: dlm-train {dlm_loss}, megatron-core on the same batch {real}")
    print(f"{tag}: iteration {ITERATION + 1} loss: dlm-train {dlm_loss:.7f}, megatron-core {real:.7f} over the {vocab + 1} real ids "
          f"({padded:.7f} with megatron's padded rows in the softmax)")


def continue_in_dlm(base, converted, tag):
    """One dlm-train iteration from the converted checkpoint; checks progress and the AdamW step (module doc)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    vocab, seq, gbs = im.PADDED - 12, 32, 32  # NullTokenizer: vocab + 1 ids (eod = vocab) pad to 512 as megatron's did
    rng = np.random.default_rng(5)
    prefix = f"{base}/tokens_text_document"
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for _ in range(600):
        ids = np.append(rng.integers(0, vocab, int(rng.integers(20, 120))), vocab)
        b.add_document(ids, [len(ids)])
    b.finalize(prefix + ".idx")
    save, metrics = f"{base}/dlm_continued", f"{base}/metrics.jsonl"
    p = run([DLM_TRAIN, "--num-layers", str(im.LAYERS), "--hidden-size", str(im.HIDDEN), "--ffn-hidden-size", str(im.FFN),
             "--num-attention-heads", str(im.HEADS), "--group-query-attention", "--num-query-groups", str(im.GROUPS),
             "--kv-channels", str(im.KV), "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
             "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--norm-epsilon", "1e-6",
             "--max-position-embeddings", "128", "--rotary-base", "10000", "--model-running-mode", "vanilla",
             "--attention-mask-type", "causal", "--seq-length", str(seq), "--micro-batch-size", "8",
             "--global-batch-size", str(gbs), "--lr", str(LR), "--lr-decay-style", "constant", "--weight-decay", "0.1",
             "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--adam-eps", "1e-8", "--clip-grad", "0",
             "--train-iters", str(ITERATION + 1), "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab),
             "--data-path", prefix, "--split", "100,0,0", "--data-cache-path", f"{base}/cache", "--threads", "2",
             "--seed", "7", "--device", "cpu", "--load", converted, "--save", save, "--metrics-file", metrics])
    log = p.stdout + p.stderr
    c.check(f"at iteration {ITERATION}" in log, f"{tag}: dlm-train does not say it resumes at {ITERATION}:\n{log}")
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    c.check(len(rows) == 1 and rows[0].get("iteration") == ITERATION + 1, f"{tag}: metrics {rows}")
    print(f"{tag}: dlm-train iteration {rows[0].get('iteration')}, loss {rows[0].get('loss')}")
    meta = json.load(open(f"{save}/iter_{ITERATION + 1:07d}/metadata.json"))
    tr = meta["training"]
    c.check(tr["iteration"] == ITERATION + 1 and tr["consumed_samples"] == CONSUMED + gbs and tr["optimizer_steps"] == STEPS + 1,
            f"{tag}: continued to iteration {tr['iteration']}, consumed {tr['consumed_samples']}, optimizer steps {tr['optimizer_steps']}")
    megatron_loss(base, converted, vocab, seq, gbs, rows[0].get("loss"), tag)
    b1, b2, eps, wd, s = 0.9, 0.999, 1e-8, 0.1, STEPS + 1
    worst = {"v": 0.0, "w": 0.0}
    with h5py.File(f"{converted}/iter_{ITERATION:07d}/model.h5", "r") as h0, h5py.File(f"{save}/iter_{ITERATION + 1:07d}/model.h5", "r") as h1:
        for name in h0["model"]:
            w0, m0, v0 = (h0[g][name][()].astype(np.float64) for g in ("model", "exp_avg", "exp_avg_sq"))
            w1, m1, v1 = (h1[g][name][()].astype(np.float64) for g in ("model", "exp_avg", "exp_avg_sq"))
            g = (m1 - b1 * m0) / (1 - b1)
            dv = np.abs(v1 - (b2 * v0 + (1 - b2) * g * g)).max() / max(np.abs(v1).max(), 1e-30)
            decay = 0.0 if "norm" in name else wd
            want = w0 * (1 - LR * decay) - LR / (1 - b1 ** s) * m1 / (np.sqrt(v1) / np.sqrt(1 - b2 ** s) + eps)
            dw = np.abs(w1 - want).max()
            worst["v"], worst["w"] = max(worst["v"], dv), max(worst["w"], dw)
            c.check(dv < 1e-4, f"{tag}: {name}: exp_avg_sq is not one step from the carried moments ({dv:.3g})")
            c.check(dw < 2e-6, f"{tag}: {name}: weights are not one AdamW step (step {s}) from the carried state ({dw:.3g})")
    print(f"{tag}: one AdamW step from the carried state: max rel |v1 - expected| {worst['v']:.3g}, max |w1 - expected| {worst['w']:.3g}")


def check_refusals(base, distopt, tag):
    """What cannot be mapped is one line naming the file and key: a param group with its own learning rate,
    a distributed optimizer's rank file without its distrib_optim.pt."""
    bad = f"{base}/bad_legacy"
    shutil.copytree(f"{base}/legacy", bad)
    rank_file = sorted(glob.glob(f"{bad}/iter_{ITERATION:07d}/mp_rank_*/model_optim_rng.pt"))[0]
    if distopt:
        os.remove(os.path.join(os.path.dirname(rank_file), "distrib_optim.pt"))
        want = "distrib_optim.pt"
    else:
        sd = torch.load(rank_file, weights_only=False)
        sd["optimizer"]["optimizer"]["param_groups"][0]["lr_mult"] = 2.0
        torch.save(sd, rank_file)
        want = "optimizer.param_groups[0]"
    p = run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", bad, f"{base}/bad_out"], check=False)
    err = p.stderr.strip()
    c.check(p.returncode == 1 and err.count("\n") == 0 and want in err and not os.path.exists(f"{base}/bad_out/latest"),
            f"{tag}: refused in one line naming {want}: rc {p.returncode}: {err}")
    print(f"{tag}: refused: {err}")


def case(tp, pp, dp, distopt, tied, continue_from=None):
    tag = f"TP{tp} PP{pp} DP{dp} {'distributed' if distopt else 'non-distributed'} optimizer{' tied' if tied else ''}"
    base = workdir("megatron_optim")
    try:
        mp.spawn(train_and_save, args=(tp * pp * dp, tp, pp, dp, distopt, tied, base, im.free_port()), nprocs=tp * pp * dp)
        expected, steps = expected_state(base, tp, pp, tied)
        formats = ["legacy"] + (["dist_fully_reshardable", "dist_dp_reshardable"] if distopt else ["dist_None"])
        for fmt in formats:
            out = f"{base}/dlm_{fmt}"
            run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", f"{base}/{fmt}", out])
            check_converted(out, expected, steps, f"{tag} {fmt}")
            shown = run([DLM_CKPT, "inspect", f"{base}/{fmt}"]).stdout
            valid = run([DLM_CKPT, "validate", f"{base}/{fmt}"], check=False)
            c.check(f"optimizer: Adam step {STEPS}," in shown and valid.returncode == 0 and f"with Adam state (step {STEPS})" in valid.stdout,
                    f"{tag} {fmt}: inspect / validate do not report the Adam state: {shown[-300:]} {valid.stdout}")
            if continue_from == (tp, pp, dp, distopt, fmt):
                continue_in_dlm(base, out, f"{tag} {fmt}")
            print(f"{tag} {fmt}: {sum(len(v) for v in expected.values())} tensors compared")
        check_refusals(base, distopt, tag)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    case(2, 1, 1, False, False)
    case(2, 1, 2, True, False, continue_from=(2, 1, 2, True, "legacy"))
    case(1, 2, 1, False, False)
    case(1, 2, 2, True, True)
    c.finish()
