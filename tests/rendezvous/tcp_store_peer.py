"""The torch side of tcp_store_test.cpp: hosts torch.distributed.TCPStore (is_master=True) on a free port,
writes the port to argv[1], exchanges keys with dlm's client under the prefix "run7" (PrefixStore, as
torchrun's workers use one) and writes its verdict under "verdict": "ok" or what differed."""
import datetime
import os
import sys

from torch.distributed import PrefixStore, TCPStore

store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(store.port))
os.rename(tmp, sys.argv[1])
run = PrefixStore("run7", store)
run.add("counter", 5)
run.set("from_torch", b"\x00\x01 torch bytes \xff")
run.wait(["from_dlm"])
problems = []
if run.get("from_dlm") != b"dlm says \x00 hi":
    problems.append(f"from_dlm is {run.get('from_dlm')!r}")
if run.add("counter", 0) != 8:
    problems.append(f"counter is {run.add('counter', 0)} (torch added 5, dlm 3)")
if store.get("run7/from_dlm") != b"dlm says \x00 hi":
    problems.append("dlm's prefix is not PrefixStore's")
run.set("verdict", "ok" if not problems else "; ".join(problems))
run.wait(["dlm_done"])
print("peer ok" if not problems else "peer: " + "; ".join(problems))
