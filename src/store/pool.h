// CachePool: an ordered stack of tiers (top first, e.g. device, host, disk, redis) with one LRU
// list per tier, capacity enforcement that demotes the least recently used chunk to the next
// lower tier (dropping only from the last), optional promotion to the top tier on a hit, an index
// id -> tier, per-chunk hit counts per tier, stats and whole-pool verification.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/tier.h"

namespace ct::store {

struct PoolOptions {
  // lookup() moves a chunk found below the top tier to the top (or, if it can never fit there,
  // to the highest tier above its own that can hold it).
  bool promote_on_hit = true;
};

struct ChunkStat {
  std::string id;
  int tier = -1;  // index into the pool's tiers
  std::string tier_name;
  size_t bytes = 0;  // footprint in its current tier
  uint64_t hits = 0;
  std::vector<uint64_t> hits_by_tier;  // [n_tiers] hits served while the chunk sat in each tier
  int32_t n_tok = 0;
};

struct TierStat {
  std::string name;
  size_t capacity_bytes = 0;
  size_t used_bytes = 0;
  size_t n_chunks = 0;
  uint64_t hits = 0;
  uint64_t demotions_in = 0;    // chunks moved here from the tier above
  uint64_t promotions_out = 0;  // chunks promoted from here to a higher tier
  uint64_t bytes_read = 0;      // K and V bytes read_rows() copied out of this tier
  uint64_t discovered = 0;      // chunks found by Tier::discover (written by another process)
  uint64_t io_errors = 0;       // Tier::io_errors() when stat() ran
};

struct PoolStat {
  std::vector<TierStat> tiers;
  std::vector<ChunkStat> chunks;  // sorted by tier, then most recently used first
  uint64_t misses = 0;            // lookups of absent chunks and failed reads
  uint64_t dropped = 0;           // chunks lost: evicted from the last tier, corrupt, unreadable
};

struct VerifyReport {
  size_t n_checked = 0;
  std::vector<std::string> bad;  // ids that failed and were dropped
  // Damaged records the tiers' start-up scans removed or ignored ("<where>: <reason>").
  std::vector<std::string> scan_rejects;
};

class CachePool {
 public:
  // Takes ownership of the tiers and indexes what they already hold (a disk directory or a Redis
  // server surviving a restart). A chunk found in several tiers is kept in the highest one and
  // erased from the others; then every tier's capacity is enforced (demoting as usual).
  explicit CachePool(std::vector<std::unique_ptr<Tier>> tiers, PoolOptions opt = {});

  // Stores kv in the top tier (making room by demotion), or in the first tier below whose
  // capacity can hold it at all. A record already present under the id is replaced (its hit
  // counts are kept). False when no tier can take it. Throws ct::Error for a malformed record.
  bool put(const ChunkKV& kv);
  // The same, starting at tier `first_tier` instead of the top (e.g. `ingest --tier disk`). When
  // no tier takes it and `why` is given, *why says per tier why not ("disk: cannot create ...:
  // No space left on device; redis: server unreachable").
  bool put(const ChunkKV& kv, int first_tier, std::string* why = nullptr);

  // A request for a chunk: on a hit counts it for the chunk's tier, marks it most recently used,
  // promotes it to the top tier when configured, and returns its meta. nullopt on a miss. An id
  // the index lacks is first asked of each tier's discover() (a Redis another server writes
  // to), top first; a find is indexed there and counts as a hit.
  std::optional<ChunkMeta> lookup(const std::string& id);

  // Rows [row_begin, row_end) of one layer from whichever tier holds the chunk (Tier::read_rows).
  // Does not count a hit or touch the LRU order (lookup() does, once per request). On failure
  // the chunk is removed from the index unless its tier still holds it (a transient error such
  // as Redis being unreachable), and false is returned so the caller re-encodes.
  bool read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                 void* v_dst);

  // A chunk held open where it is now (Tier::pin), so that the rows a request reads later come
  // from that record even if the pool evicts or moves the chunk meanwhile (another request's
  // admission filling the tier between this one's lookup and its first prefill slice). Empty
  // (record null) on a miss and for tiers that cannot pin (Redis): read_rows by id then.
  struct Pin {
    std::shared_ptr<PinnedRecord> record;
    int tier = -1;
    size_t row_bytes = 0;
  };
  Pin pin(const std::string& id);
  // read_rows through a pin (counted as that tier's bytes). On failure (the record turned out
  // damaged; its tier logged and dropped it) the chunk leaves the index unless its tier still
  // holds it, and false is returned so the caller re-encodes.
  bool read_pinned(const Pin& pin, const std::string& id, int layer, int row_begin, int row_end,
                   void* k_dst, void* v_dst);

  // The whole record from its tier (no hit counted); nullopt on a miss.
  std::optional<ChunkKV> get(const std::string& id);

  bool contains(const std::string& id) const;
  int tier_of(const std::string& id) const;  // -1 when absent
  // Drops the chunk from the pool entirely; false when absent.
  bool evict(const std::string& id);
  // Tier::verify on every chunk; failing ones are dropped and listed.
  VerifyReport verify_all();
  PoolStat stat() const;
  // Per tier, the cheap counters only (no per-chunk list): for metrics scraped often.
  std::vector<TierStat> tier_stats() const;

  size_t n_tiers() const { return tiers_.size(); }
  Tier& tier(size_t i) { return *tiers_.at(i); }

 private:
  struct Entry {
    int tier = -1;
    size_t bytes = 0;
    int32_t n_tok = 0;
    size_t row_bytes = 0;  // one ranked row of K plus V, in the record's dtype
    std::vector<uint64_t> hits_by_tier;
    std::list<std::string>::iterator lru_pos;  // in lru_[tier]; front = most recently used
  };

  // All below run with mu_ held. `keep` is a chunk that must not be chosen as a victim (the one
  // being placed or promoted), passed down the whole demotion cascade.
  bool fits(int t, size_t bytes) const;
  // Demotes least recently used chunks of tier t until `bytes` more fit (or none is left).
  void make_room(int t, size_t bytes, const std::string& keep);
  // Moves chunk id from its tier to the next lower tier that takes it, or drops it.
  void demote(const std::string& id, const std::string& keep);
  // Stores rec in the first of tiers [t_begin, t_end) that can take it, making room there by
  // demotion; returns that tier or -1.
  // With `why`, appends one "<tier>: <reason>" per tier that did not take it.
  int place(const ChunkKV& rec, int t_begin, int t_end, const std::string& keep,
            std::vector<std::string>* why = nullptr);
  Entry& link(const std::string& id, int t, size_t bytes, const ChunkMeta& meta);
  void forget(const std::string& id);
  // With mu_ held, after a read of chunk id from tier t failed for good: counts the miss, and
  // forgets the chunk if the index still places it in t and t no longer holds it (a damaged
  // record the tier dropped).
  void read_failed(const std::string& id, int t);

  std::vector<std::unique_ptr<Tier>> tiers_;
  PoolOptions opt_;
  // Held for index changes and for every data movement between tiers; plain reads take it only
  // to find the tier.
  mutable std::mutex mu_;
  std::map<std::string, Entry> index_;
  std::vector<std::list<std::string>> lru_;
  std::vector<TierStat> tier_stat_;
  uint64_t misses_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace ct::store
