"""HF -> native TP1 -> TP2 PP2 -> TP4 PP1 -> HF with dlm-ckpt, checked by the real clients:
safetensors (bit-exact tensors), transformers' AutoModelForCausalLM (no missing/unexpected keys, equal
tensors and logits), h5py (model.h5's virtual datasets equal the fused tensors computed here in numpy).

usage: interop_hf_roundtrip.py DLM_CKPT [--layers N --hidden H ...]  (defaults: small real-shaped models
with the MegaDLMs GPT-NeoX tokenizer's vocabulary)."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, transformers, h5py, np, st = require("torch", "transformers", "h5py", "numpy", "safetensors.torch")

TOKENIZER = "/work/shared/assets/gptneox-dlm"
DLM_CKPT = sys.argv[1]
c = Checks()


def make_model(kind, tied, mask):
    common = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=50289, max_position_embeddings=512,
                  tie_word_embeddings=tied, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(head_dim=16, **common)
    else:
        cfg = transformers.Qwen3Config(head_dim=16, rope_theta=1e6, **common)
    if mask:
        cfg.mask_token_id = 50277
        cfg.attn_mask_type = "bidirectional"
        cfg.architectures = ["DiffLM"]
    torch.manual_seed(0)
    model = getattr(transformers, "LlamaForCausalLM" if kind == "llama" else "Qwen3ForCausalLM")(cfg).float()
    with torch.no_grad():  # norms away from 1 so that a swapped norm shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def numpy_native(sd, cfg):
    """dlm's fused tensors of layer 1 and the padded embedding, written independently in numpy."""
    g, h, d = cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["head_dim"]
    q, k, v = (sd[f"model.layers.1.self_attn.{x}_proj.weight"].numpy() for x in "qkv")
    per = h // g
    rows = []
    for i in range(g):
        rows += [q[i * per * d:(i + 1) * per * d], k[i * d:(i + 1) * d], v[i * d:(i + 1) * d]]
    emb = sd["model.embed_tokens.weight"].numpy()
    padded = np.zeros((50304, emb.shape[1]), np.float32)
    padded[:emb.shape[0]] = emb
    return {"decoder.layers.1.self_attention.linear_qkv.weight": np.concatenate(rows),
            "decoder.layers.1.mlp.linear_fc1.weight": np.concatenate(
                [sd["model.layers.1.mlp.gate_proj.weight"].numpy(), sd["model.layers.1.mlp.up_proj.weight"].numpy()]),
            "decoder.layers.1.mlp.linear_fc2.weight": sd["model.layers.1.mlp.down_proj.weight"].numpy(),
            "embedding.word_embeddings.weight": padded}


def h5_tensors(ckpt_root):
    latest = open(os.path.join(ckpt_root, "latest")).read().strip()
    return h5py.File(os.path.join(ckpt_root, latest, "model.h5"), "r")


def case(kind, tied, mask):
    name = f"{kind}{'-tied' if tied else ''}{'-difflm' if mask else ''}"
    w = workdir("hf_" + name)
    try:
        model = make_model(kind, tied, mask)
        src = os.path.join(w, "hf_in")
        model.save_pretrained(src, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(TOKENIZER, f)):
                shutil.copy(os.path.join(TOKENIZER, f), src)
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        cfg_in = json.load(open(os.path.join(src, "config.json")))

        run([DLM_CKPT, "convert", "--from", "hf", "--to", "native", src, f"{w}/tp1"])
        run([DLM_CKPT, "convert", "--from", "native", "--to", "native", "--tp", "2", "--pp", "2", f"{w}/tp1", f"{w}/tp2pp2"])
        run([DLM_CKPT, "convert", "--from", "native", "--to", "native", "--tp", "4", "--pp", "1", f"{w}/tp2pp2", f"{w}/tp4"])
        run([DLM_CKPT, "convert", "--from", "native", "--to", "hf", "--dtype", "fp32", f"{w}/tp4", f"{w}/hf_out"])
        for d in ("tp1", "tp2pp2", "tp4", "hf_out"):
            p = run([DLM_CKPT, "validate", f"{w}/{d}"], check=False)
            c.check(p.returncode == 0 and p.stdout.strip().endswith("OK"), f"{name}: validate {d}: {p.stdout}{p.stderr}")
        p = run([DLM_CKPT, "validate", f"{w}/hf_out", "--against", src], check=False)
        c.check(p.returncode == 0, f"{name}: validate --against the input: {p.stdout}")

        # safetensors: every tensor bit-exact, same names.
        out = {}
        for f in os.listdir(f"{w}/hf_out"):
            if f.endswith(".safetensors"):
                out.update(st.load_file(f"{w}/hf_out/{f}"))
        ref = {k: v for k, v in sd.items() if not (tied and k == "lm_head.weight")}
        c.check(set(out) == set(ref), f"{name}: tensor names {sorted(set(out) ^ set(ref))}")
        c.check(all(torch.equal(out[k], ref[k]) for k in ref if k in out), f"{name}: tensors differ after the round trip")
        cfg_out = json.load(open(f"{w}/hf_out/config.json"))
        diff = {k for k in cfg_in if k not in ("transformers_version",) and cfg_in[k] != cfg_out.get(k)}
        c.check(not diff, f"{name}: config.json fields changed: {diff}")
        # Only a masked-diffusion model names remote code (interop_hf_remote.py runs it).
        c.check(("auto_map" in cfg_out) == mask and os.path.exists(f"{w}/hf_out/modeling_difflm.py") == mask,
                f"{name}: auto_map {cfg_out.get('auto_map')}")
        meta = json.load(open(os.path.join(w, "tp4", open(f"{w}/tp4/latest").read().strip(), "metadata.json")))
        theta = cfg_in.get("rope_theta", cfg_in.get("rope_parameters", {}).get("rope_theta"))
        c.check(meta["model"]["rotary_base"] == theta, f"{name}: rotary_base {meta['model']['rotary_base']} != {theta}")
        c.check(meta["model"]["num_query_groups"] == 4 and meta["model"]["kv_channels"] == 16, f"{name}: native config")
        c.check(os.path.exists(f"{w}/hf_out/tokenizer.json"), f"{name}: tokenizer.json not copied along")

        # transformers loads the export with nothing missing or unexpected, and computes the same logits.
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(f"{w}/hf_out", output_loading_info=True)
        c.check(not info["missing_keys"] and not info["unexpected_keys"], f"{name}: loading info {info}")
        lsd = loaded.state_dict()
        c.check(all(torch.equal(lsd[k], sd[k]) for k in sd), f"{name}: transformers' tensors differ")
        ids = torch.tensor([[0, 17, 400, 50277, 9, 50000]])
        with torch.no_grad():
            c.check(torch.equal(loaded(ids).logits, model(ids).logits), f"{name}: logits differ")

        # h5py reads model.h5 of each layout with no dlm code: the fused tensors, whole.
        expect = numpy_native(sd, cfg_in)
        for d in ("tp1", "tp2pp2", "tp4"):
            with h5_tensors(f"{w}/{d}") as f:
                for tname, arr in expect.items():
                    got = f["model"][tname][...]
                    c.check(got.shape == arr.shape and np.array_equal(got, arr), f"{name}: h5py {d} {tname}")
                c.check(len(f["model"]) == len(f["model"].keys()) and "exp_avg" not in f, f"{name}: h5py groups {list(f)}")
        # bf16 export: torch's own rounding of the fp32 weights.
        run([DLM_CKPT, "convert", "--from", "native", "--to", "hf", "--dtype", "bf16", f"{w}/tp2pp2", f"{w}/hf_bf16"])
        b = st.load_file(f"{w}/hf_bf16/model.safetensors")
        c.check(all(b[k].dtype == torch.bfloat16 and torch.equal(b[k], ref[k].to(torch.bfloat16)) for k in ref),
                f"{name}: bf16 export differs from torch's rounding")
        c.check(json.load(open(f"{w}/hf_bf16/config.json"))["torch_dtype"] == "bfloat16", f"{name}: torch_dtype")
        print(f"{name}: ok")
    finally:
        shutil.rmtree(w, ignore_errors=True)


case("llama", False, False)
case("llama", True, False)
case("qwen3", False, False)
case("qwen3", False, True)
c.finish()
