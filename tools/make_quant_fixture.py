#!/usr/bin/env python3
"""Writes tests/fixtures/ggml_quant_blocks.bin: GGML blocks decoded (and, where gguf-py can encode,
encoded) by gguf-py's numpy implementation (gguf.quants), an implementation independent of ours,
for tests/unit/ggml_types_test.cc.

Decode records: for every type a few blocks of random bytes whose fp16 scale fields are replaced by
finite values of varied magnitude (a random fp16 scale could be inf/nan, which says nothing about
the layout), plus gguf.quants.dequantize's floats. Encode records: random floats and the bytes
gguf.quants.quantize makes of them, for the types it can encode.

File format (little-endian): b"CTQF", u32 version (1), u32 record count, then per record
u32 kind (0 decode, 1 encode), u32 ggml type, u32 n_blocks, u32 n_bytes, u32 n_floats,
n_bytes bytes, n_floats f32. Decode: bytes in, floats out; encode: floats in, bytes out.

Usage: pip install gguf==0.19.0 && python3 tools/make_quant_fixture.py [--out PATH]
"""
import argparse
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

# Byte offsets of the fp16 scale/min fields inside one block (the ggml block_* layouts).
SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
N_BLOCKS = {T.F32: 64, T.F16: 64, T.BF16: 64}  # elements for the plain types
ENCODE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def random_scale(rng) -> bytes:
    # Magnitudes from fp16 subnormals (2^-20) up to 2^3, both signs.
    v = np.float16(rng.choice([-1.0, 1.0]) * 2.0 ** rng.uniform(-20, 3))
    return v.tobytes()


def decode_record(rng, qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        raw = rng.standard_normal(N_BLOCKS[qtype]).astype(np.float32).tobytes()
    elif qtype in (T.F16, T.BF16):
        bits = rng.integers(0, 1 << 16, N_BLOCKS[qtype], dtype=np.uint32)
        # Drop inf/nan exponents (all ones): 0x7c00 for fp16, 0x7f80 for bf16.
        exp_mask = 0x7C00 if qtype == T.F16 else 0x7F80
        bits = np.where((bits & exp_mask) == exp_mask, bits & ~np.uint32(0x4000), bits)
        raw = bits.astype(np.uint16).tobytes()
    else:
        n_blocks = 4
        raw = bytearray(rng.integers(0, 256, n_blocks * block_bytes, dtype=np.uint8).tobytes())
        for b in range(n_blocks):
            for off in SCALE_OFFSETS[qtype]:
                raw[b * block_bytes + off : b * block_bytes + off + 2] = random_scale(rng)
        raw = bytes(raw)
    n_blocks = len(raw) // block_bytes
    data = np.frombuffer(raw, dtype=np.uint8).reshape(n_blocks, block_bytes)
    out = quants.dequantize(data, qtype).astype(np.float32).ravel()
    assert out.size == n_blocks * block_elems
    return 0, qtype, n_blocks, raw, out


def encode_record(rng, qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = 4 if block_elems > 1 else 64
    x = (rng.standard_normal(n_blocks * block_elems) * 0.7 + 0.1).astype(np.float32)
    x[3] = 0.0
    if block_elems > 1:
        x[block_elems : 2 * block_elems] = 0.0  # an all-zero block: zero scale, no NaN
    raw = quants.quantize(x.reshape(1, -1), qtype).tobytes()
    assert len(raw) == n_blocks * block_bytes
    return 1, qtype, n_blocks, raw, x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/ggml_quant_blocks.bin")
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    types = [T.F32, T.F16, T.BF16] + list(SCALE_OFFSETS)
    records = [decode_record(rng, t) for t in types] + [encode_record(rng, t) for t in ENCODE]
    with open(args.out, "wb") as f:
        f.write(b"CTQF" + struct.pack("<II", 1, len(records)))
        for kind, qtype, n_blocks, raw, floats in records:
            f.write(struct.pack("<IIIII", kind, int(qtype), n_blocks, len(raw), floats.size))
            f.write(raw)
            f.write(floats.astype("<f4").tobytes())
    print(f"wrote {args.out}: {len(records)} records")


if __name__ == "__main__":
    main()
