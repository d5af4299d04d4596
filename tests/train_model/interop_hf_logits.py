"""Logits parity with transformers (CPU, fp32): random small LlamaForCausalLM / Qwen3ForCausalLM models
are saved with save_pretrained, loaded by dlm through libckpt's HF import (model_logits_tool), and
dlm's logits must match transformers' within 1e-4 relative (max |dlm - hf| / max |hf|):
causal; bidirectional against a 4-D all-visible attention mask (the DiffLM forward); left padding."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, transformers = require("torch", "transformers")
TOOL = sys.argv[1]
TOL = 1e-4


def random_model(arch, tied, seed):
    torch.manual_seed(seed)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                  rms_norm_eps=1e-6, tie_word_embeddings=tied, attention_bias=False)
    if arch == "llama":
        config = transformers.LlamaConfig(rope_theta=10000.0, mlp_bias=False, **common)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen3Config(rope_theta=1000000.0, **common)
        model = transformers.Qwen3ForCausalLM(config)
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))  # norms away from 1, so a skipped norm shows
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.config._attn_implementation = "eager"
    return model


def hf_logits(model, ids, attention=None, all_visible=False):
    ids_t = torch.tensor(ids)
    with torch.no_grad():
        if all_visible:  # additive 4-D mask of zeros: every position sees every other
            b, l = ids_t.shape
            mask = torch.zeros(b, 1, l, l, dtype=torch.float32)
            return model(input_ids=ids_t, attention_mask=mask).logits
        if attention is not None:
            att = torch.tensor(attention)
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            return model(input_ids=ids_t, attention_mask=att, position_ids=pos).logits
        return model(input_ids=ids_t).logits


def dlm_logits(folder, mode, ids, attention=None):
    request = {"ids": ids}
    if attention is not None:
        request["attention"] = attention
    out = json.loads(run([TOOL, folder, mode], input=json.dumps(request)).stdout)
    b, l = len(ids), len(ids[0])
    return torch.tensor(out["logits"]).reshape(b, l, out["vocab"]), out


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def main():
    c = Checks()
    tmp = workdir("hf_logits")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (2, 24), generator=gen).tolist()
    try:
        for arch, tied in [("llama", False), ("qwen3", False), ("qwen3", True), ("llama", True)]:
            model = random_model(arch, tied, seed=len(arch) + tied)
            folder = os.path.join(tmp, f"{arch}_{tied}")
            model.save_pretrained(folder, safe_serialization=True)
            what = f"{arch} tied={tied}"

            ref = hf_logits(model, ids)
            got, meta = dlm_logits(folder, "causal", ids)
            c.check(meta["padded_vocab"] == 384 and meta["vocab"] == 300, f"{what}: vocabulary 300 padded to 384")
            e = rel(got, ref)
            print(f"{what} causal: max relative error {e:.2e}")
            c.check(e < TOL, f"{what} causal logits within {TOL} ({e:.2e})")

            ref_bi = hf_logits(model, ids, all_visible=True)
            got_bi, _ = dlm_logits(folder, "bidirectional", ids)
            e = rel(got_bi, ref_bi)
            print(f"{what} bidirectional: max relative error {e:.2e}")
            c.check(e < TOL, f"{what} bidirectional logits within {TOL} ({e:.2e})")
            c.check(rel(ref_bi, ref) > 1e-2, f"{what}: the all-visible mask changes HF's logits (mask took effect)")

            # Left padding (batched prompts): padding keys never attended, positions = cumsum - 1.
            attention = [[0] * 5 + [1] * 19, [1] * 24]
            ref_pad = hf_logits(model, ids, attention=attention)
            got_pad, _ = dlm_logits(folder, "causal", ids, attention=attention)
            e = rel(got_pad[0, 5:], ref_pad[0, 5:])
            e2 = rel(got_pad[1], ref_pad[1])
            print(f"{what} left-padded causal: max relative error {max(e, e2):.2e}")
            c.check(max(e, e2) < TOL, f"{what} left-padded logits within {TOL} ({max(e, e2):.2e})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
