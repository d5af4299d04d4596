"""A blend case as the blend interop tests describe it, built by dlm-blend's flags or by megatron-core.

A case k is a dict: seq, train, eval_iters, eval_interval, seed, extra (add_extra_token_to_sequence),
data + split (--data-path words and --split) or per_split (three word lists or None), and optionally
eod (reset_position_ids, reset_attention_mask, eod_mask_loss)."""
import os


def sizes_for(k):
    """Megatron-LM's train_val_test_num_samples with --global-batch-size 1."""
    t = k["train"]
    return [t, (t // k["eval_interval"] + 1) * k["eval_iters"], k["eval_iters"]]


def dlm_flags(k, cache):
    f = ["--seq-length", k["seq"], "--train-samples", k["train"], "--global-batch-size", 1, "--eval-iters",
         k["eval_iters"], "--eval-interval", k["eval_interval"], "--seed", k["seed"], "--data-cache-path", cache]
    if k["data"]:
        f += ["--data-path", " ".join(k["data"]), "--split", k["split"]]
    else:
        for flag, blend in zip(("--train-data-path", "--valid-data-path", "--test-data-path"), k["per_split"]):
            if blend:
                f += [flag, " ".join(blend)]
    if not k["extra"]:
        f.append("--no-add-extra-token-to-sequence")
    return f


def megatron_build(k, cache, tokenizer):
    """BlendedMegatronDatasetBuilder(GPTDataset, sizes_for(k), ...).build() into `cache`."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    reset_pos, reset_attn, mask_loss = k.get("eod", (False, False, False))
    cfg = GPTDatasetConfig(
        random_seed=k["seed"], sequence_length=k["seq"],
        blend=get_blend_from_list(k["data"]) if k["data"] else None,
        blend_per_split=[get_blend_from_list(b) if b else None for b in k["per_split"]] if k["per_split"] else None,
        split=k["split"], path_to_cache=cache, tokenizer=tokenizer, reset_position_ids=reset_pos,
        reset_attention_mask=reset_attn, eod_mask_loss=mask_loss, create_attention_mask=False,
        add_extra_token_to_sequence=k["extra"])
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes_for(k), lambda: True, cfg).build()


def cache_files(d):
    """The cache files both write (.npy arrays, .txt descriptions), sorted; none for a missing folder."""
    return sorted(f for f in os.listdir(d) if f.endswith((".npy", ".txt"))) if os.path.isdir(d) else []


def same_caches(checks, name, dm, dd):
    """Checks that megatron-core's cache folder dm and dlm's dd hold the same files (names, so
    description hashes) with the same arrays (dtype, shape, values) and bytes."""
    import numpy as np

    fm, fd = cache_files(dm), cache_files(dd)
    checks.check(fm == fd and len(fm) > 0, f"{name}: cache files differ: megatron alone {sorted(set(fm) - set(fd))}, "
                                           f"dlm alone {sorted(set(fd) - set(fm))}")
    for f in sorted(set(fm) & set(fd)):
        pm, pd = os.path.join(dm, f), os.path.join(dd, f)
        if f.endswith(".npy"):
            a, b = np.load(pm), np.load(pd)
            checks.check(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b),
                         f"{name}: {f}: megatron {a.dtype}{a.shape} vs dlm {b.dtype}{b.shape}, "
                         f"{'equal' if a.shape == b.shape and np.array_equal(a, b) else 'values differ'}")
        with open(pm, "rb") as x, open(pd, "rb") as y:
            checks.check(x.read() == y.read(), f"{name}: {f}: bytes differ")
