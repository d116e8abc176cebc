// The serialised form of a chunk record shared by the disk and Redis tiers: a checksummed header
// (magic, version, meta, per-layer row-group CRC32C table) and one interleaved slab per layer in
// which rows [a, b) of keys *and* values are one contiguous byte range.
//
// Header, little-endian (kFixedHeaderBytes = 64 fixed bytes, then three variable sections):
//   0  char[8] magic "CTKVCHNK"        32  u32 group_rows (rows per checksum group, 16)
//   8  u32 version (1)                 36  u32 header_crc: CRC32C of the whole header with
//  12  u32 header_bytes (all of it)            this field zeroed
//  16  u32 meta_json_bytes             40  u64 data_offset: byte offset of layer 0's slab
//  20  u32 arrays_bytes                48  u64 slab_stride: distance between layer slabs
//  24  u32 n_layer                     56  u64 total_bytes: size of the whole record
//  28  u32 n_groups (= ceil(n_tok / group_rows))
//  64  meta JSON: the scalar ChunkMeta fields plus tokens_len / order_len / scores_len (and
//      rank_params only when non-empty: an optional key, so version 1 still describes every
//      record; a reader that predates it ignores it, and never looks such a record up, since
//      rank_params is part of the chunk id)
//      arrays: tokens i32[tokens_len], order i32[order_len], scores f32[scores_len] (raw bits, so
//      NaN scores survive, which JSON could not carry)
//      crc table: u32[n_layer][n_groups], layer-major
//
// Slab of layer l (slab_bytes = n_tok * 2 * kv_row_bytes), at data_offset + l * slab_stride:
//   row j = K row j (kv_dim elements of meta.dtype) immediately followed by V row j; rows are in
//   ranking order, so the complement for ratio r, rows [n_sel, n_tok), is one range per layer.
// Checksums: CRC32C (crc32c.h) of each group of group_rows consecutive slab rows (the last group
// may be shorter). A partial read is widened to whole groups and every group read is verified;
// a group checksum covers K and V of its rows together. Readers take group_rows from the header,
// so records written with another group size (64 before) stay readable. 16 rows: a partial read
// of the complement [ceil(rN), N) then skips every whole group below ceil(rN), which for r = 0.15
// starts paying off at 101-token chunks (with 64 rows it took 421), at the cost of a CRC table of
// 4 bytes per 16 rows and layer (0.03% of an F16 slab at kv_dim 192).
// CRC32C rather than SHA-256: the job is catching media and transfer corruption, not tampering,
// and with SSE4.2 it costs a few percent of a read's time where SHA-256 (~0.5 GB/s) would cost
// more than an NVMe read of the block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store/chunk.h"

namespace ct::store {

inline constexpr char kRecordMagic[8] = {'C', 'T', 'K', 'V', 'C', 'H', 'N', 'K'};
inline constexpr uint32_t kRecordVersion = 1;
inline constexpr uint32_t kGroupRows = 16;
inline constexpr size_t kFixedHeaderBytes = 64;
// Upper bound on a header we agree to read, so a corrupt length cannot trigger a huge allocation.
inline constexpr size_t kMaxHeaderBytes = 256u << 20;
// Upper bound on n_tok, n_layer and kv_dim in a record (2^24): real values are far below it, and
// it keeps every size product (n_tok * kv_dim * 2 * 4 bytes, ...) far from overflowing 64 bits.
inline constexpr int32_t kMaxRecordDim = 1 << 24;

// Chunk ids name files and Redis keys: 1-200 characters from [A-Za-z0-9._-], not starting with
// '.' (temporary files start with '.').
bool is_valid_chunk_id(std::string_view id);

// Checks a meta's own consistency, which every reader relies on before indexing with it: a valid
// id, positive sizes within kMaxRecordDim, tokens/order/scores each of n_tok entries, order a
// permutation of [0, n_tok), a printable rank mode and finite alpha. Returns false and names the
// first bad field in *err. decode_header calls it, so no tier hands out a record that fails it.
bool check_meta(const ChunkMeta& m, std::string* err);
// Throws ct::Error naming the field when kv's meta fails check_meta or its blocks disagree with
// it. Every tier calls this in put().
void check_chunk(const ChunkKV& kv);

// Bytes of one K (or V) row: kv_dim * dtype size.
size_t kv_row_bytes(const ChunkMeta& m);
// Bytes of one interleaved slab row (K row then V row) and of a whole layer slab.
size_t slab_row_bytes(const ChunkMeta& m);
size_t slab_bytes(const ChunkMeta& m);
int n_row_groups(int n_tok, uint32_t group_rows = kGroupRows);

// Writes layer `layer` of kv as an interleaved slab of slab_bytes(kv.meta) bytes into dst.
void slab_pack(const ChunkKV& kv, int layer, uint8_t* dst);
// Splits n_rows interleaved rows at src into n_rows K rows at k_dst and V rows at v_dst.
void slab_unpack(const uint8_t* src, size_t n_rows, size_t kv_row, void* k_dst, void* v_dst);
// CRC32C of every row group of one packed slab; out has n_row_groups(meta.n_tok) entries.
void slab_group_crcs(const uint8_t* slab, const ChunkMeta& m, uint32_t* out);

// Where a record's pieces go, computed before anything is written.
struct RecordLayout {
  std::string meta_json;
  uint32_t arrays_bytes = 0;
  uint32_t header_bytes = 0;
  uint64_t data_offset = 0;  // header_bytes rounded up to `align`
  uint64_t slab_stride = 0;  // slab_bytes rounded up to `align`
  uint64_t total_bytes = 0;  // data_offset + n_layer * slab_stride
};
// align = 4096 for files (O_DIRECT-friendly, every slab starts on a page); 1 for Redis, where the
// slabs are separate values and only header_bytes and slab sizes matter.
RecordLayout plan_record(const ChunkMeta& m, uint64_t align);

// A decoded header.
struct RecordHeader {
  ChunkMeta meta;
  uint32_t group_rows = kGroupRows;
  int n_groups = 0;
  std::vector<uint32_t> group_crc;  // [n_layer][n_groups]
  uint32_t header_bytes = 0;
  uint64_t data_offset = 0;
  uint64_t slab_stride = 0;
  uint64_t total_bytes = 0;

  uint32_t crc(int layer, int group) const { return group_crc[(size_t)layer * n_groups + group]; }
  uint64_t slab_offset(int layer) const { return data_offset + (uint64_t)layer * slab_stride; }
};

// Serialises the header for `layout`; group_crc is [n_layer][n_groups] layer-major.
std::vector<uint8_t> encode_header(const RecordLayout& layout, const ChunkMeta& m,
                                   const std::vector<uint32_t>& group_crc);

// From the first kFixedHeaderBytes of a record: the total header length, or nullopt with *err
// set (bad magic, unknown version, implausible length).
std::optional<size_t> peek_header_bytes(const uint8_t* p, size_t n, std::string* err);
// Decodes and checks a whole header (lengths, header checksum, meta, layout consistency).
std::optional<RecordHeader> decode_header(const uint8_t* p, size_t n, std::string* err);

// The whole row groups covering rows [row_begin, row_end): groups [g_begin, g_end) span rows
// [row_lo, row_hi) (row_hi clipped to n_tok).
struct GroupSpan {
  int g_begin = 0, g_end = 0;
  int row_lo = 0, row_hi = 0;
};
GroupSpan covering_groups(const RecordHeader& h, int row_begin, int row_end);

// Verifies groups span.g_begin.. of `layer` against the slab bytes at buf (which start at row
// span.row_lo). On mismatch returns false and names the group in *err.
bool check_groups(const RecordHeader& h, int layer, const GroupSpan& span, const uint8_t* buf,
                  std::string* err);

// Throws ct::Error unless 0 <= layer < n_layer and 0 <= row_begin <= row_end <= n_tok.
void check_row_args(const ChunkMeta& m, int layer, int row_begin, int row_end);

// Logs one line "cachetune store: <msg>" to stderr (the tiers' corruption and I/O reports).
void store_log(const std::string& msg);
// store_log for a failure that can repeat on every request (a full disk, a Redis server that is
// down): the first message of a `key` is logged, later ones at most once a minute, each with the
// number of messages of that key not shown since. Returns true when this one was logged.
bool store_log_limited(const std::string& key, const std::string& msg);

}  // namespace ct::store
