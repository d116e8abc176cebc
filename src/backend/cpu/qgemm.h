// Matrix products of many input rows (prefill) with the weights kept quantised: 8-bit activations
// times the weights' own integer quants, integer dot products (VNNI dpbusd where the compiler
// targets it), as llama.cpp's prefill does. One mechanism for every block-quantised type: each
// type only says how a row unpacks into the common form
//     w[e] = d[e / 16] * u[e] + o[e / 16],   u[e] an unsigned byte,
// (Q4_K: d = d * sc, o = -dmin * m; Q6_K: d = d * sc, o = -32 d * sc; Q8_0: u = q + 128, o = -128 d;
// ...), one scale and offset per 16 elements. The product then is, per 16 elements,
//     d * dx * sum(u q) + o * sx16,
// with the input rounded per 32 elements to q in [-127, 127] with scale dx (qgemm_input) and sx16
// = dx * sum(q) over the 16. The weights are unpacked strip by strip (8 rows, interleaved in
// groups of 4 bytes so that one 256-bit register holds 4 elements of each of the 8 rows) into a
// per-thread buffer, and each strip is reused across all the input rows (chunk by chunk, see
// QgemmBlocking): the 8 rows' outputs are the 8 lanes of one register, so there is no
// horizontal sum. Types whose scales cover 32 elements run the float work once per 32.
#pragma once

#include "backend/cpu/qgemv.h"
#include "core/ggml_types.h"

namespace ct::cpu {

// True for the block-quantised types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K); F32, F16 and BF16 are not.
bool qgemm_supported(GgmlType t);
// The largest unpacked quant of a supported type (qgemm_unpack_row's u): 255 for Q8_0, below 128
// for the others, which is what lets kAvx2 use maddubs for them.
int qgemm_max_quant(GgmlType t);

// kNative: VNNI where the compiler targets it (qgemv_has_vnni()), else the AVX2 form. kAvx2: the
// integer dot products in AVX2: maddubs (byte pairs into int16) where every weight quant is below
// 128, so no pair sum saturates (all types but Q8_0), else kAvx2Wide. kAvx2Wide: 16-bit
// multiply-adds of the even and the odd bytes for every type (the slower reference of maddubs).
// All three equal each other bit for bit (every integer sum is exact, the float steps are the
// same), so tests run each on any machine.
enum class QgemmPath { kNative, kAvx2, kAvx2Wide };

// The kernels of the forward pass's multi-row products (Workspace::prefill_kernel): kQgemm (qgemm,
// kNative), kQgemmAvx2 (qgemm, kAvx2), kSgemm (each matrix dequantised to F32, then one SGEMM:
// F32 activations, the path before qgemm, kept for tests and as the benchmarks' baseline).
enum class PrefillKernel { kQgemm, kQgemmAvx2, kSgemm };
// kQgemm: with VNNI (AVX-512 VNNI or AVX-VNNI, where the build targets it) and without (AVX2's
// maddubs), qgemm is faster than dequantise + SGEMM for every type that qgemm_prefers
// (docs/PERFORMANCE.md); the others take SGEMM under any kernel but kSgemm's. With qgemm
// the prefill's activations are rounded to 8 bits per 32 elements, as llama.cpp's are; the
// real-model tests check its logits against llama.cpp on the quantised files, and the F32
// comparisons run kSgemm. The environment variable CT_PREFILL_KERNEL (qgemm, qgemm-avx2 or sgemm)
// selects a kernel, so that one build can measure both; any other value throws ct::Error naming
// it.
PrefillKernel default_prefill_kernel();
// Whether a product over type t runs faster on qgemm than dequantised to F32 for SGEMM on the
// CPU this build targets: every supported type with VNNI; without it, the types whose quants stay
// below 128 (maddubs), not Q8_0, whose wide AVX2 form is slower than SGEMM (docs/PERFORMANCE.md,
// measured on a Zen 3 core: 22.8 against 35.4 GMAC/s at 512 rows). The same answer under every
// QgemmPath, so kQgemm and kQgemmAvx2 send the same matrices to qgemm (and give the same bits).
bool qgemm_prefers(GgmlType t);
// "qgemm", "qgemm-avx2" or "sgemm": the names CT_PREFILL_KERNEL takes.
const char* prefill_kernel_name(PrefillKernel k);

// How qgemm walks a product: blocks of `strips` strips of 8 weight rows, each unpacked once per
// call, times chunks of `rows` input rows (a multiple of the tile, qgemm_tile_rows(), so that every
// tile lies in one chunk). Results do not depend on it: every output is the same tile's sum.
// qgemm_blocking picks one for `cols` columns and `total_strips` strips: about 192 KiB of
// weight quants and 256 KiB of input quants (with their scales 0.55-0.65 MiB, inside the L2 of
// the cores measured), and about 4 blocks per thread.
constexpr int kQgemmMaxBlockStrips = 32;
struct QgemmBlocking {
  int strips = 1, rows = 8;
};
QgemmBlocking qgemm_blocking(int cols, int total_strips);
int qgemm_tile_rows();

// y[i * ldy + off_m + r] = (W_m x_i)[r] for i < n, off_m the total rows of W_0..W_{m-1} (at most
// kMaxMany matrices of the same cols, a multiple of 32, all qgemm_supported; ldy >= their total
// rows). Results equal the product of the dequantised weights with qgemm_input(x_i) up to float
// rounding; each row's result does not depend on the other rows or on the thread count.
// `blocking` (tests): instead of qgemm_blocking's choice.
void qgemm(const QMatrix* const* ws, int n_mats, const float* x, int n, float* y, int ldy,
           QgemmPath path = QgemmPath::kNative, const QgemmBlocking* blocking = nullptr);

// x_used[cols] = x rounded as qgemm rounds it: blocks of 32 elements, scale max|x| / 127, round to
// nearest even (the same as qgemv_input for Q8_0).
void qgemm_input(const float* x, int cols, float* x_used);

// The unpacked form of one row (tests): u[cols], d[cols / 16], o[cols / 16] as defined above.
void qgemm_unpack_row(GgmlType t, const uint8_t* row, int cols, uint8_t* u, float* d, float* o);

}  // namespace ct::cpu
