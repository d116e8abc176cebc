// tapped_prefill and TappedPass (backend.h): one tapped pass through whichever LayerBackend runs
// it, whole or in row slices.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace ct {

TappedPass::TappedPass(const Model& m, const int32_t* tokens, int n, DeviceSequence* device,
                       float* k, float* v, float* probs, int probs_from_row)
    : m_(m),
      tokens_(tokens, tokens + std::max(n, 0)),
      pos_(std::max(n, 0)),
      n_(n),
      device_(device),
      k_(k),
      v_(v),
      probs_(probs),
      probs_from_row_(probs ? probs_from_row : -1) {
  CT_THROW_IF_NOT(n > 0, "a tapped prefill needs at least one token");
  CT_THROW_IF_NOT(probs_from_row_ < n, "attention tap from row {} of a {}-row prefill",
                  probs_from_row_, n);
  std::iota(pos_.begin(), pos_.end(), 0);
  // The CPU backend computes on a cache of its own; the device keeps its own.
  if (!device) kv_ = m.make_cache(n);
  be_ = device ? device->layers(nullptr) : make_cpu_layers(m, kv_, ws_, PipelineOptions{});
}

TappedPass::~TappedPass() = default;

void TappedPass::run(int rows) {
  CT_THROW_IF_NOT(rows > 0 && rows <= rows_left(), "a slice of {} rows of a pass with {} left",
                  rows, rows_left());
  CT_THROW_IF_NOT(!device_ || rows == n_, "a {} tapped pass runs whole: {} rows of {}",
                  device_ ? device_->name() : "", rows, n_);
  const ModelConfig& c = m_.config();
  const int a = done_, KV = c.kv_dim();
  be_->begin(tokens_.data() + a, pos_.data() + a, rows);
  const size_t cells = (size_t)n_ * KV;
  // The attention tap's rows, relative to this slice's: none when the slice ends before them.
  const bool tap_probs = probs_from_row_ >= 0 && probs_from_row_ < a + rows;
  for (int l = 0; l < c.n_layer; ++l) {
    LayerTap tap;
    tap.k_pre_rope = k_ + (size_t)l * cells + (size_t)a * KV;
    tap.v = v_ + (size_t)l * cells + (size_t)a * KV;
    if (tap_probs) {
      tap.probs_accum = probs_;
      tap.probs_from_row = std::max(0, probs_from_row_ - a);
    }
    be_->layer(l, &tap);
  }
  // The output head is not needed, so the pass is not finished.
  done_ += rows;
}

void tapped_prefill(const Model& m, const int32_t* tokens, int n, DeviceSequence* device, float* k,
                    float* v, float* probs, int probs_from_row) {
  TappedPass pass(m, tokens, n, device, k, v, probs, probs_from_row);
  pass.run(n);
}

}  // namespace ct
