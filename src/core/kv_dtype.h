// Element types of stored keys and values: a chunk record's blocks (store/) and the live KV cache
// (model/kv_cache.h), with the conversions between them and F32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ct {

enum class KvDtype : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

const char* kv_dtype_name(KvDtype t);
size_t kv_dtype_size(KvDtype t);
// Parses "f32" | "f16" | "bf16"; throws ct::Error naming the value otherwise.
KvDtype parse_kv_dtype(const std::string& s);

// Converts n floats to/from the storage dtype, rounding to nearest even (the vector paths give
// the scalar conversions' bits).
void kv_pack(KvDtype t, const float* src, void* dst, size_t n);
void kv_unpack(KvDtype t, const void* src, float* dst, size_t n);

}  // namespace ct
