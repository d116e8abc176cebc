#!/usr/bin/env python3
"""Writes an F32 copy of a GGUF file: every tensor dequantised exactly (gguf-py), metadata kept.

llama.cpp multiplies Q4_1 weights with activations it first quantises to 8 bits; cachetune
multiplies exactly dequantised F32 weights with F32 activations. Running llama.cpp on this F32
copy removes that difference, so the two implementations can be compared tightly.

Usage: python3 tools/dequantize_gguf.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape.tolist())]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
