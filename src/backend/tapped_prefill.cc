// tapped_prefill (backend.h): one tapped pass through whichever LayerBackend runs it.
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace ct {

void tapped_prefill(const Model& m, const int32_t* tokens, int n, DeviceSequence* device, float* k,
                    float* v, float* probs, int probs_from_row) {
  const ModelConfig& c = m.config();
  CT_THROW_IF_NOT(n > 0, "a tapped prefill needs at least one token");
  CT_THROW_IF_NOT(probs_from_row < n, "attention tap from row {} of a {}-row prefill",
                  probs_from_row, n);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  // The CPU backend computes on a cache of its own; the device keeps its own.
  KVCache kv = device ? KVCache() : m.make_cache(n);
  Workspace ws;
  const std::unique_ptr<LayerBackend> be =
      device ? device->layers(nullptr) : make_cpu_layers(m, kv, ws, PipelineOptions{});
  be->begin(tokens, pos.data(), n);
  const size_t cells = (size_t)n * c.kv_dim();
  for (int l = 0; l < c.n_layer; ++l) {
    LayerTap tap;
    tap.k_pre_rope = k + (size_t)l * cells;
    tap.v = v + (size_t)l * cells;
    if (probs_from_row >= 0) {
      tap.probs_accum = probs;
      tap.probs_from_row = probs_from_row;
    }
    be->layer(l, &tap);
  }
  // The output head is not needed, so the pass is not finished.
}

}  // namespace ct
