// Encoding and checking of the shared chunk record format (see record_format.h for the layout).
#include "store/record_format.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "store/crc32c.h"

namespace ct::store {

static_assert(std::endian::native == std::endian::little,
              "the record format is little-endian and written with memcpy");

namespace {

template <typename T>
void put_le(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T get_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

constexpr size_t kOffVersion = 8, kOffHeaderBytes = 12, kOffJsonBytes = 16, kOffArraysBytes = 20,
                 kOffNLayer = 24, kOffNGroups = 28, kOffGroupRows = 32, kOffHeaderCrc = 36,
                 kOffDataOffset = 40, kOffSlabStride = 48, kOffTotalBytes = 56;

nlohmann::json meta_scalars_to_json(const ChunkMeta& m) {
  nlohmann::json j{{"id", m.id},
                        {"model_fingerprint", m.model_fingerprint},
                        {"n_tok", m.n_tok},
                        {"n_layer", m.n_layer},
                        {"kv_dim", m.kv_dim},
                        {"dtype", kv_dtype_name(m.dtype)},
                        {"sink", m.sink},
                        {"rank_mode", m.rank_mode},
                        {"alpha", m.alpha},
                        {"rank_ms", m.rank_ms},
                        {"tokens_len", m.tokens.size()},
                        {"order_len", m.order.size()},
                        {"scores_len", m.scores.size()}};
  // Only when set, so records of the spectral modes are byte for byte what they were before.
  if (!m.rank_params.empty()) j["rank_params"] = m.rank_params;
  return j;
}

// An integer field of the meta JSON within [lo, hi]. nlohmann's get<int32_t>() on a float such as
// 1e300 is undefined behaviour and on a wider integer it wraps, so the type and range are checked
// first; throws ct::Error naming the field (decode_header turns it into its error).
int64_t json_int(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
  const nlohmann::json& v = j.at(key);
  const bool is_int = v.is_number_integer();
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)hi;
  if (!is_int || too_big || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    CT_THROW("{} is {}, expected an integer in [{}, {}]", key, v.dump(), lo, hi);
  }
  return v.get<int64_t>();
}

}  // namespace

bool is_valid_chunk_id(std::string_view id) {
  if (id.empty() || id.size() > 200 || id[0] == '.') return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool check_meta(const ChunkMeta& m, std::string* err) {
  auto fail = [err](std::string msg) {
    *err = std::move(msg);
    return false;
  };
  if (!is_valid_chunk_id(m.id))
    return fail(
        fmt::format("chunk id '{}' is not usable as a file name or key, expected 1-200 "
                    "characters from [A-Za-z0-9._-] not starting with '.'",
                    m.id.substr(0, 64)));
  for (const auto& [name, v] : {std::pair<const char*, int32_t>{"n_tok", m.n_tok},
                                {"n_layer", m.n_layer},
                                {"kv_dim", m.kv_dim}}) {
    if (v <= 0 || v > kMaxRecordDim)
      return fail(fmt::format("chunk {}: {}={}, expected 1 to {}", m.id, name, v, kMaxRecordDim));
  }
  if (!kv_record_type(m.dtype))
    return fail(
        fmt::format("chunk {}: K/V dtype {}, expected f32, f16 or bf16", m.id, (int)m.dtype));
  const size_t n = (size_t)m.n_tok;
  for (const auto& [name, len] : {std::pair<const char*, size_t>{"tokens", m.tokens.size()},
                                  {"order", m.order.size()},
                                  {"scores", m.scores.size()}}) {
    if (len != n)
      return fail(
          fmt::format("chunk {}: {} has {} entries, expected n_tok={}", m.id, name, len, n));
  }
  std::vector<bool> seen(n, false);
  for (size_t j = 0; j < n; ++j) {
    const int32_t t = m.order[j];
    if (t < 0 || (size_t)t >= n || seen[t])
      return fail(fmt::format("chunk {}: order[{}]={} {}, expected a permutation of [0, {})", m.id,
                              j, t, (t < 0 || (size_t)t >= n) ? "is out of range" : "repeats", n));
    seen[t] = true;
  }
  for (size_t t = 0; t < n; ++t) {
    if (m.tokens[t] < 0)
      return fail(fmt::format("chunk {}: tokens[{}]={}, expected a non-negative token id", m.id, t,
                              m.tokens[t]));
  }
  // The store does not interpret the rank mode (reuse/ owns the names); it only keeps it printable.
  const bool mode_ok = !m.rank_mode.empty() && m.rank_mode.size() <= 32 &&
                       std::all_of(m.rank_mode.begin(), m.rank_mode.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                                c == '-';
                       });
  if (!mode_ok)
    return fail(fmt::format("chunk {}: rank_mode '{}', expected 1-32 characters from [a-z0-9_-]",
                            m.id, m.rank_mode.substr(0, 32)));
  const bool params_ok = m.rank_params.size() <= 200 &&
                         std::all_of(m.rank_params.begin(), m.rank_params.end(),
                                     [](char c) { return c > ' ' && c < 127; });
  if (!params_ok)
    return fail(fmt::format("chunk {}: rank_params of {} characters, expected at most 200 "
                            "printable ones without spaces",
                            m.id, m.rank_params.size()));
  if (!std::isfinite(m.alpha) || !std::isfinite(m.rank_ms))
    return fail(fmt::format("chunk {}: alpha={} rank_ms={}, expected finite numbers", m.id, m.alpha,
                            m.rank_ms));
  return true;
}

void check_chunk(const ChunkKV& kv) {
  const ChunkMeta& m = kv.meta;
  std::string err;
  CT_THROW_IF_NOT(check_meta(m, &err), "{}", err);
  CT_THROW_IF_NOT(kv.k.size() == (size_t)m.n_layer && kv.v.size() == (size_t)m.n_layer,
                  "chunk {}: {} K and {} V blocks, expected n_layer={}", m.id, kv.k.size(),
                  kv.v.size(), m.n_layer);
  for (int l = 0; l < m.n_layer; ++l) {
    CT_THROW_IF_NOT(kv.k[l].size() == m.layer_bytes() && kv.v[l].size() == m.layer_bytes(),
                    "chunk {} layer {}: K block {} bytes, V block {} bytes, expected {} "
                    "({} tokens of {} {} elements)",
                    m.id, l, kv.k[l].size(), kv.v[l].size(), m.layer_bytes(), m.n_tok, m.kv_dim,
                    kv_dtype_name(m.dtype));
  }
}

size_t kv_row_bytes(const ChunkMeta& m) { return kv_bytes(m.dtype, m.kv_dim); }
size_t slab_row_bytes(const ChunkMeta& m) { return 2 * kv_row_bytes(m); }
size_t slab_bytes(const ChunkMeta& m) { return (size_t)m.n_tok * slab_row_bytes(m); }
int n_row_groups(int n_tok, uint32_t group_rows) {
  return (int)(((int64_t)n_tok + group_rows - 1) / group_rows);
}

void slab_pack(const ChunkKV& kv, int layer, uint8_t* dst) {
  const size_t row = kv_row_bytes(kv.meta);
  const uint8_t* k = kv.k[layer].data();
  const uint8_t* v = kv.v[layer].data();
  for (int j = 0; j < kv.meta.n_tok; ++j) {
    std::memcpy(dst, k + j * row, row);
    std::memcpy(dst + row, v + j * row, row);
    dst += 2 * row;
  }
}

void slab_unpack(const uint8_t* src, size_t n_rows, size_t kv_row, void* k_dst, void* v_dst) {
  uint8_t* k = static_cast<uint8_t*>(k_dst);
  uint8_t* v = static_cast<uint8_t*>(v_dst);
  for (size_t j = 0; j < n_rows; ++j) {
    std::memcpy(k + j * kv_row, src, kv_row);
    std::memcpy(v + j * kv_row, src + kv_row, kv_row);
    src += 2 * kv_row;
  }
}

void slab_group_crcs(const uint8_t* slab, const ChunkMeta& m, uint32_t* out) {
  const size_t row = slab_row_bytes(m);
  const int n_groups = n_row_groups(m.n_tok);
  for (int g = 0; g < n_groups; ++g) {
    const int r0 = g * (int)kGroupRows;
    const int r1 = std::min(m.n_tok, r0 + (int)kGroupRows);
    out[g] = crc32c(slab + r0 * row, (size_t)(r1 - r0) * row);
  }
}

RecordLayout plan_record(const ChunkMeta& m, uint64_t align) {
  RecordLayout lay;
  lay.meta_json = meta_scalars_to_json(m).dump();
  lay.arrays_bytes = (uint32_t)(4 * (m.tokens.size() + m.order.size() + m.scores.size()));
  const size_t crc_bytes = 4 * (size_t)m.n_layer * n_row_groups(m.n_tok);
  const size_t header = kFixedHeaderBytes + lay.meta_json.size() + lay.arrays_bytes + crc_bytes;
  CT_THROW_IF_NOT(header <= kMaxHeaderBytes, "chunk {}: header of {} bytes exceeds the {} limit",
                  m.id, header, kMaxHeaderBytes);
  lay.header_bytes = (uint32_t)header;
  lay.data_offset = align_up(header, align);
  lay.slab_stride = align_up(slab_bytes(m), align);
  lay.total_bytes = lay.data_offset + (uint64_t)m.n_layer * lay.slab_stride;
  return lay;
}

std::vector<uint8_t> encode_header(const RecordLayout& lay, const ChunkMeta& m,
                                   const std::vector<uint32_t>& group_crc) {
  const int n_groups = n_row_groups(m.n_tok);
  CT_ASSERT(group_crc.size() == (size_t)m.n_layer * n_groups, "{} checksums for {}x{}",
            group_crc.size(), m.n_layer, n_groups);
  std::vector<uint8_t> h(lay.header_bytes, 0);
  std::memcpy(h.data(), kRecordMagic, 8);
  put_le<uint32_t>(&h[kOffVersion], kRecordVersion);
  put_le<uint32_t>(&h[kOffHeaderBytes], lay.header_bytes);
  put_le<uint32_t>(&h[kOffJsonBytes], (uint32_t)lay.meta_json.size());
  put_le<uint32_t>(&h[kOffArraysBytes], lay.arrays_bytes);
  put_le<uint32_t>(&h[kOffNLayer], (uint32_t)m.n_layer);
  put_le<uint32_t>(&h[kOffNGroups], (uint32_t)n_groups);
  put_le<uint32_t>(&h[kOffGroupRows], kGroupRows);
  put_le<uint64_t>(&h[kOffDataOffset], lay.data_offset);
  put_le<uint64_t>(&h[kOffSlabStride], lay.slab_stride);
  put_le<uint64_t>(&h[kOffTotalBytes], lay.total_bytes);
  uint8_t* p = h.data() + kFixedHeaderBytes;
  std::memcpy(p, lay.meta_json.data(), lay.meta_json.size());
  p += lay.meta_json.size();
  auto put_array = [&p](const void* src, size_t n) {
    if (n) std::memcpy(p, src, 4 * n);
    p += 4 * n;
  };
  put_array(m.tokens.data(), m.tokens.size());
  put_array(m.order.data(), m.order.size());
  put_array(m.scores.data(), m.scores.size());
  put_array(group_crc.data(), group_crc.size());
  CT_ASSERT(p == h.data() + h.size());
  put_le<uint32_t>(&h[kOffHeaderCrc], crc32c(h.data(), h.size()));
  return h;
}

std::optional<size_t> peek_header_bytes(const uint8_t* p, size_t n, std::string* err) {
  if (n < kFixedHeaderBytes) {
    *err = fmt::format("record of {} bytes is shorter than the {}-byte fixed header", n,
                       kFixedHeaderBytes);
    return std::nullopt;
  }
  if (std::memcmp(p, kRecordMagic, 8) != 0) {
    *err = "bad magic, expected CTKVCHNK";
    return std::nullopt;
  }
  const uint32_t version = get_le<uint32_t>(p + kOffVersion);
  if (version != kRecordVersion) {
    *err = fmt::format("format version {}, expected {}", version, kRecordVersion);
    return std::nullopt;
  }
  const uint32_t hb = get_le<uint32_t>(p + kOffHeaderBytes);
  if (hb < kFixedHeaderBytes || hb > kMaxHeaderBytes) {
    *err = fmt::format("header length {} is implausible", hb);
    return std::nullopt;
  }
  return hb;
}

std::optional<RecordHeader> decode_header(const uint8_t* p, size_t n, std::string* err) {
  const std::optional<size_t> hb = peek_header_bytes(p, n, err);
  if (!hb) return std::nullopt;
  if (n < *hb) {
    *err = fmt::format("header truncated: {} of {} bytes", n, *hb);
    return std::nullopt;
  }
  std::vector<uint8_t> copy(p, p + *hb);
  const uint32_t stored_crc = get_le<uint32_t>(&copy[kOffHeaderCrc]);
  put_le<uint32_t>(&copy[kOffHeaderCrc], 0);
  const uint32_t actual_crc = crc32c(copy.data(), copy.size());
  if (stored_crc != actual_crc) {
    *err = fmt::format("header checksum {:08x}, computed {:08x}", stored_crc, actual_crc);
    return std::nullopt;
  }
  RecordHeader h;
  h.header_bytes = (uint32_t)*hb;
  const uint32_t json_bytes = get_le<uint32_t>(p + kOffJsonBytes);
  const uint32_t arrays_bytes = get_le<uint32_t>(p + kOffArraysBytes);
  const uint32_t n_layer = get_le<uint32_t>(p + kOffNLayer);
  h.n_groups = (int)get_le<uint32_t>(p + kOffNGroups);
  h.group_rows = get_le<uint32_t>(p + kOffGroupRows);
  h.data_offset = get_le<uint64_t>(p + kOffDataOffset);
  h.slab_stride = get_le<uint64_t>(p + kOffSlabStride);
  h.total_bytes = get_le<uint64_t>(p + kOffTotalBytes);
  const uint64_t crc_bytes = 4ull * n_layer * (uint64_t)h.n_groups;
  if (kFixedHeaderBytes + (uint64_t)json_bytes + arrays_bytes + crc_bytes != *hb) {
    *err = "header section lengths are inconsistent";
    return std::nullopt;
  }
  // covering_groups and check_groups compute in int: a group_rows above INT_MAX turned negative
  // there and sent reads before the slab and past the checksum table.
  if (h.group_rows == 0 || h.group_rows > (uint32_t)kMaxRecordDim) {
    *err = fmt::format("group_rows {}, expected 1 to {}", h.group_rows, kMaxRecordDim);
    return std::nullopt;
  }
  const uint8_t* q = p + kFixedHeaderBytes;
  try {
    const auto j = nlohmann::json::parse(q, q + json_bytes);
    ChunkMeta& m = h.meta;
    m.id = j.at("id").get<std::string>();
    m.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    constexpr int64_t kI32Min = INT32_MIN, kI32Max = INT32_MAX;
    m.n_tok = (int32_t)json_int(j, "n_tok", kI32Min, kI32Max);
    m.n_layer = (int32_t)json_int(j, "n_layer", kI32Min, kI32Max);
    m.kv_dim = (int32_t)json_int(j, "kv_dim", kI32Min, kI32Max);
    m.dtype = parse_kv_dtype(j.at("dtype").get<std::string>());
    m.sink = j.at("sink").get<bool>();
    m.rank_mode = j.at("rank_mode").get<std::string>();
    m.alpha = j.at("alpha").get<double>();
    m.rank_ms = j.at("rank_ms").get<double>();
    m.rank_params = j.contains("rank_params") ? j.at("rank_params").get<std::string>() : "";
    // Each length is bounded by the section before the sum is formed: 4 * (a + b + c) wrapped
    // around 2^64 for lengths near 2^61, matched arrays_bytes, and the resize below then asked
    // for 2^63 bytes.
    const int64_t max_len = arrays_bytes / 4;
    const size_t n_tokens = (size_t)json_int(j, "tokens_len", 0, max_len);
    const size_t n_order = (size_t)json_int(j, "order_len", 0, max_len);
    const size_t n_scores = (size_t)json_int(j, "scores_len", 0, max_len);
    if (4 * (n_tokens + n_order + n_scores) != arrays_bytes) {
      *err = "array lengths disagree with the arrays section";
      return std::nullopt;
    }
    q += json_bytes;
    auto get_array = [&q](auto& vec, size_t len) {
      vec.resize(len);
      if (len) std::memcpy(vec.data(), q, 4 * len);
      q += 4 * len;
    };
    get_array(m.tokens, n_tokens);
    get_array(m.order, n_order);
    get_array(m.scores, n_scores);
  } catch (const std::exception& e) {  // nlohmann parse/type errors and ct::Error
    *err = fmt::format("meta is not valid: {}", e.what());
    return std::nullopt;
  }
  const ChunkMeta& m = h.meta;
  std::string meta_err;
  if (!check_meta(m, &meta_err)) {
    *err = "meta is not valid: " + meta_err;
    return std::nullopt;
  }
  if (m.n_tok <= 0 || m.kv_dim <= 0 || m.n_layer != (int32_t)n_layer ||
      h.n_groups != n_row_groups(m.n_tok, h.group_rows)) {
    *err = fmt::format("meta (n_tok={}, n_layer={}, kv_dim={}) disagrees with the header", m.n_tok,
                       m.n_layer, m.kv_dim);
    return std::nullopt;
  }
  h.group_crc.resize((size_t)n_layer * h.n_groups);
  std::memcpy(h.group_crc.data(), q, crc_bytes);
  if (h.data_offset < h.header_bytes || h.slab_stride < slab_bytes(m) ||
      h.total_bytes < h.data_offset + (uint64_t)(m.n_layer - 1) * h.slab_stride + slab_bytes(m)) {
    *err = "slab placement is inconsistent with the header";
    return std::nullopt;
  }
  return h;
}

GroupSpan covering_groups(const RecordHeader& h, int row_begin, int row_end) {
  GroupSpan s;
  const int gr = (int)h.group_rows;
  s.g_begin = row_begin / gr;
  s.g_end = (row_end + gr - 1) / gr;
  s.row_lo = s.g_begin * gr;
  s.row_hi = std::min(h.meta.n_tok, s.g_end * gr);
  return s;
}

bool check_groups(const RecordHeader& h, int layer, const GroupSpan& span, const uint8_t* buf,
                  std::string* err) {
  const size_t row = slab_row_bytes(h.meta);
  const int gr = (int)h.group_rows;
  for (int g = span.g_begin; g < span.g_end; ++g) {
    const int r0 = g * gr;
    const int r1 = std::min(h.meta.n_tok, r0 + gr);
    const uint32_t actual = crc32c(buf + (size_t)(r0 - span.row_lo) * row, (size_t)(r1 - r0) * row);
    if (actual != h.crc(layer, g)) {
      *err = fmt::format(
          "checksum mismatch in layer {} rows [{}, {}): stored {:08x}, computed "
          "{:08x}",
          layer, r0, r1, h.crc(layer, g), actual);
      return false;
    }
  }
  return true;
}

void check_row_args(const ChunkMeta& m, int layer, int row_begin, int row_end) {
  CT_THROW_IF_NOT(layer >= 0 && layer < m.n_layer, "chunk {}: layer {} out of range [0, {})", m.id,
                  layer, m.n_layer);
  CT_THROW_IF_NOT(0 <= row_begin && row_begin <= row_end && row_end <= m.n_tok,
                  "chunk {}: rows [{}, {}) out of range for n_tok={}", m.id, row_begin, row_end,
                  m.n_tok);
}

void store_log(const std::string& msg) {
  std::fprintf(stderr, "cachetune store: %s\n", msg.c_str());
}

bool store_log_limited(const std::string& key, const std::string& msg) {
  struct State {
    std::chrono::steady_clock::time_point last;
    uint64_t suppressed = 0;
  };
  static std::mutex mu;
  static std::map<std::string, State> states;
  const auto now = std::chrono::steady_clock::now();
  uint64_t not_shown = 0;
  {
    std::lock_guard lock(mu);
    auto [it, fresh] = states.try_emplace(key);
    if (!fresh && now - it->second.last < std::chrono::minutes(1)) {
      ++it->second.suppressed;
      return false;
    }
    not_shown = it->second.suppressed;
    it->second = State{now, 0};
  }
  store_log(not_shown == 0 ? msg
                           : fmt::format("{} ({} similar messages in the last minute not shown)",
                                         msg, not_shown));
  return true;
}

}  // namespace ct::store
