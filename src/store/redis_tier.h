// Redis tier (hiredis): one value per chunk and layer plus one meta value, the complement fetched
// with GETRANGE. Works with a single server and with Redis Cluster: every key of a chunk carries
// the hash tag {id}, so all of them live in one slot and a chunk's operations go to one node;
// MOVED replies are followed by connecting to the named node (and remembered per slot), ASK
// replies by retrying there after ASKING (one ASKING before MULTI for a transaction).
//
// Keys (prefix defaults to "ct:"; <v> = first 16 hex digits of SHA-256 of the header bytes, so
// a layer key names one immutable version of the content):
//   <prefix>{<id>}:m         the record header of record_format.h (meta + row-group CRC32Cs)
//   <prefix>{<id>}:<v>:l<L>  layer L's interleaved K|V slab of version v
// put() first GETs the current header (to learn the version it replaces), then in one MULTI/EXEC
// (atomic on a server and, the keys sharing one slot, on a cluster) SETs the new layer values and
// header and DELs the replaced version's layer values. Rewriting identical content is idempotent.
// Two processes replacing one id with *different* content at the same moment can orphan one
// version's layer values (never a wrong read). During a slot migration reads follow ASK, but a
// chunk whose keys are split between the two nodes reads as a miss (never wrong bytes), and a
// put into the migrating slot fails (Redis answers TRYAGAIN to multi-key transactions there).
// The tier keeps an in-memory index (id -> header, version) filled by put() and, at start, by a
// SCAN of the first node (on a cluster that node's keys only). Reads widen the rows to whole
// 16-row groups, GETRANGE them from the indexed version's layer key and verify each group's
// CRC32C. A missing layer value makes the tier re-read the header: a newer version (replaced by
// another writer) is indexed and the read retried; no header means the record is gone (erased
// elsewhere, server restarted): dropped from the index. Errors never throw into the request path:
//  - unreachable server, I/O error or a reply slower than command_timeout_ms: logged, a miss;
//    the node is then skipped (instant miss) for retry_after_ms; the entry stays indexed since
//    the data may still be there. A pooled connection the server closed while idle (a restart
//    between requests) is retried once on a fresh connection first, so a restarted server is
//    used again at once. Connecting waits at most connect_timeout_ms.
//  - a missing or short value of the current version or a checksum mismatch: logged, dropped
//    (index; the version's layer values; the header if it still names this version, checked
//    atomically by a server-side script).
// Connections, slot routing, redirections and SIGPIPE handling are RedisClient's
// (redis_client.h); this file is the record layout, the index and the checks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "store/record_format.h"
#include "store/redis_client.h"
#include "store/tier.h"

namespace ct::store {

struct RedisTierOptions {
  std::string name = "redis";
  std::string host = "127.0.0.1";
  int port = 6379;
  size_t capacity_bytes = SIZE_MAX;
  std::string key_prefix = "ct:";  // must not contain '{' or '}'
  int connect_timeout_ms = 200;
  int command_timeout_ms = 1000;
  int retry_after_ms = 1000;  // a node that failed is not contacted again for this long
  int max_redirects = 5;
  bool scan_on_start = true;  // rebuild the index from the server's existing records
};

struct TierSpec;  // store/tier_registry.h
// The options a "redis[:HOST[:PORT]][:prefix=P][:timeout=MS]" spec stands for; throws ct::Error
// naming the text for a bad port or timeout.
RedisTierOptions redis_tier_options(const TierSpec& spec);


class RedisTier final : public Tier {
 public:
  // Never fails for an unreachable server (logged; the index starts empty). Throws ct::Error for
  // an invalid key prefix.
  explicit RedisTier(RedisTierOptions opt);
  ~RedisTier() override;

  const std::string& name() const override { return opt_.name; }
  size_t capacity_bytes() const override { return opt_.capacity_bytes; }
  size_t used_bytes() const override;
  // Header value plus all layer values.
  size_t footprint(const ChunkMeta& meta) const override;

  bool put(const ChunkKV& kv) override;
  bool contains(const std::string& id) const override;
  std::optional<ChunkMeta> get_meta(const std::string& id) const override;
  bool read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                 void* v_dst) override;
  std::optional<ChunkKV> get(const std::string& id) override;
  bool erase(const std::string& id) override;
  std::vector<std::string> list() const override;
  bool verify(const std::string& id) override;

  std::string meta_key(const std::string& id) const;
  // Key of layer `layer` of the indexed version of id ("" when id is not indexed).
  std::string layer_key(const std::string& id, int layer) const;
  uint64_t redirects_followed() const { return client_.redirects_followed(); }
  uint64_t failed_exchanges() const { return client_.failed_exchanges(); }

  // GET of the header key: a chunk another server stored after this tier's scan.
  std::optional<ChunkMeta> discover(const std::string& id) override;
  bool shared() const override { return true; }
  uint64_t io_errors() const override { return client_.failed_exchanges(); }

  std::vector<std::string> scan_rejects() const override { return scan_rejects_; }
  std::string last_put_error() const override;

 private:
  using Reply = RedisClient::Reply;
  using Command = RedisClient::Command;

  struct Entry {
    std::shared_ptr<const RecordHeader> header;
    std::string header_bytes;  // as stored in the meta value
    std::string version;       // 16 hex digits of SHA-256(header_bytes)
    uint64_t seq = 0;
    size_t bytes = 0;
  };
  std::string version_layer_key(const std::string& id, const std::string& version, int layer) const;
  // Copy of the index entry (header null when absent).
  Entry find(const std::string& id) const;
  // Indexes a header read from or written to the server; false when the bytes do not decode.
  bool index(std::string header_bytes);
  void drop(const std::string& id, uint64_t seq, const std::string& why);
  // After a layer value of the indexed version was found missing: re-reads the header. Returns
  // true when a different version is now indexed (retry the read); otherwise the entry was
  // dropped (or the server is unreachable) and the caller reports a miss.
  bool refresh_after_missing(const std::string& id, const Entry& seen, int layer);
  // Fetches and checks the whole record; out may be null (verify). Transient failures return
  // false without dropping.
  bool load_checked(const std::string& id, ChunkKV* out);
  void scan();
  std::vector<std::string> scan_rejects_;  // written by the constructor's scan only

  RedisTierOptions opt_;
  RedisClient client_;  // connections, cluster routing, MOVED/ASK

  mutable std::mutex mu_;  // index
  std::map<std::string, Entry> entries_;
  size_t used_bytes_ = 0;
  uint64_t next_seq_ = 1;

  // Records a failed put (last_put_error) and logs it at most once a minute.
  void put_failed(const std::string& id, const std::string& why);
  mutable std::mutex put_err_mu_;
  std::string last_put_error_;
};

}  // namespace ct::store
