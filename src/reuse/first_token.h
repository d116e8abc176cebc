// The one request runner of the measuring tools: a prepared composed request through the
// selective prefill to its first token, with the one definition of time to first token (TTFT)
// that the eval harness, `cachetune bench-tiers` and ratio calibration all report:
//
//   TTFT = selective prefill (selection, complement loading, layers, logits)
//        + the greedy first token + its text (what a streaming client waits for).
//
// Work a deployment does at ingest (Policy::prepare: a ranking it would store) runs before the
// timer. The KV cache's pages are the caller's: allocate it outside the timer, as a serving loop
// does. The server's TTFT (Engine, docs/SERVER.md) is this plus what precedes the prefill in
// serving: queueing, chunk lookup and any encoding of chunks not yet cached.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu_forward.h"
#include "reuse/selective.h"

namespace ct {

struct FirstToken {
  std::vector<float> logits;  // F32 [n_vocab] of the last prompt position
  int32_t token = -1;         // greedy (argmax, lowest id on ties)
  std::string piece;          // its text
  double ttft_ms = 0;
  PrefillBreakdown bd;
};

FirstToken run_to_first_token(const Model& m, const ComposedRequest& req,
                              const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                              SelectionReport* report = nullptr);

}  // namespace ct
