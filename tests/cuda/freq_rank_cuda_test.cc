// The GPU ranking path (cuFFT, backend/cuda/band_norms) against the CPU FFTW path, which
// tests/unit checks against the O(N^2) double reference. Skipped where no CUDA device is present:
// these run on the GPU machine (tools/gpu_check.sh), and CI builds them so they keep compiling.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/band_norms.h"
#include "backend/registry.h"
#include "core/error.h"
#include "reuse/freq_rank.h"
#include "support/ranking_check.h"

namespace ct {
namespace {

using test::expect_rankings_match;
using test::Kv;
using test::random_kv;

#define CT_REQUIRE_CUDA_DEVICE() \
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device"

// After the last test, frees what the ranking keeps on the device (its last shape's buffers and
// plans), so that memcheck's leak report (tools/gpu_check.sh) lists only real leaks.
class ReleaseKeptDeviceState : public ::testing::Environment {
 public:
  void TearDown() override { backend::release_cuda_band_norms(); }
};
[[maybe_unused]] ::testing::Environment* const kReleaseKept =
    ::testing::AddGlobalTestEnvironment(new ReleaseKeptDeviceState);

ChunkRanking rank_on(const Kv& kv, RankMode mode, double alpha, RankDevice device) {
  RankOptions opt;
  opt.mode = mode;
  opt.alpha = alpha;
  opt.device = device;
  return rank_chunk_tokens(kv.kp(), kv.vp(), kv.n_tok, kv.kv_dim, opt);
}

TEST(CudaRank, MatchesCpuOnSmallShapes) {
  CT_REQUIRE_CUDA_DEVICE();
  // Odd and even lengths, one- and two-token chunks, and channel counts below, at and above a
  // warp so the reduction's lane loop sees partial and several segments.
  for (int n : {1, 2, 3, 17, 64, 257}) {
    for (int kv_dim : {5, 32, 72}) {
      const Kv kv = random_kv(3, n, kv_dim, 500 + n + kv_dim);
      for (RankMode mode : {RankMode::kLowFreq, RankMode::kHighFreq, RankMode::kL2}) {
        for (double alpha : {0.0, 0.25, 0.5, 1.0}) {
          const std::string what = "n=" + std::to_string(n) + " kv_dim=" + std::to_string(kv_dim) +
                                   " mode=" + std::to_string(static_cast<int>(mode)) +
                                   " alpha=" + std::to_string(alpha);
          expect_rankings_match(rank_on(kv, mode, alpha, RankDevice::kCuda),
                                rank_on(kv, mode, alpha, RankDevice::kCpu), 1e-4, what);
        }
      }
    }
  }
}

TEST(CudaRank, MatchesCpuAtThePaperShape) {
  CT_REQUIRE_CUDA_DEVICE();
  // SmolLM2-135M's KV shape (30 layers, 3 KV heads x 64) at the 3,000 tokens the paper times.
  const Kv kv = random_kv(30, 3000, 192, 7);
  for (RankMode mode : {RankMode::kLowFreq, RankMode::kHighFreq, RankMode::kL2}) {
    expect_rankings_match(rank_on(kv, mode, 0.5, RankDevice::kCuda),
                          rank_on(kv, mode, 0.5, RankDevice::kCpu), 1e-4,
                          "mode=" + std::to_string(static_cast<int>(mode)));
  }
}

TEST(CudaRank, RunLeavesTheUploadedMatricesIntact) {
  CT_REQUIRE_CUDA_DEVICE();
  // run() must not consume X (cuFFT may overwrite a transform's input): a second run on the same
  // upload gives bit-identical norms, and an unfiltered run afterwards still sees the input.
  const Kv kv = random_kv(2, 100, 24, 11);
  std::vector<const float*> mats = kv.kp();
  for (const float* p : kv.vp()) mats.push_back(p);
  cuda::BandNorms bn(4, 100, 24);
  bn.upload(mats);
  const std::vector<float> a = bn.run(true, 0, 26);
  const std::vector<float> b = bn.run(true, 0, 26);
  EXPECT_EQ(a, b);
  const std::vector<float> raw = bn.run(false, 0, 0);
  for (int m = 0; m < 4; ++m) {
    for (int t = 0; t < 100; ++t) {
      double sq = 0.0;
      for (int c = 0; c < 24; ++c) {
        const double x = mats[m][static_cast<size_t>(t) * 24 + c];
        sq += x * x;
      }
      ASSERT_NEAR(raw[static_cast<size_t>(m) * 100 + t], std::sqrt(sq), 1e-4 * std::sqrt(sq))
          << "m=" << m << " t=" << t;
    }
  }
}

TEST(CudaRank, ShapeChangesBetweenCallsAreHandled) {
  CT_REQUIRE_CUDA_DEVICE();
  // The cached device state is rebuilt for a new shape; going back to the first shape must still
  // match the CPU, and so must a call after the kept state was released.
  const Kv a = random_kv(4, 300, 48, 1), b = random_kv(2, 77, 16, 2);
  const std::vector<const Kv*> order = {&a, &b, &a, &a};
  for (size_t i = 0; i < order.size(); ++i) {
    const Kv* kv = order[i];
    if (i == 3) backend::release_cuda_band_norms();
    expect_rankings_match(rank_on(*kv, RankMode::kLowFreq, 0.5, RankDevice::kCuda),
                          rank_on(*kv, RankMode::kLowFreq, 0.5, RankDevice::kCpu), 1e-4,
                          "n_tok=" + std::to_string(kv->n_tok));
  }
}

TEST(CudaRank, BadArgumentsAreClearErrors) {
  CT_REQUIRE_CUDA_DEVICE();
  EXPECT_THROW(cuda::BandNorms(0, 10, 4), Error);
  cuda::BandNorms bn(2, 10, 4);
  EXPECT_THROW(bn.upload({nullptr}), Error);  // wrong count
  const std::vector<float> m(40, 1.0f);
  EXPECT_THROW(bn.upload({m.data(), nullptr}), Error);
  bn.upload({m.data(), m.data()});
  EXPECT_THROW(bn.run(true, 3, 3), Error);  // empty band
  EXPECT_THROW(bn.run(true, 0, 7), Error);  // past the 6 bins
}

}  // namespace
}  // namespace ct
