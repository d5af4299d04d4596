"""dlm's Hugging Face export runs in MegaDLMs' inference path: a DiffLM made by dlm-train on the CPU
(initialized with std 0.3 and trained 10 iterations, so that its argmax and confidence vary along the
sequence and the order of unmasking decides the output) is exported with `dlm-ckpt convert --to hf`, loaded as examples/dlm_generation/dlm_inference.py does
(AutoTokenizer, left padding, AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True), then
model.generate(**inputs, temperature=, cfg=, remasking=, inference_block_size=, sample_steps=,
max_new_tokens=)), with eager attention on the CPU, and must return the token ids dlm-generate returns
on the same weights for three prompts of different lengths (one batch, left-padded): greedy, greedy
with classifier-free guidance, and (dlm's Philox stream, seed=) temperature + top-p and random
remasking. Also: loading without trust_remote_code gives transformers' plain Qwen3ForCausalLM with
every tensor; the default export is bf16; --num-shards writes that many shards and an index.

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


w = workdir("hf_remote")
try:
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer_vocab = len(tok)
    prefix = make_corpus(w, tok)
    ckpt = os.path.join(w, "ckpt")
    run([DLM_TRAIN, "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
         "--group-query-attention", "--num-query-groups", "2", "--qk-layernorm", "--seq-length", "64",
         "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "1e-3", "--train-iters", "10",
         "--init-method-std", "0.3",
         "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER, "--data-path", prefix,
         "--split", "100,0,0", "--data-cache-path", os.path.join(w, "cache"), "--threads", "2", "--seed", "7",
         "--device", "cpu", "--attention-mask-type", "no_mask", "--save", ckpt])

    hf = os.path.join(w, "hf")
    run([DLM_CKPT, "convert", "--from", "native", "--to", "hf", "--dtype", "fp32", "--tokenizer", TOKENIZER, ckpt, hf])
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
    shape = dict(max_new_tokens=16, inference_block_size=8, sample_steps=8)
    shape_flags = ["--max-new-tokens", "16", "--inference-block-size", "8", "--sample-steps", "8"]
    for name, kw, flags in cases:
        x = model.generate(**inputs, **shape, verbose=False, **kw)
        mine = x[:, inputs["input_ids"].shape[1]:].tolist()
        theirs = dlm_generate(ckpt, ids, shape_flags + flags)
        c.check(mine == theirs, f"{name}: HF generate {mine} != dlm-generate {theirs}")
        print(f"{name}: {[tok.decode(t) for t in mine]}")
        # Not a degenerate case where the order of unmasking cannot matter.
        c.check(cfg["mask_token_id"] not in sum(mine, []) and len(set(sum(mine, []))) >= 6, f"{name}: varied tokens decoded")

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
    x16 = m16.generate(**inputs, **shape, temperature=0.0, cfg=0.0, remasking="low_confidence")
    c.check(x16.shape == (3, inputs["input_ids"].shape[1] + 16), f"bf16 generate shape {tuple(x16.shape)}")
finally:
    shutil.rmtree(w, ignore_errors=True)
c.finish()
