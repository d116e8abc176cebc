// Tests for the frequency-domain chunk ranking: FFTW path against the O(N^2) double reference,
// the low- vs high-frequency behaviour on a synthetic signal, determinism, alpha = 1 == L2,
// the ratio -> count rule, and the band-energy measurement.
#include "reuse/freq_rank.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <numbers>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "support/ranking_check.h"

namespace ct {
namespace {

using test::expect_rankings_match;
using test::Kv;
using test::random_kv;

ChunkRanking fast(const Kv& kv, RankMode mode, double alpha) {
  return rank_chunk_tokens(kv.kp(), kv.vp(), kv.n_tok, kv.kv_dim, {mode, alpha});
}
ChunkRanking ref(const Kv& kv, RankMode mode, double alpha) {
  return rank_chunk_tokens_reference(kv.kp(), kv.vp(), kv.n_tok, kv.kv_dim, {mode, alpha});
}

TEST(FreqRank, FftwMatchesReference) {
  for (int n : {1, 2, 3, 17, 64, 100, 257}) {
    const Kv kv = random_kv(3, n, 12, 1000 + n);
    for (RankMode mode : {RankMode::kLowFreq, RankMode::kHighFreq, RankMode::kL2}) {
      for (double alpha : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0}) {
        const std::string what = "n=" + std::to_string(n) +
                                 " mode=" + std::to_string(static_cast<int>(mode)) +
                                 " alpha=" + std::to_string(alpha);
        expect_rankings_match(fast(kv, mode, alpha), ref(kv, mode, alpha), 1e-4, what);
      }
    }
  }
}

TEST(FreqRank, OrderIsDescendingWithIndexTieBreak) {
  // Every token identical: all scores tie, so the order is 0..N-1.
  Kv kv(2, 9, 4);
  for (auto& m : kv.k) std::fill(m.begin(), m.end(), 1.0f);
  for (auto& m : kv.v) std::fill(m.begin(), m.end(), 2.0f);
  const ChunkRanking r = fast(kv, RankMode::kL2, 0.5);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(r.order[i], i);
  for (float s : r.scores) EXPECT_FLOAT_EQ(s, 1.0f);  // magnitude / mean magnitude = 1

  const ChunkRanking lr = fast(random_kv(2, 50, 8, 7), RankMode::kLowFreq, 0.5);
  for (size_t i = 1; i < lr.order.size(); ++i) {
    const float a = lr.scores[lr.order[i - 1]], b = lr.scores[lr.order[i]];
    EXPECT_TRUE(a > b || (a == b && lr.order[i - 1] < lr.order[i])) << i;
  }
}

// A smooth Gaussian bump marks tokens 31..49 and a burst of alternating-sign values under a Hann
// envelope marks tokens 80..119. The burst has the larger raw peak, so plain L2 ranks it first;
// its energy sits near the Nyquist frequency (the smooth envelope keeps it there; a hard-edged
// burst would leak to low frequencies at its edges), so the low-pass keeps the bump and the
// high-pass keeps the burst.
TEST(FreqRank, LowFreqPicksBumpHighFreqPicksNoise) {
  const int n = 128, d = 16;
  Kv kv(2, n, d);
  for (int l = 0; l < 2; ++l) {
    for (int t = 0; t < n; ++t) {
      const double bump = 2.0 * std::exp(-(t - 40.0) * (t - 40.0) / (2.0 * 25.0));
      const double hann =
          (t >= 80 && t < 120) ? 0.5 - 0.5 * std::cos(2 * std::numbers::pi * (t - 79) / 41) : 0.0;
      const double burst = 3.0 * hann * ((t % 2) ? -1.0 : 1.0);
      for (int c = 0; c < d; ++c) {
        const float sign = (c % 2) ? -1.0f : 1.0f;  // channels differ; magnitudes do not care
        kv.k[l][t * d + c] = sign * static_cast<float>(1.0 + bump + burst);
        kv.v[l][t * d + c] = static_cast<float>((0.5 + bump + burst) * (1 + c % 3));
      }
    }
  }
  const int k = n_select(0.15, n);
  ASSERT_EQ(k, 20);
  const ChunkRanking low = fast(kv, RankMode::kLowFreq, 0.5);
  const ChunkRanking high = fast(kv, RankMode::kHighFreq, 0.5);
  const ChunkRanking l2 = fast(kv, RankMode::kL2, 0.5);
  for (int i = 0; i < k; ++i) {
    EXPECT_TRUE(low.order[i] >= 25 && low.order[i] <= 55) << "lowfreq " << low.order[i];
    EXPECT_TRUE(high.order[i] >= 80 && high.order[i] < 120) << "highfreq " << high.order[i];
  }
  // The premise: raw magnitude alone prefers the burst.
  EXPECT_TRUE(l2.order[0] >= 80 && l2.order[0] < 120) << l2.order[0];
}

TEST(FreqRank, DeterministicAcrossCallsAndThreadCounts) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "runs OpenMP with 2 threads: libgomp is not built with TSan, so its barriers "
                  "look like races to it (the other builds run this test)";
#endif
  const Kv kv = random_kv(5, 301, 24, 42);
  for (RankMode mode : {RankMode::kLowFreq, RankMode::kHighFreq, RankMode::kL2}) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const ChunkRanking one = fast(kv, mode, 0.5);
    omp_set_num_threads(2);
    const ChunkRanking a = fast(kv, mode, 0.5);
    const ChunkRanking b = fast(kv, mode, 0.5);
    omp_set_num_threads(saved);
    for (const ChunkRanking* r : {&a, &b}) {
      ASSERT_EQ(r->scores.size(), one.scores.size());
      EXPECT_EQ(0, std::memcmp(r->scores.data(), one.scores.data(), one.scores.size() * 4));
      EXPECT_EQ(r->order, one.order);
    }
  }
}

TEST(FreqRank, AlphaOneReducesToL2) {
  const int n = 200;
  const Kv kv = random_kv(4, n, 24, 99);
  const ChunkRanking l2 = fast(kv, RankMode::kL2, 0.5);
  const int k = n_select(0.15, n);
  // The top-k comparison is only meaningful when the k-th and (k+1)-th L2 scores are apart.
  const float gap = l2.scores[l2.order[k - 1]] - l2.scores[l2.order[k]];
  ASSERT_GT(gap, 1e-3f * l2.scores[l2.order[k - 1]]) << "pick another seed";
  const std::set<int32_t> want(l2.order.begin(), l2.order.begin() + k);
  for (RankMode mode : {RankMode::kLowFreq, RankMode::kHighFreq}) {
    const ChunkRanking full = fast(kv, mode, 1.0);
    for (int t = 0; t < n; ++t) {
      EXPECT_NEAR(full.scores[t], l2.scores[t], 1e-4 * l2.scores[t]) << t;
    }
    EXPECT_EQ(std::set<int32_t>(full.order.begin(), full.order.begin() + k), want);
  }
}

TEST(FreqRank, NSelect) {
  EXPECT_EQ(n_select(0.15, 100), 15);
  EXPECT_EQ(n_select(0.15, 3000), 450);
  EXPECT_EQ(n_select(0.15, 1), 1);
  EXPECT_EQ(n_select(0.15, 0), 0);
  EXPECT_EQ(n_select(0.1, 100), 10);
  EXPECT_EQ(n_select(0.07, 100), 7);    // 7.000000000000001 in double
  EXPECT_EQ(n_select(0.14, 100), 14);   // 14.000000000000002
  EXPECT_EQ(n_select(0.29, 100), 29);   // 28.999999999999996
  EXPECT_EQ(n_select(0.15f, 100), 15);  // the float 0.15f is 0.150000006
  EXPECT_EQ(n_select(0.364, 1000), 364);
  EXPECT_EQ(n_select(0.151, 100), 16);
  EXPECT_EQ(n_select(0.15, 101), 16);  // 15.15 rounds up
  for (int n : {1, 7, 100, 3000}) {
    EXPECT_EQ(n_select(0.0, n), 0);
    EXPECT_EQ(n_select(1.0, n), n);
    EXPECT_EQ(n_select(-0.5, n), 0);
    EXPECT_EQ(n_select(2.0, n), n);
  }
  EXPECT_THROW(n_select(std::nan(""), 10), Error);
  EXPECT_THROW(n_select(0.5, -1), Error);
}

TEST(FreqRank, NKeepBins) {
  EXPECT_EQ(n_keep_bins(0.5, 3000), 751);  // ceil(0.5 * 1501)
  EXPECT_EQ(n_keep_bins(0.5, 64), 17);     // ceil(0.5 * 33)
  EXPECT_EQ(n_keep_bins(0.07, 198), 7);    // 0.07 * 100 = 7.000000000000001 in double
  EXPECT_EQ(n_keep_bins(0.0, 64), 1);
  EXPECT_EQ(n_keep_bins(1.0, 64), 33);
  EXPECT_EQ(n_keep_bins(1.0, 1), 1);
  EXPECT_THROW(n_keep_bins(1.5, 10), Error);
  EXPECT_THROW(n_keep_bins(-0.1, 10), Error);
}

TEST(FreqRank, RejectsBadInput) {
  Kv kv = random_kv(2, 10, 4, 1);
  auto kp = kv.kp(), vp = kv.vp();
  EXPECT_THROW(rank_chunk_tokens(kp, {vp[0]}, 10, 4, {}), Error);
  EXPECT_THROW(rank_chunk_tokens({}, {}, 10, 4, {}), Error);
  EXPECT_THROW(rank_chunk_tokens(kp, vp, 10, 0, {}), Error);
  EXPECT_THROW(rank_chunk_tokens(kp, vp, 10, 4, {RankMode::kLowFreq, 1.5}), Error);
  EXPECT_THROW(rank_chunk_tokens(kp, {vp[0], nullptr}, 10, 4, {}), Error);
  EXPECT_NO_THROW(rank_chunk_tokens(kp, vp, 10, 4, {RankMode::kL2, 7.0}));  // alpha unused
  kv.v[1][13] = std::nanf("");
  EXPECT_THROW(rank_chunk_tokens(kv.kp(), kv.vp(), 10, 4, {}), Error);
  EXPECT_THROW(rank_chunk_tokens_reference(kv.kp(), kv.vp(), 10, 4, {}), Error);
  const ChunkRanking empty = rank_chunk_tokens(kp, vp, 0, 4, {});
  EXPECT_TRUE(empty.scores.empty() && empty.order.empty());
}

TEST(FreqRank, CudaDeviceWithoutCudaIsAClearError) {
  if (cuda_ranking_available()) GTEST_SKIP() << "a CUDA device is present: tests/cuda covers it";
  const Kv kv = random_kv(2, 16, 4, 3);
  RankOptions opt;
  opt.device = RankDevice::kCuda;
  try {
    rank_chunk_tokens(kv.kp(), kv.vp(), kv.n_tok, kv.kv_dim, opt);
    FAIL() << "expected ct::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("CUDA") != std::string::npos) << msg;
  }
}

TEST(FreqRank, AllZeroLayerContributesNothing) {
  Kv kv = random_kv(2, 33, 6, 5);
  Kv one_layer(1, 33, 6);
  one_layer.k[0] = kv.k[0];
  one_layer.v[0] = kv.v[0];
  std::fill(kv.k[1].begin(), kv.k[1].end(), 0.0f);
  std::fill(kv.v[1].begin(), kv.v[1].end(), 0.0f);
  const ChunkRanking two = fast(kv, RankMode::kLowFreq, 0.5);
  const ChunkRanking one = fast(one_layer, RankMode::kLowFreq, 0.5);
  for (int t = 0; t < 33; ++t) EXPECT_NEAR(two.scores[t], 0.5f * one.scores[t], 1e-6) << t;
  EXPECT_EQ(two.order, one.order);
}

// Direct-DFT band energies for comparison, same definition as kv_band_energy.
std::vector<double> band_energy_direct(const Kv& kv, int n_bands) {
  const int n = kv.n_tok;
  std::vector<double> bands(n_bands, 0.0);
  for (int l = 0; l < kv.n_layer; ++l) {
    for (const auto* m : {&kv.k[l], &kv.v[l]}) {
      for (int c = 0; c < kv.kv_dim; ++c) {
        for (int k = 0; k <= n / 2; ++k) {
          std::complex<double> x = 0.0;
          for (int t = 0; t < n; ++t) {
            x += static_cast<double>((*m)[t * kv.kv_dim + c]) *
                 std::polar(1.0, -2.0 * std::numbers::pi * ((k * t) % n) / n);
          }
          const double mult = (k == 0 || 2 * k == n) ? 1.0 : 2.0;
          bands[std::min(n_bands - 1, 2 * k * n_bands / n)] += mult * std::norm(x);
        }
      }
    }
  }
  double total = 0.0;
  for (double b : bands) total += b;
  for (double& b : bands) b /= total;
  return bands;
}

TEST(FreqRank, BandEnergy) {
  for (int n : {1, 2, 17, 64, 99}) {
    const Kv kv = random_kv(2, n, 6, 300 + n);
    for (int n_bands : {1, 4, 10}) {
      const std::vector<double> got = kv_band_energy(kv.kp(), kv.vp(), n, 6, n_bands);
      const std::vector<double> want = band_energy_direct(kv, n_bands);
      ASSERT_EQ(got.size(), static_cast<size_t>(n_bands));
      double sum = 0.0;
      for (int b = 0; b < n_bands; ++b) {
        sum += got[b];
        EXPECT_NEAR(got[b], want[b], 1e-5) << "n=" << n << " band " << b;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
  // Pure DC: a per-channel constant puts everything in band 0.
  Kv dc(3, 50, 5);
  for (int l = 0; l < 3; ++l) {
    for (int t = 0; t < 50; ++t) {
      for (int c = 0; c < 5; ++c) {
        dc.k[l][t * 5 + c] = 1.0f + c;
        dc.v[l][t * 5 + c] = -2.0f * l - 0.5f;
      }
    }
  }
  const std::vector<double> e = kv_band_energy(dc.kp(), dc.vp(), 50, 5, 5);
  EXPECT_NEAR(e[0], 1.0, 1e-9);
  for (int b = 1; b < 5; ++b) EXPECT_NEAR(e[b], 0.0, 1e-9) << b;
  // A pure cosine at bin 30 of N=100 (normalised frequency 0.3) lands in band floor(0.3/0.1) = 3.
  Kv tone(1, 100, 2);
  for (int t = 0; t < 100; ++t) {
    for (int c = 0; c < 2; ++c) {
      tone.k[0][t * 2 + c] = static_cast<float>(std::cos(2 * std::numbers::pi * 30 * t / 100 + c));
      tone.v[0][t * 2 + c] = static_cast<float>(std::sin(2 * std::numbers::pi * 30 * t / 100));
    }
  }
  const std::vector<double> te = kv_band_energy(tone.kp(), tone.vp(), 100, 2, 5);
  EXPECT_NEAR(te[3], 1.0, 1e-9);
  // All-zero input: no energy anywhere, and no NaN.
  Kv zero(1, 8, 3);
  for (double b : kv_band_energy(zero.kp(), zero.vp(), 8, 3, 4)) EXPECT_EQ(b, 0.0);
}

}  // namespace
}  // namespace ct
