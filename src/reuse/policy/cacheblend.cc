// `cacheblend` (CacheBlend, Yao et al. 2025; online): layer 0 recomputes every row; then each
// chunk token's layer-1 K/V (projected from layer 0's output, so they see the request's context)
// are compared with the stored ones, and the ceil(r*N) per chunk that deviate most (squared L2
// over K and V) are recomputed from layer 1 on. LMCache's implementation checks the same layer
// (check_layers = [1]); layer 0's K/V depend on the token alone and would rank rounding noise.
#include <vector>

#include "reuse/policy.h"

namespace ct::policies {
namespace {
class CacheBlend final : public Policy {
 public:
  CacheBlend()
      : Policy("cacheblend",
               "layer 0 in full, then the ceil(r*N) tokens whose layer-1 K/V deviate most",
               PolicyStage::kAfterLayer0) {}
  std::vector<int32_t> select_after_layer0(const ChunkSource& c, int layer, const float* k,
                                           const float* v, const PolicyOptions& p) const override {
    const ChunkMeta& meta = c.meta();
    const int KV = meta.kv_dim;
    const size_t row_bytes = kv_bytes(meta.dtype, KV);
    std::vector<uint8_t> sk(row_bytes * meta.n_tok), sv(row_bytes * meta.n_tok);
    c.read_rows(layer, 0, meta.n_tok, sk.data(), sv.data());
    std::vector<float> stored(KV), dev(meta.n_tok);
    for (int j = 0; j < meta.n_tok; ++j) {
      const int t = meta.order[j];
      double d = 0;
      kv_unpack(meta.dtype, sk.data() + j * row_bytes, stored.data(), KV);
      for (int i = 0; i < KV; ++i) {
        const double e = k[(size_t)t * KV + i] - stored[i];
        d += e * e;
      }
      kv_unpack(meta.dtype, sv.data() + j * row_bytes, stored.data(), KV);
      for (int i = 0; i < KV; ++i) {
        const double e = v[(size_t)t * KV + i] - stored[i];
        d += e * e;
      }
      dev[t] = (float)d;
    }
    return top_r_by_score(dev, p.ratio);
  }
};
}  // namespace
const Policy& cacheblend() { return instance<CacheBlend>(); }
}  // namespace ct::policies
