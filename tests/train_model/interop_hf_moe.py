"""Mixture-of-experts parity with transformers' Qwen3MoeForCausalLM (CPU, fp32): tiny random models are saved
with save_pretrained, loaded by dlm through libckpt's HF import (model_moe_tool), and one causal training step
is compared: logits, mean cross-entropy, every parameter's gradient of
    mean CE + sum over MoE layers (Megatron's aux loss + z-loss)
with the router losses written here in torch on transformers' router logits (dlm uses Megatron's formulas,
docs/moe.md), cosine >= 0.999 and max |dlm - hf| <= GRAD_TOL * max |hf| per tensor; transformers' own
load_balancing_loss_func value against the one dlm's per-layer statistics give; the --to hf round trip
loads in transformers with equal tensors, also through dlm-ckpt convert --from hf --to native (pp 2) and
--to hf."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, transformers, safetensors = require("torch", "transformers", "safetensors")
from safetensors.torch import load_file  # noqa: E402

TOOL, DLM_CKPT = sys.argv[1], sys.argv[2]
LOGIT_TOL = 1e-4   # max |dlm - hf| / max |hf|
GRAD_TOL = 1e-3    # per tensor, max |dlm - hf| / max |hf|
COS = 0.999
E, K = 8, 2


def random_model(seed, norm_topk, mlp_only, tied):
    torch.manual_seed(seed)
    config = transformers.Qwen3MoeConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=E,
        num_experts_per_tok=K, norm_topk_prob=norm_topk, mlp_only_layers=mlp_only, decoder_sparse_step=1,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=tied, router_aux_loss_coef=0.01)
    model = transformers.Qwen3MoeForCausalLM(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.config._attn_implementation = "eager"
    return model


def megatron_router_losses(router_logits, aux_coeff, z_coeff):
    """Megatron's switch_load_balancing_loss_func and z_loss_func per MoE layer, summed."""
    total = 0
    for logits in router_logits:
        n = logits.shape[0]
        probs = torch.softmax(logits.float(), dim=-1)
        _, chosen = torch.topk(probs, K, dim=-1)
        counts = torch.zeros(E).scatter_add_(0, chosen.reshape(-1), torch.ones(chosen.numel())).detach()
        total = total + (probs.sum(0) * counts).sum() * (E * aux_coeff / (K * n * n))
        total = total + torch.logsumexp(logits, dim=-1).square().mean() * z_coeff
    return total


def hf_grads_by_saved_name(model):
    """The gradients under the names save_pretrained writes (experts one tensor each)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if name.endswith("mlp.experts.gate_up_proj"):
            base, f = name[: -len("gate_up_proj")], g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = g[e, :f]
                out[f"{base}{e}.up_proj.weight"] = g[e, f:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(g.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = g[e]
        else:
            out[name] = g
    return out


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp(min=1e-300))


def main():
    c = Checks()
    tmp = workdir("hf_moe")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (2, 16), generator=gen)
    labels = torch.randint(0, 300, (2, 16), generator=gen)
    labels[0, :3] = -100  # ignored positions
    try:
        for case, (norm_topk, mlp_only, tied, z_coeff) in enumerate(
                [(False, [], False, 0.0), (True, [0], False, 1e-3), (True, [], True, 1e-2)]):
            what = f"norm_topk_prob={norm_topk} mlp_only_layers={mlp_only} tied={tied} z={z_coeff}"
            model = random_model(10 + case, norm_topk, mlp_only, tied)
            folder = os.path.join(tmp, f"hf{case}")
            model.save_pretrained(folder, safe_serialization=True)
            out_dir = os.path.join(tmp, f"dlm{case}")
            request = {"ids": ids.tolist(), "labels": labels.where(labels >= 0, -1).tolist()}
            got = json.loads(run([TOOL, folder, out_dir, z_coeff], input=json.dumps(request)).stdout)

            aux_coeff = model.config.router_aux_loss_coef * K  # what dlm's HF import sets (docs/moe.md)
            model.zero_grad()
            out = model(input_ids=ids, output_router_logits=True)
            logits = out.logits
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 300), labels.reshape(-1), ignore_index=-100)
            router = megatron_router_losses(out.router_logits, aux_coeff, z_coeff)
            (ce + router).backward()
            ce, router = ce.item(), router.item()

            e = rel(torch.tensor(got["logits"]).reshape(logits.shape), logits.detach())
            print(f"{what}: logits max relative error {e:.2e}")
            c.check(e < LOGIT_TOL, f"{what}: logits within {LOGIT_TOL} ({e:.2e})")
            c.check(abs(got["loss"] - ce) < 1e-5 * ce, f"{what}: loss {got['loss']} vs {ce}")
            moe_layers = [l for l in range(2) if l not in mlp_only]
            c.check([m["layer"] for m in got["moe"]] == moe_layers, f"{what}: MoE layers {got['moe']}")
            dlm_router = sum(m["aux_loss"] + m["z_loss"] for m in got["moe"])
            c.check(abs(dlm_router - router) <= 1e-5 * abs(router),
                    f"{what}: router losses {dlm_router} vs {router}")

            # transformers' own aux loss (all MoE layers' counts and probabilities pooled) from dlm's statistics.
            n = ids.numel() * len(moe_layers)
            counts = torch.tensor([m["tokens_per_expert"] for m in got["moe"]], dtype=torch.float64).sum(0)
            probs = torch.tensor([m["aux_probability_sum"] for m in got["moe"]], dtype=torch.float64).sum(0)
            hf_aux = out.aux_loss.item()
            from_dlm = float(E * (counts / n * probs / n).sum())
            print(f"{what}: transformers' aux loss {hf_aux:.6f}, from dlm's router statistics {from_dlm:.6f}")
            c.check(abs(hf_aux - from_dlm) <= 1e-5 * hf_aux, f"{what}: HF aux loss {hf_aux} vs {from_dlm}")

            hf = hf_grads_by_saved_name(model)
            dlm = load_file(os.path.join(out_dir, "grads", "model.safetensors"))
            c.check(sorted(hf) == sorted(dlm) or (tied and sorted(set(hf) - {"lm_head.weight"}) == sorted(dlm)),
                    f"{what}: gradient names {sorted(set(hf) ^ set(dlm))}")
            worst_cos, worst_rel = 1.0, 0.0
            unrouted = 0
            for name, g in dlm.items():
                ref = hf[name]
                if not ref.any():  # an expert no token chose: no gradient on either side
                    unrouted += 1
                    c.check(not g.any(), f"{what}: gradient {name} is zero in transformers, not in dlm")
                    continue
                cs, r = cosine(g, ref), rel(g, ref)
                worst_cos, worst_rel = min(worst_cos, cs), max(worst_rel, r)
                c.check(cs >= COS and r <= GRAD_TOL, f"{what}: gradient {name}: cosine {cs:.6f}, max rel {r:.2e}")
            print(f"{what}: {len(dlm)} gradients ({unrouted} of unrouted experts, zero in both), worst cosine {worst_cos:.7f}, worst max relative error {worst_rel:.2e}")

            back = transformers.Qwen3MoeForCausalLM.from_pretrained(os.path.join(out_dir, "roundtrip")).float()
            orig = dict(model.named_parameters())
            same = all(torch.equal(p, orig[n]) for n, p in back.named_parameters())
            c.check(same, f"{what}: --to hf round trip loads with equal tensors")
            native, hf_out = os.path.join(tmp, f"native{case}"), os.path.join(tmp, f"hf_out{case}")
            run([DLM_CKPT, "convert", "--from", "hf", "--to", "native", "--pp", "2", folder, native])
            run([DLM_CKPT, "convert", "--from", "native", "--to", "hf", "--dtype", "fp32", native, hf_out])
            converted = transformers.Qwen3MoeForCausalLM.from_pretrained(hf_out).float()
            same = all(torch.equal(p, orig[n]) for n, p in converted.named_parameters())
            c.check(same, f"{what}: dlm-ckpt convert hf -> native (pp 2) -> hf gives equal tensors")
            c.check(back.config.norm_topk_prob == norm_topk and list(back.config.mlp_only_layers) == mlp_only and
                    abs(back.config.router_aux_loss_coef - 0.01) < 1e-12,
                    f"{what}: round-trip config {back.config.norm_topk_prob} {back.config.mlp_only_layers}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
