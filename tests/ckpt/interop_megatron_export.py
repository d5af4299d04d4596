"""dlm-ckpt convert --to megatron, opened by megatron-core 0.16.1's own loader on the CPU (gloo).

Case 1: a transformers Qwen3 (q/k norms, GQA, untied, 500-id vocabulary padded to 512) -> dlm native
(--from hf) -> Megatron torch_dist with --target-tensor-parallel-size 2. megatron-core's GPTModel (local
spec, RMSNorm, SwiGLU, RoPE) is built in TP1 (one process) and TP2 (two gloo processes) and loads it with
dist_checkpointing.load(model.sharded_state_dict(), dir) and load_state_dict (strict): every local tensor
must equal its slice of dlm's global tensor (h5py of model.h5), and megatron's logits (TP2 gathered) must
equal transformers' on a fixed input. Then --from megatron gives back dlm's tensors bit for bit.
Case 2: megatron-core's own torch_dist checkpoint (TP2, no q/k norms, iteration 42, 1344 consumed
samples) -> --from megatron -> native -> --to megatron -> megatron-core in PP2 (two processes; untied, as
megatron-core's tied PP embedding group needs CUDA): every tensor equals megatron's original, and
common.pt carries the iteration and consumed samples.

usage: interop_megatron_export.py DLM_CKPT"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_megatron as im  # noqa: E402  (build_model, logits, dlm_name, expected_tensors, save_rank)
from dlm_interop import Checks, require, run, workdir  # noqa: E402

torch, h5py, np = require("torch", "h5py", "numpy")
transformers, = require("transformers")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

DLM_CKPT = sys.argv[1]
VOCAB = 500
c = Checks()


def local_slice(name, full, tp, r):
    """Megatron's TP shard r of a global dlm tensor."""
    if full.ndim == 1:
        return full
    if name.endswith("linear_fc1.weight"):
        half = full.shape[0] // 2
        g, u = np.split(full[:half], tp), np.split(full[half:], tp)
        return np.concatenate([g[r], u[r]])
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return np.split(full, tp, axis=1)[r]
    return np.split(full, tp, axis=0)[r]


def load_rank(rank, world, tp, pp, qk, tied, ckpt, expected_npz, out, port):
    """Builds megatron's model for (tp, pp), loads the checkpoint with dist_checkpointing, compares."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps, dist_checkpointing
    ps.initialize_model_parallel(tp, pp)
    model = im.build_model(tp, pp, qk, tied)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)  # nothing of the fresh model may survive the load
    loaded = dist_checkpointing.load(model.sharded_state_dict(), ckpt)
    common = {k: loaded.pop(k) for k in ("args", "iteration", "checkpoint_version")}
    model.load_state_dict(loaded, strict=True)
    expected = dict(np.load(expected_npz))
    tr, pr = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    offset = pr * (im.LAYERS // pp)
    bad, compared = [], 0
    for k, v in model.state_dict().items():
        if not isinstance(v, torch.Tensor) or k.endswith("_extra_state"):
            continue
        name = im.dlm_name(k, offset)
        if tied and name == "output_layer.weight":
            name = "embedding.word_embeddings.weight"
        want = local_slice(name, expected[name], tp, tr)
        compared += 1
        if v.shape != want.shape or not np.array_equal(v.float().numpy(), want):
            bad.append(k)
    a = common["args"]
    result = {"bad": bad, "compared": compared, "iteration": common["iteration"], "checkpoint_version": common["checkpoint_version"],
              "consumed": a.consumed_train_samples, "tp_arg": a.tensor_model_parallel_size, "padded": a.padded_vocab_size}
    if pp == 1:
        logits = im.logits(model)
        gathered = [torch.empty_like(logits) for _ in range(tp)]
        dist.all_gather(gathered, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
        if rank == 0:
            torch.save(torch.cat(gathered, dim=-1), f"{out}/logits_tp{tp}.pt")
    json.dump(result, open(f"{out}/rank{rank}_tp{tp}_pp{pp}.json", "w"))
    dist.destroy_process_group()


def megatron_load(tp, pp, qk, tied, ckpt, expected, base, tag):
    np.savez(f"{base}/expected.npz", **expected)
    mp.spawn(load_rank, args=(tp * pp, tp, pp, qk, tied, ckpt, f"{base}/expected.npz", base, im.free_port()), nprocs=tp * pp)
    results = [json.load(open(f"{base}/rank{r}_tp{tp}_pp{pp}.json")) for r in range(tp * pp)]
    for r, res in enumerate(results):
        c.check(not res["bad"], f"{tag}: megatron TP{tp} PP{pp} rank {r}: tensors differ from dlm's: {res['bad']}")
        c.check(res["compared"] >= 10, f"{tag}: rank {r} compared {res['compared']} tensors")
    print(f"{tag}: megatron-core TP{tp} PP{pp} loaded it; {sum(r['compared'] for r in results)} local tensors equal")
    return results[0]


def case_hf(base, tied=False, tps=(1, 2)):
    """HF Qwen3 -> native -> megatron (target TP2) -> megatron-core in each TP of tps; logits; round trip."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=im.HIDDEN, intermediate_size=im.FFN, num_hidden_layers=im.LAYERS,
                                   num_attention_heads=im.HEADS, num_key_value_heads=im.GROUPS, head_dim=im.KV, vocab_size=VOCAB,
                                   max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tied)
    hf = transformers.Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # norms away from 1 so that a swapped or misplaced norm shows
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.copy_(torch.linspace(0.5, 1.5, p.numel()))
    hf.save_pretrained(f"{base}/hf", safe_serialization=True)
    run([DLM_CKPT, "convert", "--from", "hf", "--to", "native", f"{base}/hf", f"{base}/native"])
    out = run([DLM_CKPT, "convert", "--from", "native", "--to", "megatron", "--target-tensor-parallel-size", "2",
               f"{base}/native", f"{base}/meg"])
    print(out.stdout.strip())
    c.check(open(f"{base}/meg/latest_checkpointed_iteration.txt").read() == "0", "HF: tracker names iteration 0")
    ckpt = f"{base}/meg/iter_0000000"
    meta = json.load(open(f"{ckpt}/metadata.json"))
    c.check(meta == {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1},
            f"HF: metadata.json {meta}")
    common = torch.load(f"{ckpt}/common.pt", weights_only=True)  # readable without unpickling code
    c.check(common["iteration"] == 0 and common["checkpoint_version"] == 3.0, "HF: common.pt iteration/version")
    c.check(common["args"].tensor_model_parallel_size == 2 and common["args"].padded_vocab_size == 512
            and common["args"].make_vocab_size_divisible_by == 64, f"HF: args TP/padding {vars(common['args'])}")
    c.check(common["args"].no_save_optim and common["args"].no_save_rng, "HF: args tell load_checkpoint there is no optimizer or RNG state")
    with h5py.File(f"{base}/native/iter_0000000/model.h5", "r") as h5:
        expected = {k: h5["model"][k][()] for k in h5["model"].keys()}
    c.check(("output_layer.weight" in expected) != tied, "HF: the output layer exists unless tied")
    for tp in tps:
        res = megatron_load(tp, 1, True, tied, ckpt, expected, base, f"HF Qwen3 tied={tied}")
        c.check(res["padded"] == 512, "HF: padded vocabulary")
        got = torch.load(f"{base}/logits_tp{tp}.pt")[..., :VOCAB]
        with torch.no_grad():
            want = hf(im.TOKENS).logits
        err = (got - want).abs().max().item()
        c.check(err < 1e-4, f"HF: megatron TP{tp} logits differ from transformers' by {err}")
        print(f"megatron TP{tp} logits vs transformers Qwen3: max |diff| {err:.2e}")
    run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", f"{base}/meg", f"{base}/back"])
    with h5py.File(f"{base}/back/iter_0000000/model.h5", "r") as h5:
        names = set(h5["model"].keys())
        c.check(names == set(expected), f"HF round trip: names differ {sorted(names ^ set(expected))}")
        for k in sorted(names & set(expected)):
            c.check(np.array_equal(h5["model"][k][()], expected[k]), f"HF round trip: {k} differs")
    print(f"--to megatron then --from megatron: {len(expected)} tensors bit-equal")
    again = run([DLM_CKPT, "convert", "--from", "native", "--to", "megatron", f"{base}/native", f"{base}/meg"], check=False)
    c.check(again.returncode == 1 and "exists already" in again.stderr and again.stderr.strip().count("\n") == 0,
            f"HF: writing an existing iteration again is a one-line error: {again.stderr}")
    bad = run([DLM_CKPT, "convert", "--from", "native", "--to", "megatron", "--target-tensor-parallel-size", "3",
               f"{base}/native", f"{base}/meg3"], check=False)
    c.check(bad.returncode == 1 and "TP 3" in bad.stderr and not os.path.exists(f"{base}/meg3/latest_checkpointed_iteration.txt"),
            f"HF: TP 3 of 4 heads refused: {bad.stderr}")


def case_megatron(base):
    """megatron-core's torch_dist (TP2, iteration 42) -> native -> megatron -> megatron-core PP2."""
    root = f"{base}/megatron"
    mp.spawn(im.save_rank, args=(2, 2, 1, False, False, root, im.free_port()), nprocs=2)
    run([DLM_CKPT, "convert", "--from", "megatron", "--to", "native", f"{root}_dist", f"{base}/native"])
    run([DLM_CKPT, "convert", "--from", "native", "--to", "megatron", "--target-pipeline-parallel-size", "2",
         f"{base}/native", f"{base}/out"])
    expected = im.expected_tensors(root, 2, 1, False)
    res = megatron_load(1, 2, False, False, f"{base}/out/iter_{im.ITERATION:07d}", expected, base, "megatron TP2")
    c.check(res["iteration"] == im.ITERATION and res["consumed"] == im.CONSUMED,
            f"megatron: iteration {res['iteration']} and consumed samples {res['consumed']} travel")


if __name__ == "__main__":
    for case in (case_hf, lambda base: case_hf(base, tied=True, tps=(2,)), case_megatron):
        base = workdir("megatron_export")
        try:
            case(base)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    c.finish()
