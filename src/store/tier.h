// The storage-tier interface shared by the device, host, disk and Redis tiers: whole-record put
// and get (for demotion and promotion) and row-range reads of one layer (for the complement).
// Implementations are thread-safe: any mix of concurrent calls leaves every entry intact.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "store/chunk.h"

namespace ct::store {

// One stored record held open for row reads (Tier::pin). Reads keep working after the record has
// been evicted, demoted or replaced in its tier (a memory tier keeps its entry alive, a disk tier
// the open file) until the handle is released, so a request that looked a chunk up can read it
// later whatever the pool did meanwhile. A handle must not outlive its tier.
class PinnedRecord {
 public:
  virtual ~PinnedRecord() = default;
  // As Tier::read_rows, for this record: false when it turned out damaged (logged, and dropped
  // from the tier if that still holds this version). Safe to call from several threads.
  virtual bool read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) = 0;
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual const std::string& name() const = 0;
  // The budget the pool enforces (the tier itself never evicts); used_bytes() counts
  // footprint() of every stored record.
  virtual size_t capacity_bytes() const = 0;
  virtual size_t used_bytes() const = 0;
  // Bytes a record with this meta occupies in this tier (payload plus headers and padding).
  virtual size_t footprint(const ChunkMeta& meta) const = 0;

  // Stores kv under kv.meta.id, replacing any previous record atomically: a concurrent reader
  // sees the old or the new record, never a mix. Throws ct::Error when kv is malformed
  // (check_chunk); returns false after logging when the medium fails (disk full, Redis down).
  virtual bool put(const ChunkKV& kv) = 0;

  virtual bool contains(const std::string& id) const = 0;
  virtual std::optional<ChunkMeta> get_meta(const std::string& id) const = 0;

  // Copies rows [row_begin, row_end) (ranking order) of layer `layer` into k_dst and v_dst,
  // (row_end - row_begin) * kv_dim elements each in meta.dtype. Returns false on a miss; when the
  // entry was corrupt, truncated or unreachable the tier has already logged it to stderr and
  // dropped it, so the caller can re-encode. Throws ct::Error for an out-of-range layer or rows
  // of a present entry (a caller bug).
  virtual bool read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                         void* v_dst) = 0;

  // The record held open for later row reads (PinnedRecord); nullptr on a miss, and for media
  // that cannot hold a record open (Redis, the default), which are then read by id.
  virtual std::shared_ptr<PinnedRecord> pin(const std::string& /*id*/) { return nullptr; }

  // The whole record, checksums verified where the tier keeps them on a medium; nullopt on a
  // miss (corrupt entries are logged and dropped as in read_rows).
  virtual std::optional<ChunkKV> get(const std::string& id) = 0;

  // Removes the record; false when it was not there.
  virtual bool erase(const std::string& id) = 0;

  // Ids of all stored records, least recently stored first (after a restart: oldest first).
  virtual std::vector<std::string> list() const = 0;

  // Re-checks every checksum of the record. A failing record is logged and dropped; returns true
  // only when the record is present and intact.
  virtual bool verify(const std::string& id) = 0;

  // What the start-up scan found damaged and removed or ignored, one line each ("<file or key>:
  // <reason>"), so `cache verify` can report it (the scan itself only logs).
  virtual std::vector<std::string> scan_rejects() const { return {}; }

  // A record of another process: the medium is asked for `id` directly (a Redis several
  // servers share, where another server stored a chunk after this tier built its index). On a
  // find the tier indexes it and returns its meta; nullopt when absent, unreachable, or for
  // media only this process writes (the default).
  virtual std::optional<ChunkMeta> discover(const std::string& /*id*/) { return std::nullopt; }
  // True for a medium other servers use too: the pool then never moves a record out of it
  // (promotion would take the chunk away from them).
  virtual bool shared() const { return false; }
  // Failed exchanges with the medium so far (Redis: unreachable, I/O errors, timeouts, failed
  // transactions); 0 for tiers that do not count them.
  virtual uint64_t io_errors() const { return 0; }

  // Why the most recent failed put failed ("<path>: <errno text>", "server unreachable", ...),
  // for the note a request served without the tier carries; "" when no put has failed.
  virtual std::string last_put_error() const { return ""; }
};

// Ids of an index whose entries carry a storing sequence number `seq`, oldest first (the order
// Tier::list promises). The caller holds the index's lock.
template <typename Index>
std::vector<std::string> ids_oldest_first(const Index& entries) {
  std::vector<std::pair<uint64_t, std::string>> by_seq;
  for (const auto& [id, e] : entries) by_seq.emplace_back(e.seq, id);
  std::sort(by_seq.begin(), by_seq.end());
  std::vector<std::string> ids;
  for (auto& [seq, id] : by_seq) ids.push_back(std::move(id));
  return ids;
}

}  // namespace ct::store
