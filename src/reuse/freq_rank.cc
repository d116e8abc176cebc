// Frequency-domain token ranking for a KV chunk: FFTW fast path, O(N^2) double reference, and the
// band-energy measurement. See freq_rank.h for the scoring definition shared by both paths.
#include "reuse/freq_rank.h"

#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <utility>

#include "backend/registry.h"
#include "core/error.h"

namespace ct {
namespace {

// A product within this relative distance of an integer is taken as that integer, so that ratios
// such as 0.07 * 100 = 7.000000000000001 (double rounding) or a ratio that went through a float
// (0.15f * 100 = 15.0000006) do not round up to the next count. 1e-6 is well above float's
// relative rounding (6e-8) and far below any ratio step that matters (1e-6 of a token count).
constexpr double kIntegerSlack = 1e-6;

int64_t robust_ceil(double x) {
  const double nearest = std::nearbyint(x);
  if (std::fabs(x - nearest) <= kIntegerSlack * std::max(1.0, std::fabs(x))) {
    return static_cast<int64_t>(nearest);
  }
  return static_cast<int64_t>(std::ceil(x));
}

void validate(const std::vector<const float*>& k_layers, const std::vector<const float*>& v_layers,
              int n_tok, int kv_dim) {
  CT_THROW_IF_NOT(k_layers.size() == v_layers.size(),
                  "freq_rank: {} key layers but {} value layers; expected the same count",
                  k_layers.size(), v_layers.size());
  CT_THROW_IF_NOT(!k_layers.empty(), "freq_rank: no layers given; expected at least one");
  CT_THROW_IF_NOT(n_tok >= 0, "freq_rank: n_tok = {}; expected >= 0", n_tok);
  CT_THROW_IF_NOT(kv_dim >= 1, "freq_rank: kv_dim = {}; expected >= 1", kv_dim);
  for (size_t l = 0; l < k_layers.size(); ++l) {
    CT_THROW_IF_NOT(k_layers[l] != nullptr && v_layers[l] != nullptr,
                    "freq_rank: layer {} has a null K or V pointer", l);
  }
}

void validate_options(const RankOptions& opt) {
  CT_THROW_IF_NOT(opt.mode == RankMode::kLowFreq || opt.mode == RankMode::kHighFreq ||
                      opt.mode == RankMode::kL2,
                  "freq_rank: rank mode {} is not a spectral ranking (see src/reuse/policy/)",
                  (int)opt.mode);
  CT_THROW_IF_NOT(opt.mode == RankMode::kL2 || (opt.alpha >= 0.0 && opt.alpha <= 1.0),
                  "freq_rank: alpha = {}; expected a value in [0, 1]", opt.alpha);
}

// Kept rFFT bins [lo, hi) out of n_tok/2 + 1.
std::pair<int, int> kept_bins(const RankOptions& opt, int n_tok) {
  const int n_bins = n_tok / 2 + 1;
  if (opt.mode == RankMode::kL2) return {0, n_bins};
  const int n_keep = n_keep_bins(opt.alpha, n_tok);
  if (opt.mode == RankMode::kLowFreq) return {0, n_keep};
  return {n_bins - n_keep, n_bins};
}

// Turns per-layer magnitudes into final scores and the ranking.
//  layer_kmag, layer_vmag: F64 [n_layer][n_tok].
ChunkRanking finish_ranking(const std::vector<double>& layer_kmag,
                            const std::vector<double>& layer_vmag, int n_layer, int n_tok) {
  std::vector<double> sum(n_tok, 0.0);
  for (int l = 0; l < n_layer; ++l) {
    const double* km = layer_kmag.data() + static_cast<size_t>(l) * n_tok;
    const double* vm = layer_vmag.data() + static_cast<size_t>(l) * n_tok;
    double mean_k = 0.0, mean_v = 0.0;
    for (int t = 0; t < n_tok; ++t) {
      mean_k += km[t];
      mean_v += vm[t];
    }
    mean_k /= n_tok;
    mean_v /= n_tok;
    // A layer whose K (or V) is all zero carries no ranking information; dividing would give NaN.
    const double wk = mean_k > 0.0 ? 0.5 / mean_k : 0.0;
    const double wv = mean_v > 0.0 ? 0.5 / mean_v : 0.0;
    for (int t = 0; t < n_tok; ++t) sum[t] += wk * km[t] + wv * vm[t];
  }
  ChunkRanking out;
  out.scores.resize(n_tok);
  for (int t = 0; t < n_tok; ++t) {
    out.scores[t] = static_cast<float>(sum[t] / n_layer);
    CT_THROW_IF_NOT(std::isfinite(out.scores[t]),
                    "freq_rank: token {} got a non-finite score ({}); the K/V input holds NaN or "
                    "Inf values",
                    t, out.scores[t]);
  }
  out.order.resize(n_tok);
  for (int t = 0; t < n_tok; ++t) out.order[t] = t;
  std::sort(out.order.begin(), out.order.end(), [&](int32_t a, int32_t b) {
    if (out.scores[a] != out.scores[b]) return out.scores[a] > out.scores[b];
    return a < b;
  });
  return out;
}

// ---- FFTW plumbing -------------------------------------------------------------------------

struct FftwFree {
  void operator()(void* p) const { fftwf_free(p); }
};
template <typename T>
using FftwBuffer = std::unique_ptr<T[], FftwFree>;

template <typename T>
FftwBuffer<T> fftw_alloc(size_t n) {
  void* p = fftwf_malloc(sizeof(T) * std::max<size_t>(n, 1));
  CT_ASSERT(p != nullptr, "fftwf_malloc of {} elements failed", n);
  return FftwBuffer<T>(static_cast<T*>(p));
}

// Batched transforms over the channel-major layout [kv_dim][n_tok]: kv_dim contiguous sequences
// of length n_tok. The caller's token-major K/V is transposed into this layout first: FFTW runs
// contiguous sequences about 1.5-2x faster than the strided [n_tok][kv_dim] layout (howmany =
// kv_dim, stride = kv_dim, dist = 1) even counting the transpose, and the per-token sums of
// squares afterwards vectorise along the token axis.
//  r2c: F32 [kv_dim][n_tok] (destroyed: it is scratch) -> C64 [kv_dim][n_tok/2+1]
//  c2r: C64 [kv_dim][n_tok/2+1] (destroyed) -> F32 [kv_dim][n_tok]
// All arrays come from fftwf_malloc, so execution arrays have the planning arrays' alignment, as
// the new-array execute functions require.
struct BatchPlans {
  fftwf_plan r2c = nullptr;
  fftwf_plan c2r = nullptr;
};

// FFTW_ESTIMATE: planning is instant and the chosen algorithm depends only on the shape, so
// scores are bit-identical across processes and machines with the same FFTW build. FFTW_MEASURE
// picks plans by timing (so rounding, and near-tied orders, can change from run to run), costs
// 0.5-2.5 s per shape, and measured within noise of ESTIMATE for the 3,000 x 192 shape here.
const BatchPlans& batch_plans(int n_tok, int kv_dim) {
  static std::mutex mu;
  // Plans live for the whole process; never destroyed, so no static-destruction-order issues.
  static auto* cache = new std::map<std::pair<int, int>, BatchPlans>();
  std::lock_guard<std::mutex> lock(mu);  // the FFTW planner is not thread-safe
  auto it = cache->find({n_tok, kv_dim});
  if (it != cache->end()) return it->second;
  const int n = n_tok, n_bins = n_tok / 2 + 1;
  auto real = fftw_alloc<float>(static_cast<size_t>(n_tok) * kv_dim);
  auto spec = fftw_alloc<fftwf_complex>(static_cast<size_t>(n_bins) * kv_dim);
  BatchPlans p;
  p.r2c = fftwf_plan_many_dft_r2c(1, &n, kv_dim, real.get(), nullptr, 1, n_tok, spec.get(), nullptr,
                                  1, n_bins, FFTW_ESTIMATE | FFTW_DESTROY_INPUT);
  p.c2r = fftwf_plan_many_dft_c2r(1, &n, kv_dim, spec.get(), nullptr, 1, n_bins, real.get(),
                                  nullptr, 1, n_tok, FFTW_ESTIMATE | FFTW_DESTROY_INPUT);
  CT_ASSERT(p.r2c != nullptr && p.c2r != nullptr, "FFTW planning failed for n_tok={} kv_dim={}",
            n_tok, kv_dim);
  return cache->emplace(std::make_pair(n_tok, kv_dim), p).first->second;
}

// Per-thread scratch for one layer's filtering; allocated once per call per thread.
struct FilterScratch {
  FftwBuffer<float> seq;           // F32 [kv_dim][n_tok]: transposed input, then filtered output
  FftwBuffer<fftwf_complex> spec;  // C64 [kv_dim][n_tok/2+1]
  std::vector<float> sq;           // F32 [n_tok]: per-token sum of squares
  FilterScratch(int n_tok, int kv_dim)
      : seq(fftw_alloc<float>(static_cast<size_t>(n_tok) * kv_dim)),
        spec(fftw_alloc<fftwf_complex>(static_cast<size_t>(n_tok / 2 + 1) * kv_dim)),
        sq(n_tok) {}
};

// dst: F32 [kv_dim][n_tok] <- src: F32 [n_tok][kv_dim]. Tiles of kTile tokens keep the source
// rows of a tile in L1 while each channel's destination run is written contiguously.
void transpose_to_channels(const float* src, int n_tok, int kv_dim, float* dst) {
  constexpr int kTile = 16;
  for (int t0 = 0; t0 < n_tok; t0 += kTile) {
    const int t1 = std::min(n_tok, t0 + kTile);
    for (int c = 0; c < kv_dim; ++c) {
      float* out = dst + static_cast<size_t>(c) * n_tok;
      for (int t = t0; t < t1; ++t) out[t] = src[static_cast<size_t>(t) * kv_dim + c];
    }
  }
}

// mag[t] = L2 norm over channels of row t of x: F32 [n_tok][kv_dim], times `scale`.
void row_norms(const float* x, int n_tok, int kv_dim, double scale, double* mag) {
  // Eight independent partial sums: a single running sum is a serial dependency chain that the
  // compiler may not reorder (no -ffast-math), which made this loop latency-bound.
  constexpr int kLanes = 8;
  for (int t = 0; t < n_tok; ++t) {
    const float* row = x + static_cast<size_t>(t) * kv_dim;
    float part[kLanes] = {};
    int c = 0;
    for (; c + kLanes <= kv_dim; c += kLanes) {
      for (int j = 0; j < kLanes; ++j) part[j] += row[c + j] * row[c + j];
    }
    for (; c < kv_dim; ++c) part[c % kLanes] += row[c] * row[c];
    double acc = 0.0;
    for (int j = 0; j < kLanes; ++j) acc += part[j];
    mag[t] = std::sqrt(acc) * scale;
  }
}

// Band-limits every channel of src (F32 [n_tok][kv_dim]) to bins [lo, hi) and writes the
// per-token magnitudes mag: F64 [n_tok].
void filtered_norms(const BatchPlans& plans, const float* src, int n_tok, int kv_dim, int lo,
                    int hi, FilterScratch& s, double* mag) {
  const int n_bins = n_tok / 2 + 1;
  transpose_to_channels(src, n_tok, kv_dim, s.seq.get());
  fftwf_execute_dft_r2c(plans.r2c, s.seq.get(), s.spec.get());
  for (int c = 0; c < kv_dim; ++c) {
    float* spec = reinterpret_cast<float*>(s.spec.get() + static_cast<size_t>(c) * n_bins);
    std::fill(spec, spec + 2 * lo, 0.0f);
    std::fill(spec + 2 * hi, spec + 2 * n_bins, 0.0f);
  }
  fftwf_execute_dft_c2r(plans.c2r, s.spec.get(), s.seq.get());
  float* sq = s.sq.data();
  std::fill(sq, sq + n_tok, 0.0f);
  for (int c = 0; c < kv_dim; ++c) {
    const float* y = s.seq.get() + static_cast<size_t>(c) * n_tok;
    for (int t = 0; t < n_tok; ++t) sq[t] += y[t] * y[t];
  }
  // FFTW's inverse is unnormalised: it returns N times the band-limited signal.
  const double scale = 1.0 / n_tok;
  for (int t = 0; t < n_tok; ++t) mag[t] = std::sqrt(static_cast<double>(sq[t])) * scale;
}

// GPU filtering and norms for the 2L matrices (K of each layer, then V of each layer), in the
// same double per-layer magnitude layout the CPU path fills (backend::cuda_band_norms keeps the
// last shape's device buffers and plans).
void cuda_layer_norms(const std::vector<const float*>& k_layers,
                      const std::vector<const float*>& v_layers, int n_tok, int kv_dim, bool filter,
                      int lo, int hi, std::vector<double>& kmag, std::vector<double>& vmag) {
  const int n_layer = static_cast<int>(k_layers.size());
  std::vector<const float*> mats(k_layers);
  mats.insert(mats.end(), v_layers.begin(), v_layers.end());
  const std::vector<float> mag = backend::cuda_band_norms(mats, n_tok, kv_dim, filter, lo, hi);
  const size_t half = static_cast<size_t>(n_layer) * n_tok;
  for (size_t i = 0; i < half; ++i) {
    kmag[i] = mag[i];
    vmag[i] = mag[half + i];
  }
}

}  // namespace

bool cuda_ranking_available() { return backend::backend_available("cuda"); }

int n_keep_bins(double alpha, int n_tok) {
  CT_THROW_IF_NOT(alpha >= 0.0 && alpha <= 1.0, "n_keep_bins: alpha = {}; expected [0, 1]", alpha);
  CT_THROW_IF_NOT(n_tok >= 0, "n_keep_bins: n_tok = {}; expected >= 0", n_tok);
  const int n_bins = n_tok / 2 + 1;
  const int64_t k = robust_ceil(alpha * n_bins);
  return static_cast<int>(std::clamp<int64_t>(k, 1, n_bins));
}

int n_select(double r, int n_tok) {
  CT_THROW_IF_NOT(!std::isnan(r), "n_select: ratio is NaN; expected a number in [0, 1]");
  CT_THROW_IF_NOT(n_tok >= 0, "n_select: n_tok = {}; expected >= 0", n_tok);
  if (n_tok == 0 || r <= 0.0) return 0;
  if (r >= 1.0) return n_tok;
  return static_cast<int>(std::clamp<int64_t>(robust_ceil(r * n_tok), 0, n_tok));
}

ChunkRanking rank_chunk_tokens(const std::vector<const float*>& k_layers,
                               const std::vector<const float*>& v_layers, int n_tok, int kv_dim,
                               const RankOptions& opt) {
  validate(k_layers, v_layers, n_tok, kv_dim);
  validate_options(opt);
  if (n_tok == 0) return {};
  const int n_layer = static_cast<int>(k_layers.size());
  // Plain variables, not a structured binding: clang before 16 cannot capture bindings in the
  // OpenMP region below (the fuzz and sanitizer builds use clang).
  const std::pair<int, int> bins = kept_bins(opt, n_tok);
  const int lo = bins.first, hi = bins.second;
  const bool filter = opt.mode != RankMode::kL2;
  std::vector<double> kmag(static_cast<size_t>(n_layer) * n_tok);
  std::vector<double> vmag(kmag.size());
  if (opt.device == RankDevice::kCuda) {
    CT_THROW_IF_NOT(backend::backend_built("cuda"), "freq_rank: device 'cuda' requested but {}",
                    backend::kNoCudaMessage);
    cuda_layer_norms(k_layers, v_layers, n_tok, kv_dim, filter, lo, hi, kmag, vmag);
    return finish_ranking(kmag, vmag, n_layer, n_tok);
  }
  const BatchPlans* plans = filter ? &batch_plans(n_tok, kv_dim) : nullptr;
#pragma omp parallel
  {
    std::unique_ptr<FilterScratch> scratch;
    if (filter) scratch = std::make_unique<FilterScratch>(n_tok, kv_dim);
#pragma omp for schedule(dynamic, 1)
    for (int l = 0; l < n_layer; ++l) {
      double* km = kmag.data() + static_cast<size_t>(l) * n_tok;
      double* vm = vmag.data() + static_cast<size_t>(l) * n_tok;
      if (filter) {
        filtered_norms(*plans, k_layers[l], n_tok, kv_dim, lo, hi, *scratch, km);
        filtered_norms(*plans, v_layers[l], n_tok, kv_dim, lo, hi, *scratch, vm);
      } else {
        row_norms(k_layers[l], n_tok, kv_dim, 1.0, km);
        row_norms(v_layers[l], n_tok, kv_dim, 1.0, vm);
      }
    }
  }
  return finish_ranking(kmag, vmag, n_layer, n_tok);
}

ChunkRanking rank_chunk_tokens_reference(const std::vector<const float*>& k_layers,
                                         const std::vector<const float*>& v_layers, int n_tok,
                                         int kv_dim, const RankOptions& opt) {
  validate(k_layers, v_layers, n_tok, kv_dim);
  validate_options(opt);
  if (n_tok == 0) return {};
  const int n_layer = static_cast<int>(k_layers.size());
  const auto [lo, hi] = kept_bins(opt, n_tok);
  const bool filter = opt.mode != RankMode::kL2;
  // Exact twiddles e^{-2 pi i m / N} indexed by (k * t) mod N.
  std::vector<std::complex<double>> tw(n_tok);
  for (int m = 0; m < n_tok; ++m) {
    tw[m] = std::polar(1.0, -2.0 * std::numbers::pi * m / n_tok);
  }
  std::vector<double> kmag(static_cast<size_t>(n_layer) * n_tok);
  std::vector<double> vmag(kmag.size());
  std::vector<double> sq(n_tok), x(n_tok);
  for (int l = 0; l < n_layer; ++l) {
    for (int which = 0; which < 2; ++which) {
      const float* src = which == 0 ? k_layers[l] : v_layers[l];
      double* mag = (which == 0 ? kmag.data() : vmag.data()) + static_cast<size_t>(l) * n_tok;
      std::fill(sq.begin(), sq.end(), 0.0);
      for (int c = 0; c < kv_dim; ++c) {
        for (int t = 0; t < n_tok; ++t) x[t] = src[static_cast<size_t>(t) * kv_dim + c];
        if (filter) {
          // y_t = (1/N) sum over the kept bins of the full (Hermitian) spectrum; a bin k with
          // 0 < 2k < N stands for both k and N-k, hence weight 2 on its real part.
          std::vector<double> y(n_tok, 0.0);
          for (int k = lo; k < hi; ++k) {
            std::complex<double> xk = 0.0;
            for (int t = 0; t < n_tok; ++t) {
              xk += x[t] * tw[(static_cast<int64_t>(k) * t) % n_tok];
            }
            const double w = (k == 0 || 2 * k == n_tok) ? 1.0 : 2.0;
            for (int t = 0; t < n_tok; ++t) {
              y[t] += w * (xk * std::conj(tw[(static_cast<int64_t>(k) * t) % n_tok])).real();
            }
          }
          for (int t = 0; t < n_tok; ++t) x[t] = y[t] / n_tok;
        }
        for (int t = 0; t < n_tok; ++t) sq[t] += x[t] * x[t];
      }
      for (int t = 0; t < n_tok; ++t) mag[t] = std::sqrt(sq[t]);
    }
  }
  return finish_ranking(kmag, vmag, n_layer, n_tok);
}

std::vector<double> kv_band_energy(const std::vector<const float*>& k_layers,
                                   const std::vector<const float*>& v_layers, int n_tok, int kv_dim,
                                   int n_bands) {
  validate(k_layers, v_layers, n_tok, kv_dim);
  CT_THROW_IF_NOT(n_bands >= 1, "kv_band_energy: n_bands = {}; expected >= 1", n_bands);
  std::vector<double> bands(n_bands, 0.0);
  if (n_tok == 0) return bands;
  const int n_layer = static_cast<int>(k_layers.size());
  const int n_bins = n_tok / 2 + 1;
  const BatchPlans& plans = batch_plans(n_tok, kv_dim);
  std::vector<int> band_of(n_bins);
  for (int k = 0; k < n_bins; ++k) {
    band_of[k] = static_cast<int>(
        std::min<int64_t>(n_bands - 1, 2 * static_cast<int64_t>(k) * n_bands / n_tok));
  }
  // Per-layer sums, added in layer order afterwards so the result does not depend on threads.
  std::vector<double> layer_bands(static_cast<size_t>(n_layer) * n_bands, 0.0);
#pragma omp parallel
  {
    FilterScratch s(n_tok, kv_dim);
#pragma omp for schedule(dynamic, 1)
    for (int l = 0; l < n_layer; ++l) {
      double* out = layer_bands.data() + static_cast<size_t>(l) * n_bands;
      for (const float* src : {k_layers[l], v_layers[l]}) {
        transpose_to_channels(src, n_tok, kv_dim, s.seq.get());
        fftwf_execute_dft_r2c(plans.r2c, s.seq.get(), s.spec.get());
        for (int c = 0; c < kv_dim; ++c) {
          const fftwf_complex* spec = s.spec.get() + static_cast<size_t>(c) * n_bins;
          for (int k = 0; k < n_bins; ++k) {
            const double e = static_cast<double>(spec[k][0]) * spec[k][0] +
                             static_cast<double>(spec[k][1]) * spec[k][1];
            const double mult = (k == 0 || 2 * k == n_tok) ? 1.0 : 2.0;
            out[band_of[k]] += mult * e;
          }
        }
      }
    }
  }
  double total = 0.0;
  for (int l = 0; l < n_layer; ++l) {
    for (int b = 0; b < n_bands; ++b) bands[b] += layer_bands[static_cast<size_t>(l) * n_bands + b];
  }
  for (double b : bands) total += b;
  CT_THROW_IF_NOT(std::isfinite(total), "kv_band_energy: non-finite energy; NaN or Inf in K/V");
  if (total > 0.0) {
    for (double& b : bands) b /= total;
  }
  return bands;
}

}  // namespace ct
