// In-memory tier, used for both `device` (on the CPU backend: the engine's working memory) and
// `host` (a separate host-memory pool): the record is kept as is, with a CRC32C per K and per V
// layer block computed at put() and re-checked by verify() (reads trust memory and do not check).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>

#include "store/tier.h"

namespace ct::store {

class MemoryTier final : public Tier {
 public:
  MemoryTier(std::string name, size_t capacity_bytes);

  const std::string& name() const override { return name_; }
  size_t capacity_bytes() const override { return capacity_bytes_; }
  size_t used_bytes() const override;
  // K and V payload plus the token, order and score arrays and the two id strings.
  size_t footprint(const ChunkMeta& meta) const override;

  bool put(const ChunkKV& kv) override;
  bool contains(const std::string& id) const override;
  std::optional<ChunkMeta> get_meta(const std::string& id) const override;
  bool read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                 void* v_dst) override;
  std::shared_ptr<PinnedRecord> pin(const std::string& id) override;
  std::optional<ChunkKV> get(const std::string& id) override;
  bool erase(const std::string& id) override;
  std::vector<std::string> list() const override;
  bool verify(const std::string& id) override;

  // Test hook: flips one bit of byte `offset` of layer `layer`'s K (or V) block in place, to
  // emulate memory corruption for verify(). Returns false when the entry is absent.
  bool flip_bit_for_test(const std::string& id, int layer, bool v_block, size_t offset);

 private:
  struct Entry {
    ChunkKV kv;
    std::vector<uint32_t> k_crc, v_crc;  // [n_layer] CRC32C of each whole block
    size_t bytes = 0;
    uint64_t seq = 0;  // insertion order, for list()
  };
  // Entries are immutable once published; readers copy the shared_ptr under the lock and read
  // outside it, so a concurrent put/erase never frees or changes what they read.
  std::shared_ptr<const Entry> find(const std::string& id) const;
  static void copy_rows(const Entry& e, int layer, int row_begin, int row_end, void* k_dst,
                        void* v_dst);
  class Pin;
  bool drop_if_same(const std::string& id, const Entry* e);

  const std::string name_;
  const size_t capacity_bytes_;
  mutable std::shared_mutex mu_;
  std::map<std::string, std::shared_ptr<const Entry>> entries_;
  size_t used_bytes_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace ct::store
