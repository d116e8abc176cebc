// RedisTier: pipelined hiredis exchanges with a small per-node connection pool, MOVED/ASK
// handling, GETRANGE row reads and checksum verification.
#include "store/redis_tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/sha256.h"

namespace ct::store {
namespace {

uint16_t crc16_xmodem(const uint8_t* p, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i) {
    crc ^= (uint16_t)p[i] << 8;
    for (int k = 0; k < 8; ++k) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

// Blocks SIGPIPE in this thread for the scope; a SIGPIPE raised meanwhile is consumed.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

timeval to_timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

bool split_addr(const std::string& addr, std::string* host, int* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return false;
  *host = addr.substr(0, colon);
  try {
    *port = std::stoi(addr.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

bool is_error_with(const redisReply* r, std::string_view prefix) {
  return r && r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with(prefix);
}

std::string escape_glob(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

int redis_key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return crc16_xmodem(reinterpret_cast<const uint8_t*>(key.data()), key.size()) % 16384;
}

void RedisTier::ReplyFree::operator()(redisReply* r) const { freeReplyObject(r); }

RedisTier::RedisTier(RedisTierOptions opt) : opt_(std::move(opt)) {
  CT_THROW_IF_NOT(opt_.key_prefix.find_first_of("{}") == std::string::npos,
                  "redis tier '{}': key prefix '{}' must not contain '{{' or '}}' (the hash tag "
                  "is the chunk id)",
                  opt_.name, opt_.key_prefix);
  default_addr_ = fmt::format("{}:{}", opt_.host, opt_.port);
  if (opt_.scan_on_start) scan();
}

RedisTier::~RedisTier() {
  for (auto& [addr, node] : nodes_)
    for (redisContext* c : node.idle) redisFree(c);
}

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
// Connections

std::string RedisTier::addr_for_slot(int slot) {
  std::lock_guard lock(conn_mu_);
  auto it = slot_owner_.find(slot);
  return it == slot_owner_.end() ? default_addr_ : it->second;
}

redisContext* RedisTier::acquire(const std::string& addr, bool* reused) {
  *reused = false;
  {
    std::lock_guard lock(conn_mu_);
    Node& node = nodes_[addr];
    if (std::chrono::steady_clock::now() < node.down_until) return nullptr;
    if (!node.idle.empty()) {
      redisContext* c = node.idle.back();
      node.idle.pop_back();
      *reused = true;
      return c;
    }
  }
  std::string host;
  int port = 0;
  if (!split_addr(addr, &host, &port)) {
    mark_down(addr, "cannot parse the address");
    return nullptr;
  }
  if (host.empty()) host = opt_.host;  // a cluster node that does not know its own address
  redisContext* c =
      redisConnectWithTimeout(host.c_str(), port, to_timeval(opt_.connect_timeout_ms));
  if (!c || c->err) {
    mark_down(addr, fmt::format("connect: {}", c ? c->errstr : "out of memory"));
    if (c) redisFree(c);
    return nullptr;
  }
  redisSetTimeout(c, to_timeval(opt_.command_timeout_ms));
  return c;
}

void RedisTier::release(const std::string& addr, redisContext* c) {
  std::lock_guard lock(conn_mu_);
  nodes_[addr].idle.push_back(c);
}

void RedisTier::mark_down(const std::string& addr, const std::string& why) {
  ++failures_;
  std::vector<redisContext*> stale;
  {
    std::lock_guard lock(conn_mu_);
    Node& node = nodes_[addr];
    node.down_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.retry_after_ms);
    stale.swap(node.idle);
  }
  for (redisContext* c : stale) redisFree(c);
  store_log_limited(fmt::format("{} node {}", opt_.name, addr),
                    fmt::format("{}: redis node {}: {}; treating as a miss for {} ms", opt_.name,
                                addr, why, opt_.retry_after_ms));
}

std::optional<std::vector<RedisTier::Reply>> RedisTier::exchange(int slot,
                                                                 const std::vector<Command>& cmds) {
  std::string addr = addr_for_slot(slot);
  bool asking = false;
  bool stale_retried = false;
  for (int attempt = 0; attempt <= opt_.max_redirects; ++attempt) {
    bool reused = false;
    redisContext* c = acquire(addr, &reused);
    if (!c) return std::nullopt;
    std::vector<Reply> replies;
    bool io_ok = true;
    {
      SigpipeBlock no_sigpipe;
      // After ASK: ASKING before every command, except that a transaction needs one ASKING
      // before MULTI (the flag then lasts until EXEC; an ASKING inside MULTI would be queued).
      const bool transaction = !cmds.empty() && !cmds[0].empty() && cmds[0][0] == "MULTI";
      std::vector<bool> is_asking_reply;
      std::vector<const char*> argv;
      std::vector<size_t> argl;
      for (size_t i = 0; i < cmds.size(); ++i) {
        if (asking && (!transaction || i == 0)) {
          redisAppendCommand(c, "ASKING");
          is_asking_reply.push_back(true);
        }
        argv.clear();
        argl.clear();
        for (std::string_view a : cmds[i]) {
          argv.push_back(a.data());
          argl.push_back(a.size());
        }
        redisAppendCommandArgv(c, (int)argv.size(), argv.data(), argl.data());
        is_asking_reply.push_back(false);
      }
      for (size_t i = 0; i < is_asking_reply.size() && io_ok; ++i) {
        void* r = nullptr;
        if (redisGetReply(c, &r) != REDIS_OK) {
          io_ok = false;
        } else if (!is_asking_reply[i]) {
          replies.emplace_back(static_cast<redisReply*>(r));
        } else {
          freeReplyObject(r);
        }
      }
    }
    if (!io_ok) {
      const std::string why = c->errstr[0] ? c->errstr : "I/O error";
      // A pooled connection the server closed while it sat idle (the server was restarted
      // between two requests) fails at once with EOF, a reset or a broken pipe, never with a
      // timeout: retry once on a fresh connection before calling the node down. Every exchange
      // is idempotent (SETs of one version's content, GETs, DELs, the drop script).
      const bool closed = c->err == REDIS_ERR_EOF ||
                          (c->err == REDIS_ERR_IO &&
                           (why == std::strerror(ECONNRESET) || why == std::strerror(EPIPE)));
      redisFree(c);
      if (reused && closed && !stale_retried) {
        stale_retried = true;
        std::vector<redisContext*> stale;
        {
          std::lock_guard lock(conn_mu_);
          stale.swap(nodes_[addr].idle);  // opened before the same restart
        }
        for (redisContext* s : stale) redisFree(s);
        --attempt;  // not a redirection
        continue;
      }
      mark_down(addr, why);
      return std::nullopt;
    }
    release(addr, c);
    // A redirection may sit in any reply of the pipeline (inside MULTI: a queued command's).
    const redisReply* redirect = nullptr;
    for (const Reply& r : replies) {
      if (is_error_with(r.get(), "MOVED ") || is_error_with(r.get(), "ASK ")) {
        redirect = r.get();
        break;
      }
    }
    if (!redirect) return replies;
    // "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>"
    const std::string text(redirect->str, redirect->len);
    const size_t sp1 = text.find(' '), sp2 = text.find(' ', sp1 + 1);
    if (sp2 == std::string::npos) break;
    const std::string target = text.substr(sp2 + 1);
    ++redirects_;
    if (text.starts_with("MOVED ")) {
      std::lock_guard lock(conn_mu_);
      slot_owner_[slot] = target;
      asking = false;
    } else {
      asking = true;
    }
    addr = target;
  }
  ++failures_;
  store_log(fmt::format("{}: slot {}: no answer after {} redirections", opt_.name, slot,
                        opt_.max_redirects));
  return std::nullopt;
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
  exchange(redis_key_slot(keys[0]), {eval});
}

bool RedisTier::refresh_after_missing(const std::string& id, const Entry& seen, int layer) {
  const std::string key = meta_key(id);
  auto replies = exchange(redis_key_slot(key), {{"GET", key}});
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

void RedisTier::scan() {
  const std::string pattern = escape_glob(opt_.key_prefix) + "{*}:m";
  std::string cursor = "0";
  do {
    // SCAN has no key; slot 0's owner is the first node unless a MOVED said otherwise.
    auto replies = exchange(0, {{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}});
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
      auto got = exchange(redis_key_slot(key), {{"GET", key}});
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
      opt_.name + " put " + default_addr_,
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
  auto old = exchange(slot, {{"GET", mkey}});
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
  auto replies = exchange(slot, cmds);
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
    ++failures_;
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
    auto replies = exchange(redis_key_slot(key), {{"GETRANGE", key, from, to}});
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
    auto replies = exchange(redis_key_slot(keys[0]), cmds);
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
  auto replies = exchange(redis_key_slot(keys[0]), {del});
  if (!replies || (*replies)[0]->type != REDIS_REPLY_INTEGER)
    store_log(fmt::format("{}: erase chunk {}: keys could not be deleted", opt_.name, id));
  return true;
}

std::vector<std::string> RedisTier::list() const {
  std::lock_guard lock(mu_);
  return ids_oldest_first(entries_);
}

}  // namespace ct::store
