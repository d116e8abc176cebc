// A chunk source backed by the cache pool: the online stage reads the complement rows straight
// from whichever tier holds the chunk (device/host memory, disk, Redis).
#pragma once

#include "reuse/chunk_source.h"
#include "store/pool.h"

namespace ct {

// The chunk is pinned where the pool holds it when the source is made (right after the lookup),
// so its rows stay readable until the source is destroyed even if the pool evicts or moves it
// meanwhile; tiers that cannot pin (Redis) are read by id.
class PooledChunk : public ChunkSource {
 public:
  PooledChunk(store::CachePool& pool, ChunkMeta meta)
      : pool_(pool), meta_(std::move(meta)), pin_(pool.pin(meta_.id)) {}
  const ChunkMeta& meta() const override { return meta_; }
  bool pinned() const { return pin_.record != nullptr; }
  void read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) const override {
    const bool ok = pinned()
                        ? pool_.read_pinned(pin_, meta_.id, layer, row_begin, row_end, k_dst, v_dst)
                        : pool_.read_rows(meta_.id, layer, row_begin, row_end, k_dst, v_dst);
    if (!ok) {
      throw ChunkReadError(meta_.id, fmt::format("chunk {} layer {} rows [{}, {}) could not be "
                                                 "read from the cache pool",
                                                 meta_.id.substr(0, 12), layer, row_begin,
                                                 row_end));
    }
  }

 private:
  store::CachePool& pool_;
  ChunkMeta meta_;
  store::CachePool::Pin pin_;
};

}  // namespace ct
