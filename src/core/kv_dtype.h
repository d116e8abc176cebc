// Element types of stored keys and values: a chunk record's blocks (store/) and the live KV cache
// (model/kv_cache.h), with the conversions between them and F32. Records take F32, F16 and BF16;
// the live cache F32, F16 and Q8_0 (ggml's block of 32: an F16 scale and 32 signed bytes, what
// llama.cpp's --cache-type-k/v q8_0 stores).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ct {

enum class KvDtype : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3 };

const char* kv_dtype_name(KvDtype t);
// The types a chunk record stores (f32, f16, bf16) and those a live cache holds (f32, f16, q8_0).
bool kv_record_type(KvDtype t);
bool kv_cache_type(KvDtype t);
// Elements per block: 32 for Q8_0, 1 for the others. A row's element count must be a multiple.
int kv_block_elems(KvDtype t);
// Bytes of n elements of type t (n a multiple of kv_block_elems(t); asserted).
size_t kv_bytes(KvDtype t, size_t n);
// Parses "f32" | "f16" | "bf16" | "q8_0"; throws ct::Error naming the value otherwise.
KvDtype parse_kv_dtype(const std::string& s);

// Converts n floats (a multiple of the block size) to/from the storage type: F16/BF16 round to
// nearest even, Q8_0 as ggml's reference quantiser (scale max|x| / 127 stored as F16, quants
// rounded half away from zero); the vector paths give the scalar conversions' bits.
void kv_pack(KvDtype t, const float* src, void* dst, size_t n);
void kv_unpack(KvDtype t, const void* src, float* dst, size_t n);

}  // namespace ct
