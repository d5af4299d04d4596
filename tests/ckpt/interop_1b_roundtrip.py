"""The ~1B-parameter round trip: a random LlamaForCausalLM-shaped HF folder (fp32, 961M parameters,
GQA 16 heads / 8 KV heads, vocabulary 50289 padded to 50304, several safetensors shards) goes
HF -> native TP1 -> TP2 PP2 -> TP4 PP1 -> HF with dlm-ckpt and must come back bit-exact.

Slow and disk-hungry (about 12 GB at a time, removed as it goes): skipped (exit 77) unless DLM_CKPT_1B=1.
usage: DLM_CKPT_1B=1 interop_1b_roundtrip.py DLM_CKPT [WORKDIR]"""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import SKIP, Checks, require, run, workdir  # noqa: E402

if os.environ.get("DLM_CKPT_1B") != "1":
    print("skipped: set DLM_CKPT_1B=1 to run the 1B-parameter round trip")
    sys.exit(SKIP)
np, st = require("numpy", "safetensors.numpy")
DLM_CKPT = sys.argv[1]
w = sys.argv[2] if len(sys.argv) > 2 else workdir("ckpt_1b")
c = Checks()
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
       "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
       "vocab_size": 50289, "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
       "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu"}
h, f, v, d = 2048, 5632, 50289, 128
shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
for i in range(16):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (16 * d, h), p + "self_attn.k_proj.weight": (8 * d, h),
                   p + "self_attn.v_proj.weight": (8 * d, h), p + "self_attn.o_proj.weight": (h, 16 * d),
                   p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f)})
try:
    src = f"{w}/hf_in"
    os.makedirs(src, exist_ok=True)
    rng = np.random.default_rng(1)
    index, shard, n_shard, total = {}, {}, 0, 0

    def flush():
        global shard, n_shard
        if shard:
            n_shard += 1
            name = f"model-{n_shard:05d}.safetensors"
            st.save_file(shard, f"{src}/{name}", metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard = {}

    for name, shape in shapes.items():
        shard[name] = rng.standard_normal(shape, dtype=np.float32)
        total += shard[name].size
        if sum(a.nbytes for a in shard.values()) > 1 << 30:
            flush()
    flush()
    json.dump({"metadata": {"total_size": total * 4}, "weight_map": index}, open(f"{src}/model.safetensors.index.json", "w"))
    json.dump(cfg, open(f"{src}/config.json", "w"))
    print(f"input: {total / 1e9:.3f}B parameters in {n_shard} shards")
    c.check(total > 0.9e9, "the model has about 1B parameters")

    steps = [("hf", "native", src, f"{w}/tp1", []), ("native", "native", f"{w}/tp1", f"{w}/tp2pp2", ["--tp", "2", "--pp", "2"]),
             ("native", "native", f"{w}/tp2pp2", f"{w}/tp4", ["--tp", "4", "--pp", "1"]), ("native", "hf", f"{w}/tp4", f"{w}/hf_out", ["--dtype", "fp32"])]
    previous = None
    for a, b, i, o, extra in steps:
        t = time.perf_counter()
        run([DLM_CKPT, "convert", "--from", a, "--to", b, *extra, i, o])
        print(f"{a} -> {b} {' '.join(extra)}: {time.perf_counter() - t:.1f} s")
        if b == "native":
            p = run([DLM_CKPT, "validate", o], check=False)
            c.check(p.returncode == 0, f"validate {o}: {p.stdout[-500:]}")
        if previous:
            shutil.rmtree(previous)
        previous = o if a == "native" or b == "native" else None
    out = {}
    for fname in sorted(os.listdir(f"{w}/hf_out")):
        if fname.endswith(".safetensors"):
            out.update(st.load_file(f"{w}/hf_out/{fname}"))
    c.check(set(out) == set(shapes), "tensor names")
    same = 0
    for fname in sorted(set(index.values())):
        for k, a in st.load_file(f"{src}/{fname}").items():
            same += bool(k in out and out[k].dtype == a.dtype and np.array_equal(out[k].view(np.uint32), a.view(np.uint32)))
    c.check(same == len(shapes), f"{same} of {len(shapes)} tensors bit-exact")
finally:
    shutil.rmtree(w, ignore_errors=True)
c.finish()
