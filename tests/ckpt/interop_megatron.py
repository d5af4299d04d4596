"""Megatron checkpoints (legacy and torch_dist) -> dlm native, checked against megatron-core 0.16's own
models on the CPU.

For each layout (TP1 PP1 with QK layernorm, TP2 PP2 without, TP2 PP1 tied), megatron-core's GPTModel
(local layer spec, RMSNorm, SwiGLU, RoPE, GQA) is built in tp*pp gloo processes and each rank saves its
model_optim_rng.pt exactly as megatron/training/checkpointing.py does (args Namespace, checkpoint_version
3.0, iteration, model state dict, rng_state with numpy/torch states, flops). `dlm-ckpt convert --from
megatron` writes a native checkpoint; every tensor of its model.h5 must equal the global tensor built
here in numpy from torch.load of the rank files (Megatron's layout: QKV and vocabulary rows by rank,
row-parallel columns, SwiGLU [gate_r; up_r] per rank), and the iteration, consumed samples and args must
travel. The same model saved by megatron-core's torch_dist writer (dist_checkpointing.save of its
sharded_state_dict, args and iteration in common.pt) must convert to the same tensors. For TP2 PP1 the
merged weights, loaded into a TP1 megatron model, must give the TP2 model's logits.

usage: interop_megatron.py DLM_CKPT"""
import argparse
import json
import os
import random
import shutil
import socket
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, h5py, np = require("torch", "h5py", "numpy")
require("megatron.core")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DLM_CKPT = sys.argv[1]
HIDDEN, HEADS, GROUPS, KV, FFN, LAYERS, PADDED = 64, 4, 2, 16, 96, 4, 512
ITERATION, CONSUMED = 42, 1344
TOKENS = torch.tensor([[5, 17, 300, 2, 99, 411, 7, 64]])
c = Checks()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(tp, pp, qk, tied):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    cfg = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
                            ffn_hidden_size=FFN, kv_channels=KV, gated_linear_unit=True, activation_func=F.silu,
                            normalization="RMSNorm", add_bias_linear=False, qk_layernorm=qk, use_cpu_initialization=True,
                            layernorm_epsilon=1e-6, pipeline_dtype=torch.float32, tensor_model_parallel_size=tp,
                            pipeline_model_parallel_size=pp, hidden_dropout=0.0, attention_dropout=0.0)
    return GPTModel(cfg, get_gpt_layer_local_spec(qk_layernorm=qk, normalization="RMSNorm"), vocab_size=PADDED,
                    max_sequence_length=128, position_embedding_type="rope", share_embeddings_and_output_weights=tied,
                    pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())


def logits(model):
    import contextlib
    import types
    from megatron.core import tensor_parallel
    # CPU stand-ins for megatron-core's GPU-only bits: RoPE moves its frequencies to the current GPU, and
    # attention dropout forks the CUDA RNG tracker (dropout is 0 here).
    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker = lambda: types.SimpleNamespace(fork=contextlib.nullcontext)
    pos = torch.arange(TOKENS.shape[1]).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, TOKENS.shape[1], TOKENS.shape[1], dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        return model(TOKENS, pos, mask)


def save_rank(rank, world, tp, pp, qk, tied, root, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.enums import AttnBackend
    ps.initialize_model_parallel(tp, pp)
    torch.manual_seed(1234)
    model = build_model(tp, pp, qk, tied)
    with torch.no_grad():  # norms away from 1 so that a swapped or misplaced norm shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(torch.linspace(0.5, 1.5, p.numel()) + 0.01 * ps.get_pipeline_model_parallel_rank())
    args = argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, group_query_attention=True,
        num_query_groups=GROUPS, kv_channels=KV, padded_vocab_size=PADDED, vocab_size=None, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, params_dtype=torch.float32,
        attention_backend=AttnBackend.auto, consumed_train_samples=CONSUMED, swiglu=True, normalization="RMSNorm",
        qk_layernorm=qk, add_bias_linear=False, untie_embeddings_and_output_weights=not tied,
        position_embedding_type="rope", rotary_base=10000, norm_epsilon=1e-6, max_position_embeddings=128,
        seq_length=128, init_method_std=0.02, ckpt_format="torch", save=root, lr=3e-4, data_path=["1.0", "/data/x"])
    tr, pr = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    d = f"{root}/iter_{ITERATION:07d}/mp_rank_{tr:02d}" + (f"_{pr:03d}" if pp > 1 else "")
    os.makedirs(d, exist_ok=True)
    rng = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": None, "rng_tracker_states": {}}]
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model.state_dict_for_save_checkpoint(),
                "rng_state": rng, "num_floating_point_operations_so_far": 1.5e12}, f"{d}/model_optim_rng.pt")
    if rank == 0:
        with open(f"{root}/latest_checkpointed_iteration.txt", "w") as f:
            f.write(str(ITERATION))
    # The same model through megatron-core's own torch_dist writer (CPU stand-ins for its GPU calls).
    from megatron.core import dist_checkpointing
    import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    fs_async._process_memory = lambda: 0  # needs psutil
    sharded = model.sharded_state_dict()
    sharded.update(args=args, iteration=ITERATION, checkpoint_version=3.0)
    os.makedirs(f"{root}_dist/iter_{ITERATION:07d}", exist_ok=True)
    dist_checkpointing.save(sharded, f"{root}_dist/iter_{ITERATION:07d}")
    if rank == 0:
        with open(f"{root}_dist/latest_checkpointed_iteration.txt", "w") as f:
            f.write(str(ITERATION))
    if pp == 1:
        out = logits(model)  # [b, s, vocab / tp]
        gathered = [torch.empty_like(out) for _ in range(tp)]
        dist.all_gather(gathered, out.contiguous(), group=ps.get_tensor_model_parallel_group())
        if rank == 0:
            torch.save(torch.cat(gathered, dim=-1), f"{root}/logits.pt")
    dist.destroy_process_group()


def dlm_name(local, offset):
    if local.startswith("decoder.layers."):
        n, rest = local[len("decoder.layers."):].split(".", 1)
        rest = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
                "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}.get(rest, rest)
        return f"decoder.layers.{int(n) + offset}.{rest}"
    return local


def expected_tensors(root, tp, pp, tied):
    """The global tensors, merged here in numpy from torch.load of megatron's rank files."""
    out, offset = {}, 0
    for p in range(pp):
        shards = {}
        for t in range(tp):
            d = f"{root}/iter_{ITERATION:07d}/mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
            sd = torch.load(f"{d}/model_optim_rng.pt", weights_only=False)["model"]
            for k, v in sd.items():
                if isinstance(v, torch.Tensor) and not (tied and k == "output_layer.weight"):
                    shards.setdefault(dlm_name(k, offset), []).append(v.float().numpy())
        offset += merge_tp(shards, out)
    return out


def merge_tp(shards, out):
    """One stage's {dlm name: [shard per TP rank]} merged into `out` (Megatron's TP layout: QKV and
    vocabulary rows by rank, row-parallel columns, SwiGLU [gate_r; up_r] per rank); returns its layer count."""
    for name, parts in shards.items():
        if parts[0].ndim == 1:
            out[name] = parts[0]
        elif name.endswith("linear_fc1.weight"):
            half = parts[0].shape[0] // 2
            out[name] = np.concatenate([x[:half] for x in parts] + [x[half:] for x in parts])
        elif name.endswith(("linear_proj.weight", "linear_fc2.weight")):
            out[name] = np.concatenate(parts, axis=1)
        else:
            out[name] = np.concatenate(parts, axis=0)
    return len({k.split(".")[2] for k in shards if k.startswith("decoder.layers.")})


def check_logits(root, tied, qk, expected):
    """The merged weights in a TP1 megatron model give the TP2 model's logits."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(1, 1)
    model = build_model(1, 1, qk, tied)
    sd = model.state_dict()
    for k in list(sd):
        name = dlm_name(k, 0)
        if isinstance(sd[k], torch.Tensor) and name in expected:
            sd[k] = torch.from_numpy(expected[name].copy())
    model.load_state_dict(sd)
    got, want = logits(model), torch.load(f"{root}/logits.pt")
    err = (got - want).abs().max().item()
    c.check(err < 1e-4, f"TP1 megatron with dlm's merged weights: logits differ from TP2 by {err}")
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def case(tp, pp, qk, tied):
    tag = f"TP{tp} PP{pp} qk_layernorm={qk} tied={tied}"
    base = workdir("megatron")
    try:
        root, out = f"{base}/megatron", f"{base}/dlm"
        mp.spawn(save_rank, args=(tp * pp, tp, pp, qk, tied, root, free_port()), nprocs=tp * pp)
        run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", root, out])
        run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", f"{root}_dist", f"{out}_dist"])
        meta = json.load(open(f"{out}/iter_{ITERATION:07d}/metadata.json"))
        c.check(meta["training"]["iteration"] == ITERATION, f"{tag}: iteration {meta['training']['iteration']}")
        c.check(meta["training"]["consumed_samples"] == CONSUMED, f"{tag}: consumed samples {meta['training']['consumed_samples']}")
        margs = meta["training"]["args"].get("megatron_args", {})
        c.check(margs.get("lr") == 3e-4 and margs.get("data_path") == ["1.0", "/data/x"], f"{tag}: args travel ({margs.get('lr')})")
        c.check(meta["model"]["qk_layernorm"] == qk and meta["model"]["tie_word_embeddings"] == tied, f"{tag}: model config")
        expected = expected_tensors(root, tp, pp, tied)
        with h5py.File(f"{out}/iter_{ITERATION:07d}/model.h5", "r") as h5:
            names = set(h5["model"].keys())
            c.check(names == set(expected), f"{tag}: tensor names differ: {sorted(names ^ set(expected))}")
            for name in sorted(names & set(expected)):
                got = h5["model"][name][()]
                c.check(got.shape == expected[name].shape and np.array_equal(got, expected[name]), f"{tag}: {name} differs")
        with h5py.File(f"{out}_dist/iter_{ITERATION:07d}/model.h5", "r") as h5:
            names = set(h5["model"].keys())
            c.check(names == set(expected), f"{tag} torch_dist: tensor names differ: {sorted(names ^ set(expected))}")
            for name in sorted(names & set(expected)):
                c.check(np.array_equal(h5["model"][name][()], expected[name]), f"{tag} torch_dist: {name} differs")
        meta = json.load(open(f"{out}_dist/iter_{ITERATION:07d}/metadata.json"))
        c.check(meta["training"]["iteration"] == ITERATION and meta["training"]["consumed_samples"] == CONSUMED,
                f"{tag} torch_dist: iteration and consumed samples")
        if pp == 1:
            check_logits(root, tied, qk, expected)
        print(f"{tag}: {len(expected)} tensors compared")
        if tp * pp == 1:  # a corrupted and a truncated .distcp: one-line errors, nothing written
            distcp = f"{root}_dist/iter_{ITERATION:07d}/__0_0.distcp"
            data = bytearray(open(distcp, "rb").read())
            at = len(data) // 3  # inside a tensor's stored bytes (the embedding and output layer fill most of the file)
            for what, damaged in (("flipped", data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1:]), ("truncated", data[:len(data) // 2])):
                open(distcp, "wb").write(damaged)
                p = run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", f"{root}_dist", f"{base}/bad"], check=False)
                err = p.stderr.strip()
                c.check(p.returncode == 1 and err.count("\n") == 0 and "distcp" in err and not os.path.exists(f"{base}/bad/latest"),
                        f"{tag}: {what} .distcp gives a one-line error: rc {p.returncode}: {err}")
                print(f"{what} .distcp: {err}")
        bad = run([DLM_CKPT, "validate", root], check=False)
        c.check(bad.returncode == 0 and "OK" in bad.stdout, f"{tag}: dlm-ckpt validate of the Megatron folder: {bad.stdout}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    case(1, 1, True, False)
    case(2, 2, False, False)
    case(2, 1, True, True)
    c.finish()
