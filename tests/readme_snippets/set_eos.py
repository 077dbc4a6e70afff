#!/usr/bin/env python3
"""Copies a GGUF file with tokenizer.ggml.eos_token_id set to ID (a 32-bit integer value).

Usage: set_eos.py IN.gguf OUT.gguf ID
The README snippets' end-of-generation test makes the token a model picks first its
end-of-generation token, so the snippet must stop right there.
"""
import struct
import sys

src, dst, token = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = bytearray(open(src, "rb").read())
key = b"tokenizer.ggml.eos_token_id"
at = data.find(struct.pack("<Q", len(key)) + key)
if data[:4] != b"GGUF" or at < 0:
    sys.exit(f"{src}: no {key.decode()} key")
value_type_at = at + 8 + len(key)
(value_type,) = struct.unpack_from("<I", data, value_type_at)
if value_type not in (4, 5):  # GGUF UINT32, INT32
    sys.exit(f"{src}: {key.decode()} has value type {value_type}, expected a 32-bit integer")
struct.pack_into("<I", data, value_type_at + 4, token)
open(dst, "wb").write(data)
