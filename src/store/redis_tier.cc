// RedisTier: the record layout in Redis keys, the index, GETRANGE row reads and checksum
// verification; connections, cluster routing and MOVED/ASK are RedisClient's (redis_client.h).
#include "store/redis_tier.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/sha256.h"
#include "store/tier_registry.h"

namespace ct::store {
namespace {
std::string escape_glob(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace


namespace {

RedisClientOptions client_options(const RedisTierOptions& o) {
  RedisClientOptions c;
  c.name = o.name;
  c.host = o.host;
  c.port = o.port;
  c.connect_timeout_ms = o.connect_timeout_ms;
  c.command_timeout_ms = o.command_timeout_ms;
  c.retry_after_ms = o.retry_after_ms;
  c.max_redirects = o.max_redirects;
  return c;
}

}  // namespace

RedisTier::RedisTier(RedisTierOptions opt) : opt_(std::move(opt)), client_(client_options(opt_)) {
  CT_THROW_IF_NOT(opt_.key_prefix.find_first_of("{}") == std::string::npos,
                  "redis tier '{}': key prefix '{}' must not contain '{{' or '}}' (the hash tag "
                  "is the chunk id)",
                  opt_.name, opt_.key_prefix);
  if (opt_.scan_on_start) scan();
}

RedisTier::~RedisTier() = default;

std::string RedisTier::meta_key(const std::string& id) const {
  return opt_.key_prefix + "{" + id + "}:m";
}
std::string RedisTier::version_layer_key(const std::string& id, const std::string& version,
                                         int layer) const {
  return fmt::format("{}{{{}}}:{}:l{}", opt_.key_prefix, id, version, layer);
}
std::string RedisTier::layer_key(const std::string& id, int layer) const {
  const Entry e = find(id);
  return e.header ? version_layer_key(id, e.version, layer) : "";
}

size_t RedisTier::used_bytes() const {
  std::lock_guard lock(mu_);
  return used_bytes_;
}

size_t RedisTier::footprint(const ChunkMeta& meta) const {
  return plan_record(meta, 1).total_bytes;
}

// ---------------------------------------------------------------------------------------------
// Index

RedisTier::Entry RedisTier::find(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? Entry{} : it->second;
}

bool RedisTier::index(std::string header_bytes) {
  std::string err;
  auto h = decode_header(reinterpret_cast<const uint8_t*>(header_bytes.data()), header_bytes.size(),
                         &err);
  if (!h) return false;
  Entry e;
  e.version = sha256_hex(header_bytes).substr(0, 16);
  e.bytes = h->header_bytes + (size_t)h->meta.n_layer * slab_bytes(h->meta);
  e.header = std::make_shared<const RecordHeader>(std::move(*h));
  e.header_bytes = std::move(header_bytes);
  const std::string id = e.header->meta.id;
  std::lock_guard lock(mu_);
  auto [it, inserted] = entries_.try_emplace(id);
  if (!inserted) used_bytes_ -= it->second.bytes;
  used_bytes_ += e.bytes;
  e.seq = next_seq_++;
  it->second = std::move(e);
  return true;
}

void RedisTier::drop(const std::string& id, uint64_t seq, const std::string& why) {
  Entry e;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.seq != seq) return;  // replaced or erased meanwhile
    e = std::move(it->second);
    used_bytes_ -= e.bytes;
    entries_.erase(it);
  }
  store_log(fmt::format("{}: chunk {}: {}; dropped", opt_.name, id, why));
  // Deletes this version's layer values, and the header only if it still names this version (a
  // concurrent writer may have replaced it), atomically on the server.
  static constexpr std::string_view kScript =
      "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', unpack(KEYS)) end "
      "return redis.call('DEL', unpack(KEYS, 2))";
  std::vector<std::string> keys{meta_key(id)};
  for (int l = 0; l < e.header->meta.n_layer; ++l)
    keys.push_back(version_layer_key(id, e.version, l));
  const std::string n_keys = std::to_string(keys.size());
  Command eval{"EVAL", kScript, n_keys};
  for (const std::string& k : keys) eval.push_back(k);
  eval.push_back(e.header_bytes);
  client_.exchange(redis_key_slot(keys[0]), {eval});
}

bool RedisTier::refresh_after_missing(const std::string& id, const Entry& seen, int layer) {
  const std::string key = meta_key(id);
  auto replies = client_.exchange(redis_key_slot(key), {{"GET", key}});
  if (!replies) return false;
  const redisReply* r = (*replies)[0].get();
  if (r->type != REDIS_REPLY_STRING) {
    drop(id, seen.seq, "the record is gone from the server");
    return false;
  }
  std::string bytes(r->str, r->len);
  if (bytes == seen.header_bytes) {
    drop(id, seen.seq, fmt::format("layer {} value of the current version is missing", layer));
    return false;
  }
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.seq != seen.seq) return it != entries_.end();
  }
  if (!index(std::move(bytes))) {
    drop(id, seen.seq, "the header on the server does not decode");
    return false;
  }
  return true;
}

std::optional<ChunkMeta> RedisTier::discover(const std::string& id) {
  const std::string key = meta_key(id);
  auto replies = client_.exchange(redis_key_slot(key), {{"GET", key}});
  if (!replies) return std::nullopt;  // unreachable: counted and logged by the client
  const redisReply* r = (*replies)[0].get();
  if (r->type != REDIS_REPLY_STRING) return std::nullopt;
  std::string bytes(r->str, r->len);
  if (!index(std::move(bytes))) {
    store_log(fmt::format("{}: chunk {}: the header on the server does not decode; ignored",
                          opt_.name, id));
    return std::nullopt;
  }
  return get_meta(id);  // nullopt when the header under this key names another id
}

void RedisTier::scan() {
  const std::string pattern = escape_glob(opt_.key_prefix) + "{*}:m";
  std::string cursor = "0";
  do {
    // SCAN has no key; slot 0's owner is the first node unless a MOVED said otherwise.
    auto replies = client_.exchange(0, {{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}});
    if (!replies) return;
    const redisReply* r = (*replies)[0].get();
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      store_log(fmt::format("{}: unexpected SCAN reply; index left incomplete", opt_.name));
      return;
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* keys = r->element[1];
    for (size_t i = 0; i < keys->elements; ++i) {
      const std::string key(keys->element[i]->str, keys->element[i]->len);
      auto got = client_.exchange(redis_key_slot(key), {{"GET", key}});
      if (!got) return;
      const redisReply* v = (*got)[0].get();
      if (v->type != REDIS_REPLY_STRING) continue;
      std::string bytes(v->str, v->len);
      std::string err;
      auto h = decode_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &err);
      if (!h || meta_key(h->meta.id) != key) {
        const std::string why = h ? "id does not match the key" : err;
        store_log(
            fmt::format("{}: {} is not a valid record header ({}); ignored", opt_.name, key, why));
        scan_rejects_.push_back(fmt::format("{}: {}; ignored", key, why));
        continue;
      }
      index(std::move(bytes));
    }
  } while (cursor != "0");
}

// ---------------------------------------------------------------------------------------------
// Tier operations

std::string RedisTier::last_put_error() const {
  std::lock_guard lock(put_err_mu_);
  return last_put_error_;
}

void RedisTier::put_failed(const std::string& id, const std::string& why) {
  {
    std::lock_guard lock(put_err_mu_);
    last_put_error_ = fmt::format("{}:{}: {}", opt_.host, opt_.port, why);
  }
  store_log_limited(
      opt_.name + " put " + client_.address(),
      fmt::format("{}: put chunk {} failed ({}:{}: {})", opt_.name, id, opt_.host, opt_.port, why));
}

bool RedisTier::put(const ChunkKV& kv) {
  check_chunk(kv);
  const ChunkMeta& m = kv.meta;
  const RecordLayout lay = plan_record(m, 1);
  const int n_groups = n_row_groups(m.n_tok);
  std::vector<std::vector<uint8_t>> slabs(m.n_layer);
  std::vector<uint32_t> crcs((size_t)m.n_layer * n_groups);
  for (int l = 0; l < m.n_layer; ++l) {
    slabs[l].resize(slab_bytes(m));
    slab_pack(kv, l, slabs[l].data());
    slab_group_crcs(slabs[l].data(), m, &crcs[(size_t)l * n_groups]);
  }
  const std::vector<uint8_t> header_vec = encode_header(lay, m, crcs);
  std::string header(header_vec.begin(), header_vec.end());
  const std::string version = sha256_hex(header).substr(0, 16);
  const std::string mkey = meta_key(m.id);
  const int slot = redis_key_slot(mkey);

  // The version being replaced, whose layer values go in the same transaction.
  auto old = client_.exchange(slot, {{"GET", mkey}});
  if (!old) {
    put_failed(m.id, "server unreachable");
    return false;
  }
  std::vector<std::string> old_keys;
  if (const redisReply* r = (*old)[0].get(); r->type == REDIS_REPLY_STRING) {
    const std::string old_bytes(r->str, r->len);
    std::string err;
    auto oh =
        decode_header(reinterpret_cast<const uint8_t*>(old_bytes.data()), old_bytes.size(), &err);
    const std::string old_version = sha256_hex(old_bytes).substr(0, 16);
    if (oh && old_version != version)
      for (int l = 0; l < oh->meta.n_layer; ++l)
        old_keys.push_back(version_layer_key(m.id, old_version, l));
  }

  std::vector<std::string> keys;
  for (int l = 0; l < m.n_layer; ++l) keys.push_back(version_layer_key(m.id, version, l));
  auto as_view = [](const std::vector<uint8_t>& b) {
    return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
  };
  std::vector<Command> cmds{{"MULTI"}};
  for (int l = 0; l < m.n_layer; ++l) cmds.push_back({"SET", keys[l], as_view(slabs[l])});
  cmds.push_back({"SET", mkey, header});
  size_t n_queued = (size_t)m.n_layer + 1;
  if (!old_keys.empty()) {
    Command del{"DEL"};
    for (const std::string& k : old_keys) del.push_back(k);
    cmds.push_back(std::move(del));
    ++n_queued;
  }
  cmds.push_back({"EXEC"});
  auto replies = client_.exchange(slot, cmds);
  if (!replies) {
    put_failed(m.id, "server unreachable");
    return false;
  }
  const redisReply* exec = replies->back().get();
  bool ok = exec->type == REDIS_REPLY_ARRAY && exec->elements == n_queued;
  for (size_t i = 0; ok && i < (size_t)m.n_layer + 1; ++i)
    ok = exec->element[i]->type == REDIS_REPLY_STATUS;
  if (!ok) {
    std::string why = "EXEC failed";
    for (const Reply& r : *replies)
      if (r->type == REDIS_REPLY_ERROR) why = std::string(r->str, r->len);
    client_.count_failure();
    put_failed(m.id, why);
    return false;
  }
  const bool indexed = index(std::move(header));
  CT_ASSERT(indexed, "a header just encoded does not decode");
  return true;
}

bool RedisTier::contains(const std::string& id) const { return find(id).header != nullptr; }

std::optional<ChunkMeta> RedisTier::get_meta(const std::string& id) const {
  const Entry e = find(id);
  if (!e.header) return std::nullopt;
  return e.header->meta;
}

bool RedisTier::read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                          void* v_dst) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Entry e = find(id);
    if (!e.header) return false;
    const RecordHeader& h = *e.header;
    check_row_args(h.meta, layer, row_begin, row_end);
    if (row_begin == row_end) return true;
    const GroupSpan span = covering_groups(h, row_begin, row_end);
    const size_t row = slab_row_bytes(h.meta);
    const size_t first = (size_t)span.row_lo * row;
    const size_t n = (size_t)(span.row_hi - span.row_lo) * row;
    const std::string key = version_layer_key(id, e.version, layer);
    const std::string from = std::to_string(first), to = std::to_string(first + n - 1);
    auto replies = client_.exchange(redis_key_slot(key), {{"GETRANGE", key, from, to}});
    if (!replies) return false;
    const redisReply* r = (*replies)[0].get();
    if (r->type == REDIS_REPLY_STRING && r->len == 0) {
      if (refresh_after_missing(id, e, layer)) continue;
      return false;
    }
    if (r->type != REDIS_REPLY_STRING || r->len != n) {
      drop(id, e.seq,
           r->type == REDIS_REPLY_STRING
               ? fmt::format("layer {} value has {} of {} bytes at [{}, {}] (truncated)", layer,
                             r->len, n, from, to)
               : fmt::format("GETRANGE {}: {}", key,
                             r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                                          : "unexpected reply"));
      return false;
    }
    const uint8_t* p = reinterpret_cast<const uint8_t*>(r->str);
    std::string err;
    if (!check_groups(h, layer, span, p, &err)) {
      drop(id, e.seq, err);
      return false;
    }
    slab_unpack(p + (size_t)(row_begin - span.row_lo) * row, (size_t)(row_end - row_begin),
                kv_row_bytes(h.meta), k_dst, v_dst);
    return true;
  }
  return false;
}

bool RedisTier::load_checked(const std::string& id, ChunkKV* out) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Entry e = find(id);
    if (!e.header) return false;
    const RecordHeader& h = *e.header;
    const int n_layer = h.meta.n_layer;
    std::vector<std::string> keys{meta_key(id)};
    for (int l = 0; l < n_layer; ++l) keys.push_back(version_layer_key(id, e.version, l));
    std::vector<Command> cmds;
    for (const std::string& k : keys) cmds.push_back({"GET", k});
    auto replies = client_.exchange(redis_key_slot(keys[0]), cmds);
    if (!replies) return false;
    const redisReply* hr = (*replies)[0].get();
    if (hr->type != REDIS_REPLY_STRING) {
      drop(id, e.seq, "the record is gone from the server");
      return false;
    }
    if (std::string_view(hr->str, hr->len) != e.header_bytes) {
      // Replaced by another writer, or the header is damaged: index what the server has.
      if (refresh_after_missing(id, e, -1)) continue;
      return false;
    }
    const GroupSpan all = covering_groups(h, 0, h.meta.n_tok);
    if (out) {
      out->meta = h.meta;
      out->k.assign(n_layer, std::vector<uint8_t>(h.meta.layer_bytes()));
      out->v.assign(n_layer, std::vector<uint8_t>(h.meta.layer_bytes()));
    }
    for (int l = 0; l < n_layer; ++l) {
      const redisReply* r = (*replies)[1 + l].get();
      if (r->type != REDIS_REPLY_STRING || r->len != slab_bytes(h.meta)) {
        drop(id, e.seq, fmt::format("layer {} value is missing or has the wrong size", l));
        return false;
      }
      const uint8_t* p = reinterpret_cast<const uint8_t*>(r->str);
      std::string err;
      if (!check_groups(h, l, all, p, &err)) {
        drop(id, e.seq, err);
        return false;
      }
      if (out)
        slab_unpack(p, h.meta.n_tok, kv_row_bytes(h.meta), out->k[l].data(), out->v[l].data());
    }
    return true;
  }
  return false;
}

std::optional<ChunkKV> RedisTier::get(const std::string& id) {
  ChunkKV kv;
  if (!load_checked(id, &kv)) return std::nullopt;
  return kv;
}

bool RedisTier::verify(const std::string& id) { return load_checked(id, nullptr); }

bool RedisTier::erase(const std::string& id) {
  Entry e;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    e = std::move(it->second);
    used_bytes_ -= e.bytes;
    entries_.erase(it);
  }
  Command del{"DEL"};
  std::vector<std::string> keys{meta_key(id)};
  for (int l = 0; l < e.header->meta.n_layer; ++l)
    keys.push_back(version_layer_key(id, e.version, l));
  for (const std::string& k : keys) del.push_back(k);
  auto replies = client_.exchange(redis_key_slot(keys[0]), {del});
  if (!replies || (*replies)[0]->type != REDIS_REPLY_INTEGER)
    store_log(fmt::format("{}: erase chunk {}: keys could not be deleted", opt_.name, id));
  return true;
}

std::vector<std::string> RedisTier::list() const {
  std::lock_guard lock(mu_);
  return ids_oldest_first(entries_);
}

}  // namespace ct::store

// ---------------------------------------------------------------------------------------------
// The "redis" tier kind: "redis[:HOST[:PORT]][:prefix=P][:timeout=MS]".

namespace ct::store {

RedisTierOptions redis_tier_options(const TierSpec& s) {
  RedisTierOptions r;
  std::vector<std::string> addr;
  for (const std::string& f : s.fields) {
    if (f.rfind("prefix=", 0) == 0) {
      r.key_prefix = f.substr(7);
    } else if (f.rfind("timeout=", 0) == 0) {
      const std::string t = f.substr(8);
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), r.command_timeout_ms);
      CT_THROW_IF_NOT(ec == std::errc() && end == t.data() + t.size() && r.command_timeout_ms > 0,
                      "tier '{}': timeout '{}' must be a positive number of milliseconds", s.text,
                      t);
    } else {
      addr.push_back(f);
    }
  }
  if (!addr.empty()) r.host = addr[0];
  if (addr.size() > 1) {
    // The whole field must be the number: atoi read "6379abc" as 6379 and "99999999999" as
    // whatever strtol's result wrapped to.
    const std::string& p = addr[1];
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), r.port);
    if (ec != std::errc() || end != p.data() + p.size()) r.port = 0;
  }
  CT_THROW_IF_NOT(addr.size() <= 2 && r.port > 0 && r.port < 65536,
                  "tier '{}': expected redis[:HOST[:PORT]] with PORT in 1..65535", s.text);
  return r;
}

namespace {

void redis_check(const TierSpec& s) { (void)redis_tier_options(s); }
std::unique_ptr<Tier> redis_make(const TierSpec& s) {
  return std::make_unique<RedisTier>(redis_tier_options(s));
}
std::string redis_key(const TierSpec&) { return "redis"; }

}  // namespace

extern const TierKind kRedisTierKind;  // listed in tier_registry.cc
const TierKind kRedisTierKind{"redis", "redis[:HOST[:PORT]][:prefix=P][:timeout=MS]", redis_check,
                              redis_make, redis_key};

}  // namespace ct::store
