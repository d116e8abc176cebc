// Chunk encoding (paper Sec. 4.1 / App. B.1, offline stage): a chunk's tokens are prefilled alone,
// its pre-RoPE keys and values are kept per layer, the frequency ranking orders its tokens, and
// the record is laid out in ranking order (store/chunk.h). The id is a content hash.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/row_work.h"
#include "model/model.h"
#include "reuse/freq_rank.h"
#include "reuse/policy/probe.h"
#include "store/chunk.h"

namespace ct {

class DeviceSequence;

struct EncodeOptions {
  KvDtype dtype = KvDtype::F16;
  // Encode after a BOS/attention-sink token (not stored): the chunk's first token then does not
  // have to act as the attention sink, so its K/V look like any other position's when the chunk
  // is reused in the middle of a prompt. See docs/ARCHITECTURE.md for the measurement.
  bool sink = true;
  // The stored ranking, which the record's rows are laid out in and `--policy cachetune` takes
  // the top of. Default: the probe ranking (policy/probe.h), chosen by measurement over the
  // paper's low-frequency one (kLowFreq, still `--policy freq`); docs/RESULTS.md, "Offline
  // policies" has the evidence. kHead stores the head ranking.
  RankOptions rank{.mode = RankMode::kProbe};
  // The probe context, for kProbe and kProbeAttn (stored, or asked for by `also`).
  ProbeOptions probe;
  // Further rankings computed from the same isolated encoding (EncodeExtras::rankings), for
  // evaluating several offline policies on one record.
  std::vector<RankOptions> also;
  // Run the isolated prefill's layers on this device (backend.h; the same model, n_ctx at least
  // the chunk plus its sink) instead of the CPU, through the same layer contract and taps. The
  // device's cache is overwritten. The probe ranking's pass runs there too when the device also
  // holds the probe context (probe_rank), and so does the attention tap of attn and probe-attn;
  // the rankings themselves are computed on the host.
  DeviceSequence* device = nullptr;
};

// What encode_chunk measured, and the rankings of EncodeOptions::also in that order.
struct EncodeExtras {
  double forward_ms = 0;  // the isolated prefill (all layers)
  double rank_ms = 0;     // the stored ranking
  std::vector<ChunkRanking> rankings;
  std::vector<double> also_ms;  // per `also` ranking
};

// The rank_params string of a ranking: probe_params() for kProbe, attention_params() for kAttn,
// both joined by ':' for kProbeAttn, "" for the others.
std::string rank_params(const RankOptions& r, const ProbeOptions& p);

const char* rank_mode_name(RankMode m);

// Content hash of (model fingerprint, token ids, dtype, sink, rank mode, alpha, and the
// rank_params of the non-spectral modes): the same text encoded the same way by the same model gets
// the same id in any request. Ids of the spectral modes are the same as before the probe existed.
std::string chunk_id(const std::string& model_fingerprint, const std::vector<int32_t>& tokens,
                     const EncodeOptions& opt);

// Prefills `tokens` alone and returns the record. Throws ct::Error for an empty chunk or one
// longer than the model context.
ChunkKV encode_chunk(const Model& m, const std::vector<int32_t>& tokens, const EncodeOptions& opt,
                     EncodeExtras* extras = nullptr);

// encode_chunk in steps, for an encoding that shares engine steps with running requests. Its
// work is the isolated pass's rows (the chunk and its sink; TappedPass) and then, when the stored
// ranking uses the probe, the probe pass's rows (ProbePass), counted by RowWork (row_work.h) in
// rows of a whole-model pass: a probe row is probe layers / n_layer of one, and with
// RowWork::keys_per_row a row's attention over the keys before it counts too. step(w) does up to
// w of it; finish() ranks and packs once none is left (`also` rankings, with extras, are
// computed there, as encode_chunk does). The slices' boundaries are the encoding's own: the same
// w at every step gives the same record whoever steps it. On the CPU a record encoded in slices
// equals the whole encoding up to the rounding of the row blocks' products (so a near-tie of a
// ranking may order differently); with EncodeOptions::device each pass runs whole.
// encode_chunk is step(work_left()) and finish(), bit for bit the encoding in one piece.
// The model outlives the encoding.
class ChunkEncoding {
 public:
  // Throws what encode_chunk throws for these tokens and options.
  ChunkEncoding(const Model& m, std::vector<int32_t> tokens, const EncodeOptions& opt,
                RowWork work = {});
  ~ChunkEncoding();
  ChunkEncoding(const ChunkEncoding&) = delete;
  ChunkEncoding& operator=(const ChunkEncoding&) = delete;
  int rows() const { return (int)toks_.size(); }  // of the isolated pass: the chunk and its sink
  double work_left() const;  // 0 exactly once every row of both passes is done
  // Runs the next rows whose work fits in `work` (> 0), and at least one row (with a device:
  // all of them, each pass whole); returns the work they took (it may exceed `work` by the one
  // row). rows_done() counts the rows of both passes run so far (a probe row as one).
  double step(double work);
  // The work step(work) would take, without running it (the same rows).
  double block_work(double work) const { return plan(work).work; }
  int rows_done() const { return rows_done_; }
  // The record, once work_left() is 0. Once. In extras, forward_ms is the isolated pass with its
  // set-up, and the probe pass's time (its set-up included) belongs to the first ranking using it.
  ChunkKV finish(EncodeExtras* extras = nullptr);

 private:
  // The rows step(work) runs of each pass, and their work.
  struct Block {
    int pass_rows = 0, probe_rows = 0;
    double work = 0;
  };
  Block plan(double work) const;
  double probe_share() const;  // a probe row's part of a whole-model row: probe layers / n_layer
  std::vector<const float*> layer_rows(const std::vector<float>& all) const;
  const Model& m_;
  std::vector<int32_t> tokens_, toks_;  // the chunk, and with its sink
  EncodeOptions opt_;
  RowWork work_;
  int off_ = 0;                          // 1 with the sink
  bool probes_ = false;                  // the stored ranking uses the probe pass
  int probe_first_ = 0;                  // the probe pass's first row position (its context)
  int rows_done_ = 0;
  std::vector<float> k_all_, v_all_;     // F32 [n_layer][rows][kv_dim] taps
  std::vector<float> probs_;             // the attention tap (the attn rankings)
  std::unique_ptr<TappedPass> pass_;    // until its last row is done
  std::unique_ptr<ProbePass> probe_;     // made once the isolated pass is done
  double forward_ms_ = 0;
  double probe_ms_ = 0;  // the probe pass's steps, charged to the first ranking using it
  bool finished_ = false;
};

// Whether encode_chunk taps the isolated prefill's attention: for the attn and probe-attn
// rankings, stored or in `also`.
bool encode_taps_attention(const EncodeOptions& opt);

// Parses "lowfreq" | "highfreq" | "l2" | "head" | "probe" | "attn" | "probe-attn"; ct::Error
// naming the valid ones.
RankMode parse_rank_mode(const std::string& s);

// Unpacked K (pre-RoPE) and V of a record in text order: F32 [n_layer][n_tok][kv_dim] each.
struct ChunkKVF32 {
  std::vector<float> k, v;
  const float* k_layer(int l, int n_tok, int kv_dim) const {
    return k.data() + (size_t)l * n_tok * kv_dim;
  }
  const float* v_layer(int l, int n_tok, int kv_dim) const {
    return v.data() + (size_t)l * n_tok * kv_dim;
  }
};
ChunkKVF32 unpack_text_order(const ChunkKV& c);

// Ranks a stored chunk with other options (for the l2/highfreq baselines and alpha sweeps).
ChunkRanking rank_stored_chunk(const ChunkKV& c, const RankOptions& opt);

}  // namespace ct
