// GGML tensor element types as stored in GGUF files: block layouts, row sizes, names, and
// conversion to/from float. The scalar functions here are the reference every fast path is tested
// against.
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

// Name as used by ggml ("q4_1", "f32", ...); "unknown(<n>)" for values we do not know.
std::string ggml_type_name(GgmlType t);
// True for the types this engine can convert to float: F32, F16, BF16, Q4_0, Q4_1, Q8_0.
bool ggml_type_supported(GgmlType t);
// Elements per block (1 for plain types) and bytes per block. Throws ct::Error for unsupported
// types.
int64_t ggml_block_elems(GgmlType t);
size_t ggml_block_bytes(GgmlType t);
// Bytes of a row of n elements; n must be a multiple of the block size (throws otherwise).
size_t ggml_row_bytes(GgmlType t, int64_t n);

// Converts n elements (n multiple of the block size) from the packed representation to float.
void ggml_to_f32(GgmlType t, const void* src, float* dst, int64_t n);
// Plain scalar version of ggml_to_f32, the reference its SIMD paths are tested against; results
// are bit-identical.
void ggml_to_f32_ref(GgmlType t, const void* src, float* dst, int64_t n);
// Quantises/converts n floats into the packed representation (used by the GGUF writer in tests
// and by the chunk store for F16/BF16). Same rounding as ggml's reference quantisers.
void ggml_from_f32(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace ct
