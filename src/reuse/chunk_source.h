// Where the online stage reads a reused chunk from: its metadata plus a row reader for rank rows
// of one layer. An in-memory record and a cache-pool entry (any tier) look the same to the
// selective prefill, which asks only for the rows it will load.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"
#include "store/chunk.h"

namespace ct {

// Thrown when a stored chunk cannot be read (missing, corrupt, tier unreachable). The caller
// re-encodes the chunk and retries; the message names the chunk, layer and source.
class ChunkReadError : public Error {
 public:
  ChunkReadError(const std::string& id, const std::string& what) : Error(what), id_(id) {}
  const std::string& chunk_id() const { return id_; }

 private:
  std::string id_;
};

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  virtual const ChunkMeta& meta() const = 0;
  // Copies rank rows [row_begin, row_end) of `layer` (bytes in meta().dtype, K and V separately,
  // [rows][kv_dim] each). Throws ChunkReadError on failure. Safe to call from a loader thread.
  virtual void read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) const = 0;
};

// A record held in memory (the CPU backend's device tier, and tests).
class InMemoryChunk : public ChunkSource {
 public:
  explicit InMemoryChunk(const ChunkKV& kv) : kv_(kv) {}
  const ChunkMeta& meta() const override { return kv_.meta; }
  void read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) const override;
  const ChunkKV& record() const { return kv_; }

 private:
  const ChunkKV& kv_;
};

// A record the source owns: a chunk encoded for one request that no cache tier took.
class OwnedChunk : public ChunkSource {
 public:
  explicit OwnedChunk(ChunkKV kv) : kv_(std::move(kv)), view_(kv_) {}
  OwnedChunk(const OwnedChunk&) = delete;  // view_ refers to this object's kv_
  OwnedChunk& operator=(const OwnedChunk&) = delete;
  const ChunkMeta& meta() const override { return kv_.meta; }
  void read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) const override {
    view_.read_rows(layer, row_begin, row_end, k_dst, v_dst);
  }

 private:
  ChunkKV kv_;
  InMemoryChunk view_;  // refers to kv_, declared after it
};

// Reads every layer of a source into a record (used for ranking with other options).
ChunkKV read_whole_chunk(const ChunkSource& src);

}  // namespace ct
