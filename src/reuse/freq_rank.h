// Offline token ranking for one independently encoded KV chunk (paper Sec. 4.1, App. B.1): the
// positions whose low-frequency-reconstructed K/V magnitude is largest are recomputed first.
// Also the KV spectrum energy measurement of App. E.1 and the ratio -> count rule used online.
#pragma once

#include <cstdint>
#include <vector>

namespace ct {

enum class RankMode {
  kLowFreq,   // keep the lowest alpha fraction of rFFT bins (DC included): the paper's method
  kHighFreq,  // keep the highest alpha fraction of bins; DC is excluded unless alpha keeps all
  kL2,        // no spectral filtering: raw K/V magnitudes (equals kLowFreq with alpha = 1)
  // Not spectral: rankings of src/reuse/policy/ stored in the same record fields.
  kHead,   // text order: the first tokens of the chunk first (policy/head.h)
  kProbe,      // K/V drift after an unrelated probe context (policy/probe.h; needs the model)
  kAttn,       // attention each token receives in its isolated encoding (policy/probe.h)
  kProbeAttn,  // kProbe's drift times kAttn's attention (policy/probe.h)
};

// Where the per-layer filtering and norms run. Both give the same scores to float rounding
// (tests/cuda compares them); near-tied tokens may swap places.
enum class RankDevice {
  kCpu,   // FFTW, OpenMP over layers: the reference backend, always built
  kCuda,  // cuFFT on the first CUDA device; needs a CT_CUDA build and a device, else ct::Error
};

struct RankOptions {
  RankMode mode = RankMode::kLowFreq;
  // Fraction of the floor(N/2)+1 rFFT bins kept, in [0, 1]; at least one bin is always kept.
  // Ignored by kL2.
  double alpha = 0.5;
  RankDevice device = RankDevice::kCpu;  // not part of the ranking's definition (or chunk id)
};

// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_ranking_available();

// scores: F32 [n_tok], higher = recompute first. order: [n_tok] token indices sorted by
// descending score, ties broken by the lower index. A prefix of `order` of length
// n_select(r, n_tok) is the recomputation set for ratio r.
struct ChunkRanking {
  std::vector<float> scores;
  std::vector<int32_t> order;
};

// Scores each token of one chunk.
//  k_layers[l], v_layers[l]: F32 [n_tok][kv_dim] row-major (token axis outer), kv_dim =
//  n_kv_head * head_dim, keys taken BEFORE RoPE. Every layer must have both pointers.
// Per layer and per channel the length-n_tok sequence along the token axis is band-limited (rFFT,
// zero the dropped bins, inverse rFFT with 1/N). For token t, kmag(t) and vmag(t) are the L2 norms
// over the kv_dim channels of the filtered K and V. Each is divided by its mean over the tokens
// of that layer, so layers with large activations do not dominate the average (a layer whose
// mean magnitude is 0 contributes 0). Layer score = 0.5*kmag/mean_k + 0.5*vmag/mean_v; the final
// score is the plain mean over layers. kL2 applies the same scoring to the unfiltered K and V.
// Throws ct::Error on bad shapes, alpha outside [0, 1], or non-finite input. Thread-safe. Runs
// OpenMP over layers; the result does not depend on the thread count. FFTW_ESTIMATE plans are
// made once per distinct (n_tok, kv_dim) under a mutex private to this file and kept for the
// process lifetime; other code in the process that calls the FFTW planner concurrently would
// need to share that lock. Cost is O(L * kv_dim * N log N): about 2 GFLOP for 30 x 192 x 3,000.
// With opt.device = kCuda the filtering and norms run on the GPU (backend/cuda/band_norms.h;
// device buffers and plans kept per shape, calls serialised by a lock) and the scoring below is
// the same code.
ChunkRanking rank_chunk_tokens(const std::vector<const float*>& k_layers,
                               const std::vector<const float*>& v_layers, int n_tok, int kv_dim,
                               const RankOptions& opt);

// Slow reference for rank_chunk_tokens: the same definition with a direct O(N^2) DFT in double
// precision and no FFTW. For tests only.
ChunkRanking rank_chunk_tokens_reference(const std::vector<const float*>& k_layers,
                                         const std::vector<const float*>& v_layers, int n_tok,
                                         int kv_dim, const RankOptions& opt);

// Number of rFFT bins a filtered mode keeps for n_tok tokens: ceil(alpha * (n_tok/2 + 1)),
// at least 1, with the same rounding guard as n_select.
int n_keep_bins(double alpha, int n_tok);

// Number of tokens selected at recomputation ratio r: ceil(r * n_tok) clamped to [0, n_tok].
// A product within 1e-6 (relative) of an integer counts as that integer, so 0.07 * 100 gives 7
// although the double product is 7.000000000000001, and a float 0.15f still gives 15 of 100.
// Throws ct::Error on NaN r or n_tok < 0.
int n_select(double r, int n_tok);

// KV energy fraction per frequency band (paper App. E.1). The spectral energy |X_k|^2 of every
// layer, channel, K and V sequence along the token axis is summed per rFFT bin k, counting each
// bin with its two-sided multiplicity (bins other than DC and the even-N Nyquist stand for +k and
// -k, so the total equals N * sum x^2 by Parseval). Bin k has normalised frequency k/N in
// [0, 0.5] and falls in band min(n_bands-1, floor(2*k*n_bands/N)) of n_bands equal-width bands.
// Returns [n_bands] fractions summing to 1 (all zero if the input is all zero).
std::vector<double> kv_band_energy(const std::vector<const float*>& k_layers,
                                   const std::vector<const float*>& v_layers, int n_tok, int kv_dim,
                                   int n_bands);

}  // namespace ct
