#!/usr/bin/env python3
"""bench/gguf_drop_layers.py - writes a copy of a GGUF v3 model that keeps only
its first K transformer blocks: an early-exit draft model sharing the
target's vocabulary, embedding and output head (bench/spec_vs_llamacpp.sh uses
stories260K cut to 2 of its 5 layers as a draft for stories260K; no smaller
model with that vocabulary exists here).

usage: bench/gguf_drop_layers.py IN.gguf OUT.gguf K

Every key/value is copied unchanged except ARCH.block_count (set to K);
tensors named blk.N.* with N >= K are left out, every other tensor is copied
byte for byte with its offset recomputed (same alignment). Pure Python, no
dependencies; every length read is checked against the file's size.
"""
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, n):
        if n < 0 or self.p + n > len(self.d):
            raise ValueError(f"truncated GGUF at offset {self.p} (need {n} bytes)")
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def unpack(self, fmt):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self):
        return self.take(self.unpack("Q")).decode("utf-8")


def skip_value(r, t):
    """Consumes one value of GGUF type t; returns its value for scalars and strings."""
    if t in SCALAR:
        return r.unpack(SCALAR[t])
    if t == 8:
        return r.string()
    if t == 9:
        et, n = r.unpack("I"), r.unpack("Q")
        if et in SCALAR:
            r.take(n * struct.calcsize("<" + SCALAR[et]))
        else:
            for _ in range(n):
                skip_value(r, et)
        return None
    raise ValueError(f"unknown GGUF value type {t}")


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: gguf_drop_layers.py IN.gguf OUT.gguf K")
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = open(src, "rb").read()
    r = Reader(data)
    if r.take(4) != b"GGUF" or r.unpack("I") != 3:
        sys.exit(f"{src}: not a GGUF v3 file")
    n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
    kvs, arch, align = [], None, 32
    for _ in range(n_kv):
        start = r.p
        key = r.string()
        t = r.unpack("I")
        vstart = r.p
        v = skip_value(r, t)
        if key == "general.architecture":
            arch = v
        if key == "general.alignment":
            align = v
        kvs.append((key, t, data[start:r.p], vstart))
    out_kv = []
    found = False
    for key, t, raw, vstart in kvs:
        if arch and key == f"{arch}.block_count":
            if t != 4 or struct.unpack_from("<I", data, vstart)[0] < keep or keep < 1:
                sys.exit(f"{src}: {key} is not a u32 >= K >= 1")
            raw = raw[:-4] + struct.pack("<I", keep)  # a u32 value is the entry's last 4 bytes
            found = True
        out_kv.append(raw)
    if not found:
        sys.exit(f"{src}: no {arch}.block_count key")
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.unpack("I")
        if nd > 8:
            sys.exit(f"{src}: tensor {name} has {nd} dimensions")
        dims = [r.unpack("Q") for _ in range(nd)]
        ttype, off = r.unpack("I"), r.unpack("Q")
        tensors.append((name, dims, ttype, off))
    base = (r.p + align - 1) // align * align
    offs = sorted(t[3] for t in tensors) + [len(data) - base]
    size = {o: offs[i + 1] - o for i, o in enumerate(offs[:-1])}  # bytes up to the next tensor (padding included)
    kept = []
    for name, dims, ttype, off in tensors:
        if name.startswith("blk.") and int(name.split(".")[1]) >= keep:
            continue
        if base + off + size[off] > len(data):
            sys.exit(f"{src}: tensor {name} runs past the end of the file")
        kept.append((name, dims, ttype, data[base + off:base + off + size[off]]))
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(kept), len(out_kv)))
    for raw in out_kv:
        head += raw
    blob, infos = bytearray(), bytearray()
    for name, dims, ttype, payload in kept:
        nb = name.encode()
        infos += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, len(blob))
        blob += payload
        blob += b"\0" * ((-len(blob)) % align)
    head += infos
    head += b"\0" * ((-len(head)) % align)
    with open(dst, "wb") as f:
        f.write(head)
        f.write(blob)
    print(f"{dst}: {len(kept)} of {n_tensors} tensors, {keep} blocks")


if __name__ == "__main__":
    main()
