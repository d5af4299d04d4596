"""AR -> masked diffusion, as Dream and DiffuLLaMA were made: a causal Qwen3ForCausalLM written by
transformers goes through `dlm-ckpt convert --from hf`, and `dlm-train --load ... --attention-mask-type
no_mask` starts a masked-diffusion run from its weights on the CPU. Checks: the log states the mask
change; the run starts from the converted weights (one iteration at lr 0 leaves them equal to the HF
model's); 50 iterations take the loss down; a checkpoint a run has trained keeps refusing another mask,
unless `--finetune` starts a new run from its weights (as `dlm-train --finetune --load AR --attention-mask-type
no_mask` turns a trained causal run into a masked-diffusion one).

usage: interop_ar_to_dlm.py DLM_TRAIN DLM_CKPT"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "tests/interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, transformers = require("torch", "transformers")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from facts_corpus import TOKENIZER, make_corpus  # noqa: E402

if not os.path.isdir(TOKENIZER):
    print(f"skipped: {TOKENIZER} is missing")
    sys.exit(77)
DLM_TRAIN, DLM_CKPT = sys.argv[1:3]
c = Checks()

w = workdir("ar_to_dlm")
try:
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    prefix = make_corpus(w, tok)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=len(tok), max_position_embeddings=512,
                                   tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).float().save_pretrained(os.path.join(w, "ar_hf"), safe_serialization=True)
    run([DLM_CKPT, "convert", "--from", "hf", "--to", "native", os.path.join(w, "ar_hf"), os.path.join(w, "ar")])

    def train(load, save, iters, lr, mask, check=True, extra=()):
        metrics = os.path.join(w, f"{os.path.basename(save)}.jsonl")
        p = run([DLM_TRAIN, "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
                 "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16", "--qk-layernorm",
                 "--untie-embeddings-and-output-weights", "--norm-epsilon", "1e-6", "--log-interval", "1", "--max-position-embeddings", "512",
                 "--seq-length", "64", "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", lr,
                 "--train-iters", str(iters), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER,
                 "--data-path", prefix, "--split", "100,0,0", "--data-cache-path", os.path.join(w, "cache"), "--threads", "2",
                 "--seed", "7", "--device", "cpu", "--attention-mask-type", mask, "--load", load, "--save", save,
                 "--metrics-file", metrics, *extra], check=check)
        losses = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line] if p.returncode == 0 else []
        return p, losses

    # lr 0: the weights the run starts from are the causal model's (not a fresh initialization).
    p, _ = train(os.path.join(w, "ar"), os.path.join(w, "still"), 1, "0", "no_mask")
    log = p.stdout + p.stderr
    c.check("the checkpoint's attention is causal, this run trains it bidirectional" in log, f"mask change not in the log:\n{log}")
    v = run([DLM_CKPT, "validate", os.path.join(w, "still"), "--against", os.path.join(w, "ar_hf")], check=False)
    c.check(v.returncode == 0, f"lr 0: weights differ from the HF model's:\n{v.stdout}")

    p, losses = train(os.path.join(w, "ar"), os.path.join(w, "dlm"), 50, "3e-3", "no_mask")
    c.check(len(losses) == 50, f"{len(losses)} losses")
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"masked-diffusion loss: first 10 iterations {first:.3f}, last 10 {last:.3f}")
    c.check(last < 0.6 * first, f"loss not going down: {first:.3f} -> {last:.3f}")
    meta = json.load(open(os.path.join(w, "dlm", open(os.path.join(w, "dlm", "latest")).read().strip(), "metadata.json")))
    c.check(meta["model"]["attention_mask"] == "bidirectional", f"saved mask {meta['model']['attention_mask']}")

    # A trained checkpoint keeps its mask: resuming it causal is refused, naming the mask.
    p, _ = train(os.path.join(w, "dlm"), os.path.join(w, "back"), 60, "3e-3", "causal", check=False)
    c.check(p.returncode != 0 and "attention mask" in p.stderr, f"resume with another mask: rc {p.returncode} {p.stderr}")
    # --finetune: the trained run's weights start a new run, and the mask may change (stated in the log).
    p, losses = train(os.path.join(w, "dlm"), os.path.join(w, "ft"), 2, "3e-3", "causal", check=False, extra=("--finetune",))
    log = p.stdout + p.stderr
    c.check(p.returncode == 0 and len(losses) == 2, f"--finetune with another mask: rc {p.returncode} {p.stderr}")
    c.check("this run trains it causal" in log, f"--finetune mask change not in the log:\n{log}")
finally:
    shutil.rmtree(w, ignore_errors=True)
c.finish()
