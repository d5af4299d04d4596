"""Shared helpers for dlm's interop tests (run by CTest with the .venv interpreter).

Exit code 77 tells CTest the test was skipped (a peer is missing)."""
import argparse
import importlib
import os
import subprocess
import sys
import tempfile

SKIP = 77


def require(*modules):
    """Imports the peers a test needs, or skips the test when one is missing."""
    loaded = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as e:
            print(f"skipped: {name} is not installed ({e})")
            sys.exit(SKIP)
    return loaded


def run(cmd, check=True, **kw):
    """Runs a command, returns CompletedProcess with text output; raises with its stderr on failure."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stderr}")
    return p


def workdir(name):
    return tempfile.mkdtemp(prefix=f"dlm_{name}_")


def tool_and_size_args(default_mb=2.0):
    """The command line of an interop script that runs one dlm tool over MB megabytes of text: `TOOL [--mb MB]`."""
    ap = argparse.ArgumentParser()
    ap.add_argument("tool")
    ap.add_argument("--mb", type=float, default=default_mb)
    return ap.parse_args()


class Checks:
    """Counts assertions and prints one 'N passed, N failed' line at the end."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAILED: {what}")

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
