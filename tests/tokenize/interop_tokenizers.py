"""Placeholder: the parity test lands in the next commit."""
import sys
print("skipped: not yet written")
sys.exit(77)
