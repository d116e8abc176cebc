// Chunk records for an evaluation run: an in-memory cache of isolated encodings keyed by chunk id
// (shared by every policy, setting and example that uses the chunk), and re-ranked copies of a
// record for the alpha sweep.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/model.h"
#include "reuse/encoder.h"
#include "store/chunk.h"

namespace ct {

// Least-recently-used cache of encoded chunks bounded by record bytes (K and V of all layers).
// A record larger than the whole budget is still returned, just not kept. Not thread-safe.
class ChunkCache {
 public:
  ChunkCache(const Model& m, EncodeOptions opt, size_t max_bytes)
      : m_(m), opt_(opt), max_bytes_(max_bytes) {}
  // The record for `tokens`, encoding it on a miss. The pointer stays valid until the next get()
  // that evicts it; callers hold the shared_ptr for as long as they use the record.
  std::shared_ptr<const ChunkKV> get(const std::vector<int32_t>& tokens);
  int hits() const { return hits_; }
  int misses() const { return misses_; }
  double encode_ms() const { return encode_ms_; }  // total time spent encoding misses
  // Parts of encode_ms: the isolated prefill, the stored ranking, the EncodeOptions::also ones
  // (whose rankings are left with remember_ranking under ranking_name()).
  double forward_ms() const { return forward_ms_; }
  double rank_ms() const { return rank_ms_; }
  double also_ms() const { return also_ms_; }
  // also_ms per ranking (by ranking_name).
  const std::map<std::string, double>& also_ms_by_name() const { return also_by_name_; }
  size_t bytes() const { return bytes_; }

 private:
  const Model& m_;
  EncodeOptions opt_;
  size_t max_bytes_;
  size_t bytes_ = 0;
  int hits_ = 0, misses_ = 0;
  double encode_ms_ = 0, forward_ms_ = 0, rank_ms_ = 0, also_ms_ = 0;
  std::map<std::string, double> also_by_name_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const ChunkKV> rec;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Entry> map_;
};

// The remember_ranking name of a ranking: its rank mode ("probe", "attn", ...), with "/<alpha>"
// for the spectral ones (the names stored_ranking, policy/probe.h, and policy/spectral.cc look up).
std::string ranking_name(const RankOptions& r);

// A copy of `rec` ranked with `opt` (rank_stored_chunk) and laid out in that ranking order, as
// encode_chunk with EncodeOptions::rank = opt would have stored it: same K/V values (no second
// rounding, rows are moved as stored bytes), new order, scores, rank mode, alpha and id.
ChunkKV rerank_record(const ChunkKV& rec, const RankOptions& opt);

}  // namespace ct
