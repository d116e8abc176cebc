// Encoding cache and record re-ranking.
#include "eval/chunk_cache.h"

#include <cstring>

#include "core/timer.h"
#include "reuse/policy.h"

namespace ct {

std::string ranking_name(const RankOptions& r) {
  switch (r.mode) {
    case RankMode::kLowFreq:
    case RankMode::kHighFreq:
    case RankMode::kL2:
      return std::string(rank_mode_name(r.mode)) + "/" + std::to_string(r.alpha);
    default:
      return rank_mode_name(r.mode);
  }
}

std::shared_ptr<const ChunkKV> ChunkCache::get(const std::vector<int32_t>& tokens) {
  const std::string id = chunk_id(m_.fingerprint(), tokens, opt_);
  if (auto it = map_.find(id); it != map_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    return it->second.rec;
  }
  ++misses_;
  Timer t;
  EncodeExtras ex;
  auto rec = std::make_shared<const ChunkKV>(encode_chunk(m_, tokens, opt_, &ex));
  encode_ms_ += t.ms();
  forward_ms_ += ex.forward_ms;
  rank_ms_ += ex.rank_ms;
  for (size_t i = 0; i < opt_.also.size(); ++i) {
    also_ms_ += ex.also_ms[i];
    also_by_name_[ranking_name(opt_.also[i])] += ex.also_ms[i];
    remember_ranking(rec->meta.id, ranking_name(opt_.also[i]), ex.rankings[i]);
  }
  const size_t b = rec->meta.kv_bytes();
  while (!lru_.empty() && bytes_ + b > max_bytes_) {
    auto it = map_.find(lru_.back());
    bytes_ -= it->second.rec->meta.kv_bytes();
    map_.erase(it);
    lru_.pop_back();
  }
  if (b <= max_bytes_) {
    lru_.push_front(id);
    map_[id] = Entry{rec, lru_.begin()};
    bytes_ += b;
  }
  return rec;
}

ChunkKV rerank_record(const ChunkKV& rec, const RankOptions& opt) {
  const ChunkMeta& m = rec.meta;
  ChunkRanking rank = rank_stored_chunk(rec, opt);
  // Row j of the new layout is token rank.order[j]; find where that token sits in the old one.
  std::vector<int32_t> old_row(m.n_tok);
  for (int j = 0; j < m.n_tok; ++j) old_row[m.order[j]] = j;
  ChunkKV out;
  out.meta = m;
  out.meta.order = rank.order;
  out.meta.scores = rank.scores;
  out.meta.rank_mode = rank_mode_name(opt.mode);
  out.meta.alpha = opt.alpha;
  out.meta.rank_params = rank_params(opt, ProbeOptions());
  EncodeOptions eo;
  eo.dtype = m.dtype;
  eo.sink = m.sink;
  eo.rank = opt;
  out.meta.id = chunk_id(m.model_fingerprint, m.tokens, eo);
  const size_t row_bytes = kv_bytes(m.dtype, m.kv_dim);
  out.k.resize(m.n_layer);
  out.v.resize(m.n_layer);
  for (int l = 0; l < m.n_layer; ++l) {
    out.k[l].resize(rec.k[l].size());
    out.v[l].resize(rec.v[l].size());
    for (int j = 0; j < m.n_tok; ++j) {
      const size_t src = (size_t)old_row[rank.order[j]] * row_bytes, dst = (size_t)j * row_bytes;
      std::memcpy(out.k[l].data() + dst, rec.k[l].data() + src, row_bytes);
      std::memcpy(out.v[l].data() + dst, rec.v[l].data() + src, row_bytes);
    }
  }
  return out;
}

}  // namespace ct
