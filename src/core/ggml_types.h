// GGML tensor element types as stored in GGUF files: one table of type traits (block layout, name,
// conversion to and from float), like ggml's type_traits. A new type is one row of the table plus
// its block functions. The scalar functions are the reference every fast path is tested against.
// The decode kernels (dot products straight from the blocks) live in the CPU backend's own table
// (backend/cpu/qgemv.cc), as ggml keeps its CPU traits apart from the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ct {

// Numbering follows the GGUF specification (ggml_type).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

// Elements per K-quant super-block (ggml's QK_K).
constexpr int64_t kGgmlQK_K = 256;

// Converts n_blocks whole blocks; src may be unaligned.
using GgmlToF32 = void (*)(const void* src, float* dst, int64_t n_blocks);
using GgmlFromF32 = void (*)(const float* src, void* dst, int64_t n_blocks);

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;      // as ggml spells it: "q4_K", "f32", ...
  int64_t block_elems;   // elements per block (1 for plain types)
  size_t block_bytes;    // bytes per block
  GgmlToF32 to_f32_ref;  // plain scalar reference
  GgmlToF32 to_f32;      // fast path (AVX2 where written, the reference otherwise); bit-identical
  GgmlFromF32 from_f32;  // encoder, or null where we have none
};

// The row for t, or null for types without a dequantiser (Q8_1, Q8_K, integer types, unknown
// values). Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
const GgmlTypeTraits* ggml_type_traits(GgmlType t);
// The row for t; throws ct::Error naming the type and the supported ones when there is none.
const GgmlTypeTraits& ggml_traits(GgmlType t);

// Name as used by ggml ("q4_1", "f32", ...); "unknown(<n>)" for values we do not know.
std::string ggml_type_name(GgmlType t);
// True when t has a row in the table (can be converted to float).
bool ggml_type_supported(GgmlType t);
// Comma-separated names of the supported types, for error messages.
std::string ggml_supported_type_names();
// Elements per block and bytes per block. Throw ct::Error for unsupported types.
int64_t ggml_block_elems(GgmlType t);
size_t ggml_block_bytes(GgmlType t);
// Bytes of a row of n elements; n must be a multiple of the block size (throws otherwise).
size_t ggml_row_bytes(GgmlType t, int64_t n);

// Converts n elements (n multiple of the block size) from the packed representation to float.
void ggml_to_f32(GgmlType t, const void* src, float* dst, int64_t n);
// The scalar reference of ggml_to_f32; results are bit-identical.
void ggml_to_f32_ref(GgmlType t, const void* src, float* dst, int64_t n);
// Quantises/converts n floats into the packed representation (the GGUF writer in tests, the chunk
// store for F16/BF16). F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 round like ggml's reference quantisers;
// the K-quant encoders are plain (no ggml-style scale search), good enough for test models.
// Throws ct::Error for types without an encoder.
void ggml_from_f32(GgmlType t, const float* src, void* dst, int64_t n);

// Sub-block j (< 8) of a Q4_K/Q5_K super-block: 6-bit scale and min. Bytes 0-3 hold scales 0-3,
// bytes 4-7 mins 0-3 (low 6 bits each); scales/mins 4-7 take their low 4 bits from bytes 8-11
// (scale low nibble, min high nibble) and their top 2 bits from the top bits of bytes 0-7.
inline void q4_k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

}  // namespace ct
