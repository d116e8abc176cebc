// libFuzzer target: the chunk record reader shared by the disk file and the Redis value
// (store/record_format.h). Input: one flag byte, two u16 fields choosing a row range, then the
// record. With flag bit 0 set the header checksum is recomputed over the mutated header first, so
// the fuzzer reaches the field checks behind the CRC (a crafted record can carry a valid CRC).
// Checks: decode_header never crashes or over-reads; a decoded header's group spans cover the
// asked rows and stay inside the checksum table; check_groups reads only the slab bytes present.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "store/crc32c.h"
#include "store/record_format.h"

namespace {

using namespace ct::store;

void check_span(const RecordHeader& h, int row_begin, int row_end, const GroupSpan& s) {
  const bool ok = s.g_begin >= 0 && s.g_begin <= s.g_end && s.g_end <= h.n_groups &&
                  s.row_lo >= 0 && s.row_lo <= row_begin && s.row_hi >= row_end &&
                  s.row_hi <= h.meta.n_tok && s.row_lo <= s.row_hi;
  if (!ok) ct::fuzz::finding("covering_groups span does not cover the rows inside the table");
}

// Verifies the span of `layer` when its bytes are in the input, as the tiers do after a read.
void verify_layer(const RecordHeader& h, const uint8_t* rec, size_t n, int layer,
                  const GroupSpan& s) {
  const uint64_t row = slab_row_bytes(h.meta);
  uint64_t off = 0, len = 0, end = 0;
  if (__builtin_mul_overflow((uint64_t)layer, h.slab_stride, &off) ||
      __builtin_add_overflow(off, h.data_offset, &off) ||
      __builtin_add_overflow(off, (uint64_t)s.row_lo * row, &off) ||
      __builtin_mul_overflow((uint64_t)(s.row_hi - s.row_lo), row, &len) ||
      __builtin_add_overflow(off, len, &end) || end > n) {
    return;
  }
  std::string err;
  (void)check_groups(h, layer, s, rec + off, &err);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ct::fuzz::Bytes in(data, size);
  const uint8_t flags = in.take<uint8_t>();
  const uint16_t a = in.take<uint16_t>(), b = in.take<uint16_t>();
  // An exact-size copy, so ASan sees any read past the record's end.
  std::vector<uint8_t> rec(in.data(), in.data() + in.size());
  std::string err;
  const std::optional<size_t> hb = peek_header_bytes(rec.data(), rec.size(), &err);
  if (!hb) return 0;
  if ((flags & 1) && *hb <= rec.size()) {
    std::memset(&rec[36], 0, 4);  // header_crc at offset 36, zeroed while it is computed
    const uint32_t crc = crc32c(rec.data(), *hb);
    std::memcpy(&rec[36], &crc, 4);
  }
  const std::optional<RecordHeader> h = decode_header(rec.data(), rec.size(), &err);
  if (!h) return 0;
  if (h->group_crc.size() != (size_t)h->meta.n_layer * h->n_groups) {
    ct::fuzz::finding("checksum table size disagrees with n_layer x n_groups");
  }
  const int n_tok = h->meta.n_tok;
  const int row_begin = (int)(a % ((uint32_t)n_tok + 1));
  const int row_end = row_begin + (int)(b % ((uint32_t)(n_tok - row_begin) + 1));
  const GroupSpan span = covering_groups(*h, row_begin, row_end);
  check_span(*h, row_begin, row_end, span);
  const GroupSpan all = covering_groups(*h, 0, n_tok);
  check_span(*h, 0, n_tok, all);
  // At most a few layers: n_layer can be 2^24 while the input holds far fewer slabs.
  for (int l = 0; l < h->meta.n_layer && l < 8; ++l) {
    verify_layer(*h, rec.data(), rec.size(), l, span);
    verify_layer(*h, rec.data(), rec.size(), l, all);
  }
  return 0;
}
