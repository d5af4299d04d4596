"""dlm's Hugging Face export (dlm-ckpt convert --to hf; docs/checkpoints.md's mapping) loaded into
torch_reference.Model, so the PyTorch sampler and scorer run the weights dlm trained.

torch_reference.Model fixes RMSNorm's epsilon at 1e-6 and RoPE's base at 10000 and has no padding; a config.json
with another epsilon, base or attention layout is refused rather than run differently from dlm.
"""
import glob
import json
import os

import torch
from safetensors.torch import load_file

from torch_reference import Model


def load_export(folder, device, dtype):
    """(Model, config dict) of an exported folder, in eval mode on device in dtype."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    eps, base = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    if abs(eps - 1e-6) > 1e-12 or base != 10000 or cfg.get("rope_scaling"):
        raise SystemExit(f"{folder}/config.json: rms_norm_eps {eps}, rope_theta {base}, rope_scaling "
                         f"{cfg.get('rope_scaling')}: torch_reference.Model runs 1e-6, 10000 and none")
    heads, groups = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        w.update(load_file(f))
    c = dict(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads, groups=groups, head_dim=hd,
             ffn=cfg["intermediate_size"], vocab=cfg["vocab_size"],
             qk_norm="model.layers.0.self_attn.q_norm.weight" in w)
    model = Model(c)
    per = heads // groups
    state = {"emb.weight": w["model.embed_tokens.weight"], "ln_f": w["model.norm.weight"],
             "out.weight": w.get("lm_head.weight", w["model.embed_tokens.weight"])}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        q = w[p + "self_attn.q_proj.weight"].view(groups, per * hd, -1)
        k = w[p + "self_attn.k_proj.weight"].view(groups, hd, -1)
        v = w[p + "self_attn.v_proj.weight"].view(groups, hd, -1)
        # torch_reference's fused QKV: rows per KV group, the group's query heads, then its key and value.
        state[f"layers.{i}.qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, c["hidden"])
        state[f"layers.{i}.proj.weight"] = w[p + "self_attn.o_proj.weight"]
        state[f"layers.{i}.ln1"] = w[p + "input_layernorm.weight"]
        state[f"layers.{i}.ln2"] = w[p + "post_attention_layernorm.weight"]
        state[f"layers.{i}.fc1.weight"] = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        state[f"layers.{i}.fc2.weight"] = w[p + "mlp.down_proj.weight"]
        if c["qk_norm"]:
            state[f"layers.{i}.qn"] = w[p + "self_attn.q_norm.weight"]
            state[f"layers.{i}.kn"] = w[p + "self_attn.k_norm.weight"]
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.to(device).to(dtype).eval(), c
