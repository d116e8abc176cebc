// The committed gguf-py fixture (tests/fixtures/ggml_quant_blocks.bin, written by
// tools/make_quant_fixture.py): GGML blocks decoded, and for some types encoded, by gguf.quants,
// an implementation independent of ours. Read by the type-table tests (ggml_types_test.cc) and the
// decode-kernel tests (ops_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/ggml_types.h"

namespace ct::test {

struct QuantFixtureRecord {
  uint32_t kind = 0;  // 0: decode bytes -> floats, 1: encode floats -> bytes
  GgmlType type = GgmlType::F32;
  uint32_t n_blocks = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};

// Every record of the fixture; a missing or malformed file is a failed expectation naming it.
inline std::vector<QuantFixtureRecord> read_quant_fixture() {
  const std::string path = std::string(CT_FIXTURE_DIR) + "/ggml_quant_blocks.bin";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path
                         << " (regenerate with tools/make_quant_fixture.py)";
  auto u32 = [&] {
    uint32_t v = 0;
    in.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  char magic[4] = {};
  in.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "CTQF") << path;
  EXPECT_EQ(u32(), 1u) << path << ": version";
  const uint32_t n = u32();
  EXPECT_LE(n, 1000u) << path << ": record count";
  if (!in.good() || n > 1000) return {};
  std::vector<QuantFixtureRecord> recs(n);
  for (QuantFixtureRecord& r : recs) {
    r.kind = u32();
    r.type = static_cast<GgmlType>(u32());
    r.n_blocks = u32();
    const uint32_t n_bytes = u32(), n_floats = u32();
    EXPECT_TRUE(in.good() && n_bytes <= (1u << 24) && n_floats <= (1u << 24))
        << path << ": record sizes " << n_bytes << ", " << n_floats;
    if (!in.good() || n_bytes > (1u << 24) || n_floats > (1u << 24)) return {};
    r.bytes.resize(n_bytes);
    r.floats.resize(n_floats);
    in.read(reinterpret_cast<char*>(r.bytes.data()), (std::streamsize)r.bytes.size());
    in.read(reinterpret_cast<char*>(r.floats.data()), (std::streamsize)r.floats.size() * 4);
  }
  EXPECT_TRUE(in.good()) << path << " is truncated";
  return recs;
}

}  // namespace ct::test
