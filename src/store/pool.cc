// CachePool: index, LRU lists, demotion cascade, promotion and statistics over the tiers.
#include "store/pool.h"

#include "core/error.h"
#include "store/record_format.h"

namespace ct::store {

CachePool::CachePool(std::vector<std::unique_ptr<Tier>> tiers, PoolOptions opt)
    : tiers_(std::move(tiers)), opt_(opt) {
  CT_THROW_IF_NOT(!tiers_.empty(), "a cache pool needs at least one tier");
  lru_.resize(tiers_.size());
  tier_stat_.resize(tiers_.size());
  std::lock_guard lock(mu_);
  for (int t = 0; t < (int)tiers_.size(); ++t) {
    CT_THROW_IF_NOT(tiers_[t] != nullptr, "cache pool tier {} is null", t);
    tier_stat_[t].name = tiers_[t]->name();
    for (const std::string& id : tiers_[t]->list()) {  // oldest first: the newest ends up in front
      if (index_.count(id)) {
        store_log(fmt::format("pool: chunk {} is in tiers {} and {}; keeping the higher copy", id,
                              tiers_[index_[id].tier]->name(), tiers_[t]->name()));
        tiers_[t]->erase(id);
        continue;
      }
      std::optional<ChunkMeta> meta = tiers_[t]->get_meta(id);
      if (meta) link(id, t, tiers_[t]->footprint(*meta), *meta);
    }
  }
  for (int t = 0; t < (int)tiers_.size(); ++t) make_room(t, 0, "");
}

bool CachePool::fits(int t, size_t bytes) const {
  const size_t used = tiers_[t]->used_bytes(), cap = tiers_[t]->capacity_bytes();
  return used <= cap && bytes <= cap - used;
}

CachePool::Entry& CachePool::link(const std::string& id, int t, size_t bytes,
                                  const ChunkMeta& meta) {
  Entry& e = index_[id];
  e.tier = t;
  e.bytes = bytes;
  e.n_tok = meta.n_tok;
  e.row_bytes = 2 * kv_bytes(meta.dtype, meta.kv_dim);
  e.hits_by_tier.resize(tiers_.size(), 0);
  lru_[t].push_front(id);
  e.lru_pos = lru_[t].begin();
  return e;
}

void CachePool::forget(const std::string& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  lru_[it->second.tier].erase(it->second.lru_pos);
  index_.erase(it);
}

void CachePool::make_room(int t, size_t bytes, const std::string& keep) {
  while (!fits(t, bytes)) {
    const std::list<std::string>& lru = lru_[t];
    auto victim = lru.rbegin();
    while (victim != lru.rend() && *victim == keep) ++victim;
    if (victim == lru.rend()) return;
    demote(std::string(*victim), keep);
  }
}

int CachePool::place(const ChunkKV& rec, int t_begin, int t_end, const std::string& keep,
                     std::vector<std::string>* why) {
  for (int t = t_begin; t < t_end; ++t) {
    const size_t bytes = tiers_[t]->footprint(rec.meta);
    const std::string& name = tiers_[t]->name();
    if (bytes > tiers_[t]->capacity_bytes()) {
      if (why)
        why->push_back(fmt::format("{}: {} bytes exceed its capacity of {}", name, bytes,
                                   tiers_[t]->capacity_bytes()));
      continue;
    }
    make_room(t, bytes, keep);
    if (!fits(t, bytes)) {
      if (why) why->push_back(fmt::format("{}: full", name));
      continue;
    }
    if (tiers_[t]->put(rec)) return t;
    if (why) {
      const std::string err = tiers_[t]->last_put_error();
      why->push_back(fmt::format("{}: {}", name, err.empty() ? "the write failed" : err));
    }
  }
  return -1;
}

void CachePool::demote(const std::string& id, const std::string& keep) {
  const int t = index_.at(id).tier;
  const int n = (int)tiers_.size();
  std::optional<ChunkKV> rec;
  if (t + 1 < n) rec = tiers_[t]->get(id);
  const int dst = rec ? place(*rec, t + 1, n, keep) : -1;
  tiers_[t]->erase(id);
  if (dst < 0) {
    forget(id);
    ++dropped_;
    return;
  }
  Entry old = index_.at(id);
  forget(id);
  Entry& e = link(id, dst, tiers_[dst]->footprint(rec->meta), rec->meta);
  e.hits_by_tier = std::move(old.hits_by_tier);
  ++tier_stat_[dst].demotions_in;
}

bool CachePool::put(const ChunkKV& kv) { return put(kv, 0); }

bool CachePool::put(const ChunkKV& kv, int first_tier, std::string* why) {
  CT_THROW_IF_NOT(first_tier >= 0 && first_tier < (int)tiers_.size(),
                  "tier index {} outside the pool's {} tiers", first_tier, tiers_.size());
  check_chunk(kv);
  const std::string& id = kv.meta.id;
  std::lock_guard lock(mu_);
  std::vector<uint64_t> hits;
  if (auto it = index_.find(id); it != index_.end()) {
    hits = std::move(it->second.hits_by_tier);
    tiers_[it->second.tier]->erase(id);
    forget(id);
  }
  std::vector<std::string> reasons;
  const int t = place(kv, first_tier, (int)tiers_.size(), id, &reasons);
  if (t < 0) {
    std::string text;
    for (const std::string& r : reasons) text += (text.empty() ? "" : "; ") + r;
    if (why) {
      *why = text;  // the caller reports it
    } else {
      const std::string msg = fmt::format("pool: chunk {} ({} KV bytes) fits in no tier ({})", id,
                                          kv.meta.kv_bytes(), text);
      store_log_limited("pool unplaced", msg);
    }
    return false;
  }
  Entry& e = link(id, t, tiers_[t]->footprint(kv.meta), kv.meta);
  if (!hits.empty()) e.hits_by_tier = std::move(hits);
  return true;
}

std::optional<ChunkMeta> CachePool::lookup(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) {
    // A tier other processes write to (a shared Redis) may hold what this index has not seen.
    for (int t = 0; t < (int)tiers_.size() && it == index_.end(); ++t) {
      if (std::optional<ChunkMeta> meta = tiers_[t]->discover(id)) {
        link(id, t, tiers_[t]->footprint(*meta), *meta);
        ++tier_stat_[t].discovered;
        it = index_.find(id);
      }
    }
  }
  if (it == index_.end()) {
    ++misses_;
    return std::nullopt;
  }
  const int t = it->second.tier;
  std::optional<ChunkMeta> meta = tiers_[t]->get_meta(id);
  if (!meta) {  // the tier dropped it (corruption found by a read) since we indexed it
    forget(id);
    ++misses_;
    ++dropped_;
    return std::nullopt;
  }
  ++it->second.hits_by_tier[t];
  ++tier_stat_[t].hits;
  lru_[t].splice(lru_[t].begin(), lru_[t], it->second.lru_pos);
  // A tier other servers share keeps its records: promotion would move the chunk out of it.
  if (!opt_.promote_on_hit || t == 0 || tiers_[t]->shared()) return meta;

  std::optional<ChunkKV> rec = tiers_[t]->get(id);
  if (!rec) {
    if (tiers_[t]->contains(id)) return meta;  // transient failure: leave it where it is
    forget(id);
    ++misses_;
    ++dropped_;
    return std::nullopt;
  }
  // Take it out of its tier first, so that the demotions making room above can use its space.
  Entry old = index_.at(id);
  forget(id);
  tiers_[t]->erase(id);
  int dst = place(*rec, 0, t, id);
  const bool promoted = dst >= 0;
  if (!promoted) dst = place(*rec, t, (int)tiers_.size(), id);  // back where it was, or below
  if (dst < 0) {
    store_log(fmt::format("pool: chunk {} could not be stored again after a failed promotion", id));
    ++misses_;
    ++dropped_;
    return std::nullopt;
  }
  Entry& e = link(id, dst, tiers_[dst]->footprint(*meta), *meta);
  e.hits_by_tier = std::move(old.hits_by_tier);
  if (promoted) ++tier_stat_[t].promotions_out;
  return meta;
}

bool CachePool::read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                          void* v_dst) {
  // A concurrent demotion or promotion can move the chunk between finding its tier and reading;
  // the read then misses in the old tier and is retried where the index now points.
  for (int attempt = 0; attempt < 4; ++attempt) {
    int t;
    {
      std::lock_guard lock(mu_);
      auto it = index_.find(id);
      if (it == index_.end()) {
        ++misses_;
        return false;
      }
      t = it->second.tier;
    }
    if (tiers_[t]->read_rows(id, layer, row_begin, row_end, k_dst, v_dst)) {
      std::lock_guard lock(mu_);
      auto it = index_.find(id);
      if (it != index_.end())
        tier_stat_[t].bytes_read += (uint64_t)(row_end - row_begin) * it->second.row_bytes;
      return true;
    }
    std::lock_guard lock(mu_);
    auto it = index_.find(id);
    if (it != index_.end() && it->second.tier != t) continue;  // moved: read where it is now
    read_failed(id, t);
    return false;
  }
  std::lock_guard lock(mu_);
  ++misses_;
  return false;
}

CachePool::Pin CachePool::pin(const std::string& id) {
  // As read_rows: a concurrent move can leave the chunk's old tier without it; ask where the
  // index points now.
  for (int attempt = 0; attempt < 4; ++attempt) {
    Pin p;
    {
      std::lock_guard lock(mu_);
      auto it = index_.find(id);
      if (it == index_.end()) return {};
      p.tier = it->second.tier;
      p.row_bytes = it->second.row_bytes;
    }
    p.record = tiers_[p.tier]->pin(id);
    if (p.record) return p;
    std::lock_guard lock(mu_);
    auto it = index_.find(id);
    if (it == index_.end() || it->second.tier == p.tier) return {};
  }
  return {};
}

bool CachePool::read_pinned(const Pin& pin, const std::string& id, int layer, int row_begin,
                            int row_end, void* k_dst, void* v_dst) {
  CT_ASSERT(pin.record != nullptr && pin.tier >= 0 && pin.tier < (int)tiers_.size(),
            "read_pinned without a pinned record");
  const bool ok = pin.record->read_rows(layer, row_begin, row_end, k_dst, v_dst);
  std::lock_guard lock(mu_);
  if (ok) {
    tier_stat_[pin.tier].bytes_read += (uint64_t)(row_end - row_begin) * pin.row_bytes;
    return true;
  }
  read_failed(id, pin.tier);
  return false;
}

void CachePool::read_failed(const std::string& id, int t) {
  ++misses_;
  auto it = index_.find(id);
  if (it != index_.end() && it->second.tier == t && !tiers_[t]->contains(id)) {
    forget(id);
    ++dropped_;
  }
}

std::optional<ChunkKV> CachePool::get(const std::string& id) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    int t;
    {
      std::lock_guard lock(mu_);
      auto it = index_.find(id);
      if (it == index_.end()) {
        ++misses_;
        return std::nullopt;
      }
      t = it->second.tier;
    }
    if (std::optional<ChunkKV> rec = tiers_[t]->get(id)) return rec;
    std::lock_guard lock(mu_);
    auto it = index_.find(id);
    if (it != index_.end() && it->second.tier != t) continue;  // moved: read where it is now
    read_failed(id, t);
    return std::nullopt;
  }
  std::lock_guard lock(mu_);
  ++misses_;
  return std::nullopt;
}

bool CachePool::contains(const std::string& id) const {
  std::lock_guard lock(mu_);
  return index_.count(id) != 0;
}

int CachePool::tier_of(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second.tier;
}

bool CachePool::evict(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  tiers_[it->second.tier]->erase(id);
  forget(id);
  return true;
}

VerifyReport CachePool::verify_all() {
  std::vector<std::pair<std::string, int>> chunks;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, e] : index_) chunks.emplace_back(id, e.tier);
  }
  VerifyReport report;
  for (const auto& t : tiers_)
    for (std::string& r : t->scan_rejects()) report.scan_rejects.push_back(std::move(r));
  for (const auto& [id, t] : chunks) {
    ++report.n_checked;
    if (tiers_[t]->verify(id)) continue;
    std::lock_guard lock(mu_);
    auto it = index_.find(id);
    if (it != index_.end() && it->second.tier != t) {  // moved meanwhile: check the new copy
      --report.n_checked;
      continue;
    }
    report.bad.push_back(id);
    if (it != index_.end() && !tiers_[t]->contains(id)) {
      forget(id);
      ++dropped_;
    }
  }
  return report;
}

std::vector<TierStat> CachePool::tier_stats() const {
  std::lock_guard lock(mu_);
  std::vector<TierStat> out = tier_stat_;
  for (int t = 0; t < (int)tiers_.size(); ++t) {
    out[t].capacity_bytes = tiers_[t]->capacity_bytes();
    out[t].used_bytes = tiers_[t]->used_bytes();
    out[t].n_chunks = lru_[t].size();
    out[t].io_errors = tiers_[t]->io_errors();
  }
  return out;
}

PoolStat CachePool::stat() const {
  PoolStat s;
  s.tiers = tier_stats();
  std::lock_guard lock(mu_);
  s.misses = misses_;
  s.dropped = dropped_;
  for (int t = 0; t < (int)tiers_.size(); ++t) {
    for (const std::string& id : lru_[t]) {
      const Entry& e = index_.at(id);
      ChunkStat c;
      c.id = id;
      c.tier = t;
      c.tier_name = tiers_[t]->name();
      c.bytes = e.bytes;
      c.hits_by_tier = e.hits_by_tier;
      for (uint64_t h : e.hits_by_tier) c.hits += h;
      c.n_tok = e.n_tok;
      s.chunks.push_back(std::move(c));
    }
  }
  return s;
}

}  // namespace ct::store
