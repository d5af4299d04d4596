"""dlm's Hugging Face export runs in MegaDLMs' inference path. A DiffLM made by dlm-train on the CPU
(init std 0.3, 10 iterations: its argmax and confidence vary along the sequence, so the order of
unmasking decides the output) is exported with `dlm-ckpt convert --to hf --dtype fp32` and loaded as
examples/dlm_generation/dlm_inference.py does (AutoTokenizer with left padding,
AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True), model.generate(**inputs,
temperature=, cfg=, remasking=, inference_block_size=, sample_steps=, max_new_tokens=)), eager
attention on the CPU. It must return dlm-generate's token ids on the same weights for three prompts of
three lengths in one left-padded batch: Qwen3-shaped (q/k norms, tied): greedy, greedy + cfg, T + top-p
and random remasking + cfg (dlm's Philox stream, seed=); Llama-shaped (untied): greedy, greedy + cfg,
and sdpa = eager. Also: without trust_remote_code transformers loads its plain Qwen3/Llama with every
tensor; the logits equal Qwen3's given an all-visible mask; the export's default is bf16; --num-shards
writes that many shards and the index.

usage: interop_hf_remote.py DLM_TRAIN DLM_CKPT DLM_GENERATE"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, transformers, np, st = require("torch", "transformers", "numpy", "safetensors.torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from facts_corpus import TOKENIZER, make_corpus  # noqa: E402

if not os.path.isdir(TOKENIZER):
    print(f"skipped: {TOKENIZER} is missing")
    sys.exit(77)
DLM_TRAIN, DLM_CKPT, DLM_GENERATE = sys.argv[1:4]
PROMPTS = ["The capital of France is", "Water boils at", "The largest planet of the solar system is called"]
c = Checks()


def dlm_generate(ckpt, ids, flags):
    """dlm-generate on token ids (NullTokenizer: ids in, ids out), every prompt in one batch."""
    vocab = str(tokenizer_vocab)
    cmd = [DLM_GENERATE, "--load", ckpt, "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "none", "--vocab-size",
           vocab, "--threads", "1", "--device", "cpu", "--no-eos-stop", "--prompt"] + [" ".join(map(str, p)) for p in ids] + flags
    lines = run(cmd).stdout.strip().split("\n")
    return [[int(t) for t in line.split()][len(p):] for line, p in zip(lines, ids)]


def train_and_export(name, shape_flags):
    """A DiffLM of dlm-train (10 iterations from init std 0.3) and its fp32 HF export."""
    ckpt, hf = os.path.join(w, name), os.path.join(w, name + "_hf")
    run([DLM_TRAIN, "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
         "--group-query-attention", "--num-query-groups", "2", "--seq-length", "64", "--micro-batch-size", "4",
         "--global-batch-size", "8", "--lr", "1e-3", "--train-iters", "10", "--init-method-std", "0.3",
         "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER, "--data-path", prefix,
         "--split", "100,0,0", "--data-cache-path", os.path.join(w, "cache"), "--threads", "2", "--seed", "7",
         "--device", "cpu", "--attention-mask-type", "no_mask", "--save", ckpt] + shape_flags)
    run([DLM_CKPT, "convert", "--from", "native", "--to", "hf", "--dtype", "fp32", "--tokenizer", TOKENIZER, ckpt, hf])
    return ckpt, hf


def same_tokens(name, model, ckpt, kw, flags):
    x = model.generate(**inputs, **SHAPE, verbose=False, **kw)
    mine = x[:, inputs["input_ids"].shape[1]:].tolist()
    theirs = dlm_generate(ckpt, ids, SHAPE_FLAGS + flags)
    c.check(mine == theirs, f"{name}: HF generate {mine} != dlm-generate {theirs}")
    print(f"{name}: {[tok.decode(t) for t in mine]}")
    # Not a degenerate case where the order of unmasking cannot matter.
    flat = sum(mine, [])
    c.check(model.config.mask_token_id not in flat and len(set(flat)) >= 6, f"{name}: varied tokens decoded")
    return mine


SHAPE = dict(max_new_tokens=16, inference_block_size=8, sample_steps=8)
SHAPE_FLAGS = ["--max-new-tokens", "16", "--inference-block-size", "8", "--sample-steps", "8"]
w = workdir("hf_remote")
try:
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer_vocab = len(tok)
    prefix = make_corpus(w, tok)
    ckpt, hf = train_and_export("qwen3", ["--qk-layernorm"])  # tied embeddings (dlm-train's default)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    c.check(cfg.get("auto_map") == {"AutoConfig": "configuration_difflm.DiffLMConfig",
                                    "AutoModelForCausalLM": "modeling_difflm.DiffLM"}, f"auto_map: {cfg.get('auto_map')}")
    c.check(cfg["model_type"] == "qwen3" and cfg["attn_mask_type"] == "bidirectional", "model_type qwen3, bidirectional")
    for f in ("configuration_difflm.py", "modeling_difflm.py"):
        src = os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "libckpt/hf_remote", f)
        c.check(open(os.path.join(hf, f)).read() == open(src).read(), f"{f} written beside the weights as in the repository")

    # Without remote code: transformers' own Qwen3, every tensor loaded, equal to the file's.
    plain, info = transformers.AutoModelForCausalLM.from_pretrained(hf, output_loading_info=True)
    c.check(type(plain).__name__ == "Qwen3ForCausalLM", f"plain load is {type(plain).__name__}")
    c.check(not info["missing_keys"] and not info["unexpected_keys"], f"plain load keys: {info}")

    # MegaDLMs' call pattern (dlm_inference.py), eager attention on the CPU.
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype="auto", trust_remote_code=True,
                                                              attn_implementation="eager")
    c.check(type(model).__name__ == "DiffLM", f"remote load is {type(model).__name__}")
    files = st.load_file(os.path.join(hf, "model.safetensors"))
    sd = model.state_dict()
    c.check(all(torch.equal(sd[k], v) for k, v in files.items()) and set(files) <= set(sd), "remote model's tensors = the file's")
    # The forward is Qwen3's with every key visible: transformers' own Qwen3 given an all-zero additive
    # 4D mask gives the same logits (a wrong RoPE table or an uninitialized buffer shows here).
    probe = torch.tensor([[510, 5347, 273, 6181, 310, cfg["mask_token_id"], cfg["mask_token_id"], 17]])
    ours = model(probe).logits
    full = torch.zeros(1, 1, probe.shape[1], probe.shape[1])
    theirs = plain(probe, attention_mask=full).logits.float()
    c.check(torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), f"logits = Qwen3's with a full mask (max diff {(ours - theirs).abs().max():.3g})")
    inputs = tok(PROMPTS, return_tensors="pt", padding_side="left", padding=True)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    c.check(len({len(i) for i in ids}) == 3, f"three prompt lengths {[len(i) for i in ids]} (left padding exercised)")

    cases = [("greedy", dict(temperature=0.0, cfg=0.0, remasking="low_confidence"), []),
             ("greedy+cfg", dict(temperature=0.0, cfg=1.5, remasking="low_confidence"), ["--cfg-scale", "1.5"]),
             ("T=0.9 top_p=0.9 seed=5", dict(temperature=0.9, top_p=0.9, cfg=0.0, remasking="low_confidence", seed=5),
              ["--temperature", "0.9", "--top-p", "0.9", "--seed", "5"]),
             ("random remasking+cfg seed=2", dict(temperature=0.0, cfg=0.5, remasking="random", seed=2),
              ["--remasking", "random", "--cfg-scale", "0.5", "--seed", "2"])]
    for name, kw, flags in cases:
        same_tokens(name, model, ckpt, kw, flags)

    # A Llama-shaped DiffLM (no q/k norms, untied output layer): model_type llama, plain load Llama;
    # sdpa attention gives eager's tokens.
    ckpt_l, hf_l = train_and_export("llama", ["--untie-embeddings-and-output-weights"])
    cfg_l = json.load(open(os.path.join(hf_l, "config.json")))
    c.check(cfg_l["model_type"] == "llama" and "auto_map" in cfg_l, f"llama export: {cfg_l.get('model_type')}")
    plain_l, info = transformers.AutoModelForCausalLM.from_pretrained(hf_l, output_loading_info=True)
    c.check(type(plain_l).__name__ == "LlamaForCausalLM" and not info["missing_keys"] and not info["unexpected_keys"],
            f"llama plain load: {type(plain_l).__name__} {info}")
    model_l = transformers.AutoModelForCausalLM.from_pretrained(hf_l, trust_remote_code=True, attn_implementation="eager")
    c.check(not model_l.config.qk_layernorm and hasattr(model_l, "lm_head"), "llama DiffLM: no q/k norms, an lm_head")
    greedy_l = same_tokens("llama greedy", model_l, ckpt_l, cases[0][1], cases[0][2])
    same_tokens("llama greedy+cfg", model_l, ckpt_l, cases[1][1], cases[1][2])
    sdpa = transformers.AutoModelForCausalLM.from_pretrained(hf_l, trust_remote_code=True, attn_implementation="sdpa")
    x = sdpa.generate(**inputs, **SHAPE, **cases[0][1])
    c.check(x[:, inputs["input_ids"].shape[1]:].tolist() == greedy_l, "llama greedy: sdpa tokens = eager tokens")

    # dlm-ckpt's defaults: bf16; --num-shards: that many shards and transformers' index.
    hf16 = os.path.join(w, "hf_bf16")
    run([DLM_CKPT, "convert", "--from", "native", "--to", "hf", "--num-shards", "3", "--tokenizer", TOKENIZER, ckpt, hf16])
    index = json.load(open(os.path.join(hf16, "model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    c.check(shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)], f"shards {shards}")
    c.check(json.load(open(os.path.join(hf16, "config.json")))["torch_dtype"] == "bfloat16", "default export is bf16")
    m16 = transformers.AutoModelForCausalLM.from_pretrained(hf16, dtype="auto", trust_remote_code=True,
                                                            attn_implementation="eager")
    c.check(m16.model.embed_tokens.weight.dtype == torch.bfloat16, "bf16 export loads as bf16")
    c.check(torch.equal(m16.model.embed_tokens.weight, model.model.embed_tokens.weight.to(torch.bfloat16)),
            "bf16 weights = torch's rounding of the fp32 export")
    x16 = m16.generate(**inputs, **SHAPE, temperature=0.0, cfg=0.0, remasking="low_confidence")
    c.check(x16.shape == (3, inputs["input_ids"].shape[1] + 16), f"bf16 generate shape {tuple(x16.shape)}")
finally:
    shutil.rmtree(w, ignore_errors=True)
c.finish()
