// MemoryTier: records held in process memory behind immutable shared entries.
#include "store/memory_tier.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "store/crc32c.h"
#include "store/record_format.h"
#include "store/tier_registry.h"

namespace ct::store {

MemoryTier::MemoryTier(std::string name, size_t capacity_bytes)
    : name_(std::move(name)), capacity_bytes_(capacity_bytes) {}

size_t MemoryTier::used_bytes() const {
  std::shared_lock lock(mu_);
  return used_bytes_;
}

size_t MemoryTier::footprint(const ChunkMeta& m) const {
  return m.kv_bytes() + 4 * (m.tokens.size() + m.order.size() + m.scores.size()) + m.id.size() +
         m.model_fingerprint.size();
}

std::shared_ptr<const MemoryTier::Entry> MemoryTier::find(const std::string& id) const {
  std::shared_lock lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second;
}

bool MemoryTier::put(const ChunkKV& kv) {
  check_chunk(kv);
  auto e = std::make_shared<Entry>();
  e->kv = kv;
  const int n_layer = kv.meta.n_layer;
  e->k_crc.resize(n_layer);
  e->v_crc.resize(n_layer);
  for (int l = 0; l < n_layer; ++l) {
    e->k_crc[l] = crc32c(kv.k[l].data(), kv.k[l].size());
    e->v_crc[l] = crc32c(kv.v[l].data(), kv.v[l].size());
  }
  e->bytes = footprint(kv.meta);
  std::unique_lock lock(mu_);
  e->seq = next_seq_++;
  auto [it, inserted] = entries_.try_emplace(kv.meta.id);
  if (!inserted) used_bytes_ -= it->second->bytes;
  used_bytes_ += e->bytes;
  it->second = std::move(e);
  return true;
}

bool MemoryTier::contains(const std::string& id) const { return find(id) != nullptr; }

std::optional<ChunkMeta> MemoryTier::get_meta(const std::string& id) const {
  auto e = find(id);
  if (!e) return std::nullopt;
  return e->kv.meta;
}

void MemoryTier::copy_rows(const Entry& e, int layer, int row_begin, int row_end, void* k_dst,
                           void* v_dst) {
  const ChunkMeta& m = e.kv.meta;
  check_row_args(m, layer, row_begin, row_end);
  const size_t row = kv_row_bytes(m);
  const size_t n = (size_t)(row_end - row_begin) * row;
  if (n == 0) return;
  std::memcpy(k_dst, e.kv.k[layer].data() + row_begin * row, n);
  std::memcpy(v_dst, e.kv.v[layer].data() + row_begin * row, n);
}

bool MemoryTier::read_rows(const std::string& id, int layer, int row_begin, int row_end,
                           void* k_dst, void* v_dst) {
  auto e = find(id);
  if (!e) return false;
  copy_rows(*e, layer, row_begin, row_end, k_dst, v_dst);
  return true;
}

// Holds the entry itself: erasing or replacing it in the tier leaves this copy intact (entries
// are immutable once published).
class MemoryTier::Pin final : public PinnedRecord {
 public:
  explicit Pin(std::shared_ptr<const Entry> e) : e_(std::move(e)) {}
  bool read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) override {
    copy_rows(*e_, layer, row_begin, row_end, k_dst, v_dst);
    return true;
  }

 private:
  std::shared_ptr<const Entry> e_;
};

std::shared_ptr<PinnedRecord> MemoryTier::pin(const std::string& id) {
  auto e = find(id);
  if (!e) return nullptr;
  return std::make_shared<Pin>(std::move(e));
}

std::optional<ChunkKV> MemoryTier::get(const std::string& id) {
  auto e = find(id);
  if (!e) return std::nullopt;
  return e->kv;
}

bool MemoryTier::drop_if_same(const std::string& id, const Entry* e) {
  std::unique_lock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.get() != e) return false;
  used_bytes_ -= it->second->bytes;
  entries_.erase(it);
  return true;
}

bool MemoryTier::erase(const std::string& id) {
  std::unique_lock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  used_bytes_ -= it->second->bytes;
  entries_.erase(it);
  return true;
}

std::vector<std::string> MemoryTier::list() const {
  std::vector<std::pair<uint64_t, std::string>> by_seq;
  {
    std::shared_lock lock(mu_);
    for (const auto& [id, e] : entries_) by_seq.emplace_back(e->seq, id);
  }
  std::sort(by_seq.begin(), by_seq.end());
  std::vector<std::string> ids;
  for (auto& [seq, id] : by_seq) ids.push_back(std::move(id));
  return ids;
}

bool MemoryTier::verify(const std::string& id) {
  auto e = find(id);
  if (!e) return false;
  for (int l = 0; l < e->kv.meta.n_layer; ++l) {
    const uint32_t k = crc32c(e->kv.k[l].data(), e->kv.k[l].size());
    const uint32_t v = crc32c(e->kv.v[l].data(), e->kv.v[l].size());
    if (k != e->k_crc[l] || v != e->v_crc[l]) {
      store_log(fmt::format("{}: chunk {} layer {} {} block checksum mismatch; dropped", name_, id,
                            l, k != e->k_crc[l] ? "K" : "V"));
      drop_if_same(id, e.get());
      return false;
    }
  }
  return true;
}

bool MemoryTier::flip_bit_for_test(const std::string& id, int layer, bool v_block, size_t offset) {
  std::unique_lock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Entry& e = const_cast<Entry&>(*it->second);
  auto& block = v_block ? e.kv.v.at(layer) : e.kv.k.at(layer);
  block.at(offset) ^= 0x01;
  return true;
}

}  // namespace ct::store

// ---------------------------------------------------------------------------------------------
// The "device" and "host" tier kinds: "device[:CAPACITY]", "host[:CAPACITY]".

namespace ct::store {
namespace {

size_t memory_capacity(const TierSpec& s) {
  CT_THROW_IF_NOT(s.fields.size() <= 1, "tier '{}': expected {}[:CAPACITY]", s.text, s.kind);
  return s.fields.empty() ? SIZE_MAX : parse_bytes(s.fields[0]);
}
void memory_check(const TierSpec& s) { (void)memory_capacity(s); }
std::unique_ptr<Tier> memory_make(const TierSpec& s) {
  return std::make_unique<MemoryTier>(s.kind, memory_capacity(s));
}
std::string memory_key(const TierSpec& s) { return s.kind; }

}  // namespace

extern const TierKind kDeviceTierKind, kHostTierKind;  // listed in tier_registry.cc
const TierKind kDeviceTierKind{"device", "device[:CAPACITY]", memory_check, memory_make,
                                      memory_key};
const TierKind kHostTierKind{"host", "host[:CAPACITY]", memory_check, memory_make,
                                    memory_key};

}  // namespace ct::store
