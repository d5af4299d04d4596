"""The record files tokenize_tool reads and writes: documents (u32 byte length, bytes) and id lists
(u32 count, i32 ids), and where two id lists first differ."""
import struct


def write_docs(docs, path):
    with open(path, "wb") as f:
        for d in docs:
            b = d.encode() if isinstance(d, str) else d
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def read_ids(path):
    data = open(path, "rb").read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(list(struct.unpack_from(f"<{n}i", data, i + 4)))
        i += 4 + 4 * n
    return out


def read_docs(path):
    data = open(path, "rb").read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return out


def write_ids(ids, path):
    with open(path, "wb") as f:
        for v in ids:
            f.write(struct.pack(f"<I{len(v)}i", len(v), *v))


def first_difference(a, b):
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return k, a[max(0, k - 3):k + 5], b[max(0, k - 3):k + 5]
