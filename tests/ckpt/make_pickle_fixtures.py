"""Writes the restricted unpickler's fixtures (tests/fuzz/corpus/torch_pickle/, also the fuzz seeds):
pickles of plain values in protocols 2, 4 and 5, a torch.save file with bf16/fp16/fp32 tensors (views,
offsets, transposes) and a namespace, and pickles that name os.system, builtins.eval and subprocess.Popen.
pickle_test.cpp holds the values these must decode to. usage: make_pickle_fixtures.py OUT_DIR"""
import argparse
import collections
import os
import pickle
import sys

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

plain = {
    "none": None, "true": True, "false": False,
    "ints": [0, -1, 255, 65535, -2**31, 2**40, -2**63, 2**63 - 1],
    "float": 1.5, "str": "h\u00e9llo", "bytes": b"\x00\xff\x80A",
    "tuple": (1, "two", 3.0), "od": collections.OrderedDict([("b", 2), ("a", 1)]),
    "ns": argparse.Namespace(lr=3e-4, seq_length=128, name="gpt"),
    "shared": None,
}
shared = [7, 8]
plain["shared"] = (shared, shared)
for proto in (2, 4, 5):
    with open(f"{out}/plain_p{proto}.pkl", "wb") as f:
        pickle.dump(plain, f, protocol=proto)

base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
tensors = {
    "f32": base.clone(),
    "bf16": (base / 4).to(torch.bfloat16),
    "f16": (base / 8).to(torch.float16),
    "transposed": base.t(),            # strides (1, 6)
    "row2": base[2],                   # offset 12 into base's storage
    "f64": torch.tensor([0.25, -2.0], dtype=torch.float64),
    "param": torch.nn.Parameter(torch.ones(2, 2)),
    "args": argparse.Namespace(iteration=7, params_dtype=torch.bfloat16),
}
torch.save(tensors, f"{out}/tensors.pt")


class Evil:
    def __init__(self, f, a):
        self.f, self.a = f, a

    def __reduce__(self):
        return (self.f, self.a)


import subprocess  # noqa: E402

with open(f"{out}/evil_os_system.pkl", "wb") as f:
    pickle.dump({"x": Evil(os.system, ("true",))}, f, protocol=2)
with open(f"{out}/evil_eval.pkl", "wb") as f:
    pickle.dump([Evil(eval, ("1+1",))], f, protocol=4)
with open(f"{out}/evil_subprocess.pkl", "wb") as f:
    pickle.dump(Evil(subprocess.Popen, (["true"],)), f, protocol=5)

# A tensor with Python attributes (megatron's fp32 masters carry tensor_model_parallel, partition_dim, ...):
# torch.save writes torch._tensor._rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor, args, attributes).
attributed = torch.full((3,), 2.5)
attributed.tensor_model_parallel, attributed.partition_dim = True, 0
torch.save({"master": attributed}, f"{out}/tensor_attributes.pt")
# _rebuild_from_type_v2 naming a known global that is not a tensor rebuild.
with open(f"{out}/evil_rebuild_from_type.pkl", "wb") as f:
    pickle.dump(Evil(torch._tensor._rebuild_from_type_v2, (collections.OrderedDict, torch.Tensor, ((),), {})), f, protocol=2)
