// Decode kernels with 8-bit activations (internal to backend/cpu; qgemv.cc dispatches to them).
// Each input row is quantised once per product to 8 bits, and a weight block is dotted with it in
// integer arithmetic (AVX2 maddubs/madd, or VNNI dpbusd/dpwssd where the compiler targets it).
// One packed weight row is dotted with up to kMaxBatchRows input rows while its blocks are in
// registers. The 32-element-block types have two forms that give the same bits: one that keeps
// an input row per register (the single-row decode), and one whose eight lanes are eight input
// rows (Lanes32: several sequences decoding together), which needs no horizontal sums.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ggml_types.h"

namespace ct::cpu::q8 {

// Activation encodings (bit flags: a product whose matrices use both computes both).
// kBlocks32, for the types with 32-element blocks: each 32 elements x[32b, 32b + 32) as q in
// [-127, 127] with x ~ d32[b] * q, d32[b] = max|x| / 127, and sx32[b] = d32[b] * sum(q) (what a
// block's min term needs), h32[b] = sum of q over the block (the Q4_0/Q5_0 offsets, in
// integers). kBlocks256, for the K-quants: one scale per 256 elements, so a
// super-block's sub-block sums stay integers and add up exactly before one float multiply;
// s16[j] = sum of q over x[16j, 16j + 16) (the mins and the Q6_K offset need them).
enum Format : unsigned { kNone = 0, kBlocks32 = 1, kBlocks256 = 2 };

// One quantised input row (views into the caller's buffers; a format's fields are null when the
// product does not use it). cols is a multiple of 32 (kBlocks32) or 256 (kBlocks256).
struct Act {
  const int8_t* q32 = nullptr;   // [cols]
  const float* d32 = nullptr;    // [cols / 32]
  const float* sx32 = nullptr;   // [cols / 32]
  const int32_t* h32 = nullptr;  // [cols / 32]
  const int8_t* qk = nullptr;    // [cols]
  const float* dk = nullptr;     // [cols / 256]
  const int16_t* s16 = nullptr;  // [cols / 16]
};

// The encoding type t's 8-bit kernel reads, kNone for the types that stay on F32 kernels.
Format format_of(GgmlType t);

void quantise_blocks32(const float* x, int cols, int8_t* q, float* d, float* sx, int32_t* h32);
void quantise_blocks256(const float* x, int cols, int8_t* q, float* d, int16_t* s16);
// The prefill GEMM's encoding (qgemm.h): kBlocks32's q and d (the same rounding), and per 16
// elements sx16[j] = d[j / 2] * sum of q over x[16j, 16j + 16).
void quantise_blocks32x16(const float* x, int cols, int8_t* q, float* d, float* sx16);

// The kBlocks32 encoding of up to kLanes input rows (a tile), interleaved so that one 256-bit
// register holds 4 elements of each row: q[((b * 8 + g) * kLanes + i) * 4 + t] is row i's element
// 32b + 4g + t; d, sx and h32 are [cols / 32][kLanes] (d32, sx32, h32 of row i at [b][i]). Rows
// past the tile's last are zero.
constexpr int kLanes = 8;
// The fewest rows a tile runs in the lane form (bench/qgemv_bench.cc, BM_QGemvBatch).
constexpr int kMinLaneRows = 6;
struct Lanes32 {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int32_t* h32 = nullptr;
  const float* sx = nullptr;
};
// Fills blocks [b0, b1) of a tile from n <= kLanes rows' Act (kBlocks32 fields; lanes of missing
// rows 0); the tile's q [cols * kLanes], d, sx and h32 [cols / 32 * kLanes].
void interleave_blocks32(const Act* act, int n, int b0, int b1, int8_t* q, float* d, int32_t* h32,
                         float* sx);

// y[i * y_stride] = dot of one packed row (cols elements) with act[i], for i < n (any n >= 1).
// lanes: null, or the tiles of act (lanes[t] holds rows kLanes t ..), which the 32-element types
// use for tiles of kMinLaneRows rows or more. Each row's arithmetic does not depend on n, on the
// other rows or on lanes: the lane form keeps the same partial sums as the one-row form and adds
// them in the same order.
using RowsDot = void (*)(const uint8_t* row, const Act* act, const Lanes32* lanes, int n, int cols,
                         float* y, size_t y_stride);
// Whether qgemv should build Lanes32 tiles for n rows of a product over type t (the same for
// both kernels: every 32-element type has the lane form in each).
bool wants_lanes(GgmlType t, int n);

// True where the compiler targets VNNI (__AVX512VNNI__ with __AVX512VL__, or __AVXVNNI__).
bool have_vnni();
// Type t's kernel (null for kNone types): with VNNI when `vnni` and have_vnni(), else AVX2. Both
// give the same results bit for bit: every integer sum is exact in both, and the float steps are
// the same instructions.
RowsDot find(GgmlType t, bool vnni);

}  // namespace ct::cpu::q8
