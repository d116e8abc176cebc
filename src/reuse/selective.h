// Online stage (paper Sec. 4.1-4.2, App. B.2-B.3): prefill of a composed request
// [prefix][chunk ...][query] where, per layer, the selected tokens of each chunk and all
// non-chunk tokens are recomputed in the new context, and every other chunk token's K/V is loaded
// from the chunk record and rotated to its global position (deferred RoPE) before attention.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"  // LayerBackend, PipelineOptions
#include "backend/cpu_forward.h"
#include "backend/row_work.h"
#include "model/model.h"
#include "reuse/chunk_source.h"
#include "reuse/policy.h"
#include "store/chunk.h"

namespace ct {

struct ComposedRequest {
  std::vector<int32_t> prefix;             // recomputed (system prompt, template head)
  std::vector<const ChunkSource*> chunks;  // reused, in prompt order; the same chunk may repeat
  std::vector<int32_t> query;              // recomputed; must not be empty
};

// Where each piece landed: chunk b occupies global positions [chunk_offset[b], +n_tok).
struct RequestLayout {
  std::vector<int32_t> tokens;        // [n_total] global token ids
  std::vector<int32_t> chunk_offset;  // [n_chunks]
  std::vector<int8_t> is_chunk;       // [n_total]
  int n_total = 0;
  int query_begin = 0;
};
RequestLayout layout_request(const ComposedRequest& r);

// TTFT breakdown of one prefill (milliseconds).
struct PrefillBreakdown {
  double select_ms = 0;  // choosing the recompute set (incl. online passes' extra work)
  // Complement K/V: read + unpack to F32 + deferred RoPE, on whichever thread did the work.
  double load_ms = 0;
  // The exposed load cost: time the layer loop waited for the loader or did load work itself
  // (all of load_ms without overlap; RoPE when it runs on the compute thread).
  double load_wait_ms = 0;
  double compute_ms = 0;  // decoder layers on the active rows (projections, attention, MLP)
  double logits_ms = 0;
  double total_ms = 0;
  int n_total = 0;   // prompt length
  int n_active = 0;  // rows recomputed in the layers after selection
  int n_loaded = 0;  // chunk rows loaded per layer
  // GPU path only: copying the finished K/V cache back to the host for CPU decoding (after the
  // first token's logits, so not part of TTFT; included in total_ms).
  double kv_to_host_ms = 0;
};

// Remembers earlier requests' full KV to serve the `prefix` policy (longest exactly matching
// token prefix). Keeps the `capacity` most recent requests.
class PrefixCache {
 public:
  explicit PrefixCache(int capacity = 2) : capacity_(capacity) {}
  // Longest common prefix length with a stored request, and that request's index (-1: none).
  std::pair<int, int> longest_match(const std::vector<int32_t>& tokens) const;
  void copy_rows(int entry, int n, KVCache& kv) const;
  void remember(const std::vector<int32_t>& tokens, const KVCache& kv);

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    KVCache kv;
  };
  int capacity_;
  std::vector<Entry> entries_;  // most recent last
};

struct SelectiveOptions {
  PolicyOptions policy;
  PipelineOptions pipeline;
  // Optional observation for evaluation: attention of the query rows over all key positions,
  // averaged over query rows, heads and layers. F32 [n_total] on return.
  std::vector<float>* query_attention = nullptr;
  PrefixCache* prefix_cache = nullptr;  // for policies with uses_prefix_cache()
  // Compute the layers on this device (backend.h, e.g. the GPU; built from the same model,
  // n_ctx >= the prompt) instead of the CPU: each layer's reused rows are read as stored (sparse:
  // the complement's rank rows) into pinned memory, copied to the device and unpacked and rotated
  // there (pipeline.overlap and rope_in_loader do not apply). Every policy runs there: the layer
  // loop's (layer-0 and query-attention ones included) and the token-stage ones, whose list is
  // prefilled on the device over the rows they placed in the host kv (already rotated, copied as
  // they are). On return the host kv holds the whole cache, as on the CPU path (see
  // device_kv_to_host). One K/V type per request; mixed types are refused. On the GPU,
  // PrefillBreakdown::compute_ms includes the logits and the waiting for the device; load_ms =
  // load_wait_ms is the host's reading and queueing of the reused rows.
  DeviceSequence* device = nullptr;
  // Device only: copy the finished cache back into the host kv (false when decoding continues on
  // the device; the host kv is then not touched and may be empty). A policy with
  // Policy::uses_host_cache() (prefix caching) always gets it back and needs the host kv.
  bool device_kv_to_host = true;
};

// Runs the prefill into kv (reset by the caller to at least n_total positions; on return
// kv.n_pos = n_total, or the compacted length for lfonly) and returns the last position's logits.
std::vector<float> selective_prefill(const Model& m, const ComposedRequest& req,
                                     const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                                     PrefillBreakdown* breakdown = nullptr);

// Per chunk, the tokens (text-order indices, ascending) the policy recomputed in the last call;
// filled by selective_prefill when non-null. Exposed for tests and evaluation.
struct SelectionReport {
  std::vector<std::vector<int32_t>> selected;
};
std::vector<float> selective_prefill(const Model& m, const ComposedRequest& req,
                                     const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                                     PrefillBreakdown* breakdown, SelectionReport* report);

// A selective prefill run in slices of its active rows (chunked prefill): the engine's
// continuous batching (engine/engine.h) steps one slice at a time in a pass it shares with other
// sequences' rows, so decode rows of running requests go on while a long prompt is prefilled.
// The selection is made at construction, where a token-stage policy (prefix, lfonly) also
// places its reused rows, or after a selection pass that the caller steps in blocks of rows
// (select_step) before the first slice: a layer-0 policy's (CacheBlend: layer 0 over every row,
// 1/n_layer of a full prefill, whose K/V stay in the cache for the rows left out, and the check
// layer's K/V projected) or a two-pass policy's reuse pass (ProphetKV, Policy::reads_reuse_pass:
// every layer over the non-chunk rows, every chunk row reused, the query's attention tapped). Each slice is the next active rows in ascending position,
// through every layer; the first slice's pass also places the reused rows of every layer from
// reused_from_layer() on (1 for a layer-0 policy, else 0), so later slices attend over them. A
// row computes what it computes in the whole prefill, over the same keys; only the grouping of
// rows into products differs. Every policy on the CPU without query attention (supports()); a
// device or query attention runs whole (selective_prefill).
class SlicedPrefill {
 public:
  static bool supports(const SelectiveOptions& opt);
  // The chunk sources and kv (at least n_total positions) must outlive this object; req and opt
  // are copied.
  SlicedPrefill(const Model& m, const ComposedRequest& req, const SelectiveOptions& opt,
                KVCache& kv);
  ~SlicedPrefill();
  SlicedPrefill(const SlicedPrefill&) = delete;
  SlicedPrefill& operator=(const SlicedPrefill&) = delete;
  // The selection pass, before any slice: its rows not run yet (0 for other policies, and once
  // it has run: the selection is then made and rows_left() counts the slices' rows). Its
  // blocks, like the slices, are the next rows in ascending position.
  int select_rows_left() const;
  // The next block within `work` as w counts it (a layer-0 pass row is 1/n_layer of a row; at
  // least one row, at most select_rows_left()), and what the next `rows` rows cost.
  int select_rows_within(const RowWork& w, double work) const;
  double select_work_of(const RowWork& w, int rows) const;
  // Runs the next min(rows, select_rows_left()) rows of the selection pass, a pass of their own
  // on ws. The reuse pass's first block reads every chunk row; a layer-0 policy reads each
  // chunk's stored check-layer rows after the last block, where it selects. A ChunkReadError
  // leaves no selection (the caller restarts the request on re-encoded chunks, as after a
  // slice's read failure).
  void select_step(int rows, Workspace& ws);
  // The slices' rows left (0 while the selection pass has rows left).
  int rows_left() const;
  bool done() const;
  // The next slice within `work` as w counts it (at least one row, at most rows_left()), and
  // what the next `rows` rows cost: the engine's step budget (EngineOptions::prefill_chunk).
  int rows_within(const RowWork& w, double work) const;
  double work_of(const RowWork& w, int rows) const;
  int reused_from_layer() const;
  // Appends the next slice of min(n, rows_left()) rows to a pass being assembled: its tokens,
  // positions and sequence (the request's cache, prefill rows). For the first slice, returns the
  // reused rows to give that sequence (LayerBackend::set_reused_for, from reused_from_layer());
  // else, or when there are none (a token-stage policy), null.
  // Nothing advances until slice_done(), so a failed pass can be assembled again.
  const ReusedRows* add_slice(int n, std::vector<int32_t>& tokens, std::vector<int32_t>& pos,
                              std::vector<BatchSeq>& seqs) const;
  // The pass ran: the slice's n rows are in the cache. last_logits: its last row's, F32
  // [n_vocab]; kept when this was the last slice (a token-stage policy's after_tokens then
  // sees the finished cache). t: the pass's times (shared with its other rows), added to the
  // breakdown.
  void slice_done(int n, const float* last_logits, const LayerTimes& t);
  // After the last slice: the last prompt position's logits, and the breakdown (total_ms from
  // construction to the last slice, compute_ms the passes it took part in).
  std::vector<float> take_logits();
  const PrefillBreakdown& breakdown() const;

 private:
  double select_share() const;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ct
