// The `probe` policy (offline, at chunk ingest): encode the chunk a second time, placed after a
// short unrelated probe context, and rank its tokens by how much their pre-RoPE K and V move
// against the isolated encoding. The tokens that move when *some* context precedes the chunk are
// the ones that move when the real context of a request precedes it (docs/RESULTS.md measures
// how often). Query-independent, so the ranking is stored with the record (rank mode "probe")
// and the complement stays one contiguous read per layer.
//
// Cost control: the probe context's K/V are computed once per (model, probe text, layers) and
// kept, so the second pass computes only the chunk's rows, and only through the first
// `layers` decoder layers (layer 0's pre-RoPE K and V do not depend on context; the drift of the
// early layers carries the positional signal). The ingest cost is reported by
// the eval records (encode_rank_ms, encode_also_ms; tools/quality_tables.py, docs/RESULTS.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "reuse/chunk_source.h"
#include "reuse/freq_rank.h"

namespace ct {

// The default probe context: a short, neutral paragraph unrelated to any data set.
extern const char* const kDefaultProbeText;

struct ProbeOptions {
  std::string text = kDefaultProbeText;  // tokenised without control tokens
  // Decoder layers run in the probe pass; 0 = the default, probe_layers() below.
  int layers = 0;
};

// Layers of the probe pass for an n_layer model: o.layers when set (clamped to [2, n_layer]),
// else max(2, ceil(n_layer / 5)).
int probe_layers(const ProbeOptions& o, int n_layer);

// A short description that identifies the ranking's settings: "probe2:layers=<N or auto>:text=
// <16 hex of SHA-256 of the text>" (with the model fingerprint in the id, "auto" is one number
// per model). Part of the chunk id and stored in the record (ChunkMeta::rank_params).
std::string probe_params(const ProbeOptions& o);

// Scores the chunk `tokens` (without the sink) from its isolated encoding: k_iso[l], v_iso[l]
// are F32 [n_tok][kv_dim] pre-RoPE K and V of layer l (at least probe_layers() layers). `sink`
// says whether the isolated encoding had a BOS before the chunk; the probe pass then starts with
// a BOS as well. score(t) = S * mean over layers 1..layers-1 of
// 0.5 * |dK_t| / mean_t |dK| + 0.5 * |dV_t| / mean_t |dV| (L2 norms over the kv_dim channels;
// a layer with no drift contributes 0), where S, the mean over the same layers of
// 0.5 * (mean_t |dK| + mean_t |dV|), puts the chunks of one model on one scale (the order within
// a chunk does not depend on it; "probe2": "probe1" records had S = 1). Deterministic; ties go to
// the lower index. The probe pass runs through the layer contract (backend.h): on `device` when
// given and its sequence holds the probe context plus the chunk (its cache is overwritten), else
// on the CPU; the probe context's own encoding is made once per model and probe text on the CPU
// and placed as already-rotated rows. A device's rounding differs from the CPU's, so its scores
// may order near-ties differently.
ChunkRanking probe_rank(const Model& m, const std::vector<int32_t>& tokens, bool sink,
                        const std::vector<const float*>& k_iso,
                        const std::vector<const float*>& v_iso, const ProbeOptions& o,
                        DeviceSequence* device = nullptr);

// Tokens of the probe context (with the sink when `sink`) that probe_rank places before a chunk.
int probe_context_length(const Model& m, const ProbeOptions& o, bool sink);

// probe_rank in row slices (a chunk encoding that shares engine steps with running requests):
// step(r) runs the chunk's next r rows, after the probe context and the rows before them, through
// the probe's layers, keeping each token's drift norms; ranking() scores them once no row is left
// (the same sums as probe_rank, which is one step of every row). On the CPU the norms are the
// whole pass's up to the rounding of the slices' products; on a device the pass runs whole.
// k_iso and v_iso stay valid while the pass lives.
class ProbePass {
 public:
  ProbePass(const Model& m, const std::vector<int32_t>& tokens, bool sink,
            const std::vector<const float*>& k_iso, const std::vector<const float*>& v_iso,
            const ProbeOptions& o, DeviceSequence* device = nullptr);
  ~ProbePass();
  ProbePass(const ProbePass&) = delete;
  ProbePass& operator=(const ProbePass&) = delete;
  int rows_left() const { return (int)tokens_.size() - done_; }
  void step(int rows);                    // 1 .. rows_left() (on a device: every row)
  ChunkRanking ranking() const;

 private:
  std::vector<int32_t> tokens_, pos_;
  std::vector<const float*> k_iso_, v_iso_;
  int kv_dim_ = 0, layers_ = 0, done_ = 0;
  bool whole_ = false;  // on a device
  ReusedRows ctx_;      // the probe context, placed with the first slice
  KVCache kv_;
  Workspace ws_;
  std::unique_ptr<LayerBackend> be_;
  std::vector<std::vector<double>> dk_, dv_;  // [layers][n_tok] drift norms (layer 0 unused)
};

// --- attention-weighted rankings (rank modes "attn" and "probe-attn") -----------------------
// A drifted token matters as much as later rows attend to it: a stale K/V row moves a later
// query's output in proportion to the attention that query gives it. Which tokens a request's
// question will attend to is not known at ingest, but the attention the chunk's own last rows
// give each token in its isolated encoding is, with no extra pass: those rows stand in for the
// rows that follow the chunk in a request.

// The chunk's last rows whose attention the isolated encoding taps: rows from
// attention_first_row(n) = max(0, n - kAttentionRows) on. kAttentionPrior: the shrinkage prior of
// attention_received, in rows.
constexpr int kAttentionRows = 64;
constexpr int kAttentionPrior = 16;
int attention_first_row(int n);

// Version tag of the attention weighting with its constants ("attn2:last=64:prior=16"), part of
// rank_params (and so of chunk ids).
std::string attention_params();

// Per token j < n of a chunk: `sums[j]` is the attention it received in its isolated encoding
// from the chunk rows attention_first_row(n) .. n-1 that see it (n - max(j, first) of them),
// averaged over heads and summed over rows and n_layer layers (tapped_prefill's probs). Returns
// a_j / a, a_j = (sums[j] / n_layer + P * a) / (n - max(j, first) + P), P = kAttentionPrior: the
// mean attention per layer and tapped row, shrunk toward the chunk's mean a = sum(sums) / n_layer /
// sum_j (n - max(j, first)) by a prior worth kAttentionPrior = 16 rows, so that the last tokens,
// which few rows see, are not ranked by their own self-attention. Mean about 1; finite; zero sums
// give all ones.
std::vector<float> attention_received(const float* sums, int n, int n_layer);

// Tokens by attention received (scores = attention_received's weights), ties to the lower index.
ChunkRanking attention_rank(const std::vector<float>& weight);
// The probe drift times the attention weight per token (scores on the probe's scale).
ChunkRanking probe_attention_rank(const ChunkRanking& probe, const std::vector<float>& weight);

// The ranking `mode` of chunk c: its stored one when it was ingested with that rank mode, else
// one left by remember_ranking(id, rank_mode_name(mode), ...); ct::Error saying how to ingest
// otherwise.
ChunkRanking stored_ranking(const ChunkSource& c, RankMode mode);

}  // namespace ct
