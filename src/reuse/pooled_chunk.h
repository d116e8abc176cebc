// A chunk source backed by the cache pool: the online stage reads the complement rows straight
// from whichever tier holds the chunk (device/host memory, disk, Redis).
#pragma once

#include "reuse/chunk_source.h"
#include "store/pool.h"

namespace ct {

class PooledChunk : public ChunkSource {
 public:
  PooledChunk(store::CachePool& pool, ChunkMeta meta) : pool_(pool), meta_(std::move(meta)) {}
  const ChunkMeta& meta() const override { return meta_; }
  void read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) const override {
    if (!pool_.read_rows(meta_.id, layer, row_begin, row_end, k_dst, v_dst)) {
      throw ChunkReadError(meta_.id, fmt::format("chunk {} layer {} rows [{}, {}) could not be "
                                                 "read from the cache pool",
                                                 meta_.id.substr(0, 12), layer, row_begin,
                                                 row_end));
    }
  }

 private:
  store::CachePool& pool_;
  ChunkMeta meta_;
};

}  // namespace ct
