// Tests for the GGUF reader and writer: round trips of every metadata and tensor type in versions
// 2 and 3, alignment, the tiny test model, and malformed files, each checked for an error message
// that names the file and the problem. Ends with a check of the real SmolLM2 file when present.
#include "support/errors.h"
#include "model/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (!std::isalnum((unsigned char)c)) c = '_';
    }
    dir_ = fs::path(::testing::TempDir()) / ("ct_gguf_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  const fs::path& path() const { return dir_; }

 private:
  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), (std::streamsize)bytes.size());
}

// Builds GGUF byte streams by hand for malformed-file tests.
struct Bytes {
  std::string b;
  Bytes& u32(uint32_t v) {
    b.append(reinterpret_cast<const char*>(&v), 4);
    return *this;
  }
  Bytes& u64(uint64_t v) {
    b.append(reinterpret_cast<const char*>(&v), 8);
    return *this;
  }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Bytes& raw(const std::string& s) {
    b += s;
    return *this;
  }
  Bytes& pad(size_t a) {
    b.append((a - b.size() % a) % a, '\0');
    return *this;
  }
};

Bytes header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  Bytes x;
  x.u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  return x;
}

// The ct::Error message of f(), or a marker when it did not throw one.
using test::error_of;

std::string open_error(const std::string& path) {
  return error_of([&] { GgufFile::open(path); });
}

::testing::AssertionResult contains_all(const std::string& msg,
                                        const std::vector<std::string>& parts) {
  for (const std::string& p : parts) {
    if (msg.find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << p << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// Opening `bytes` as a file must fail with a message naming the file and containing `parts`.
::testing::AssertionResult fails_with(const ScratchDir& dir, const std::string& bytes,
                                      std::vector<std::string> parts) {
  const std::string path = dir.file("bad.gguf");
  write_bytes(path, bytes);
  parts.insert(parts.begin(), path + ": ");
  return contains_all(open_error(path), parts);
}

GgufValue scalar(GgufValueType t, int64_t i) {
  GgufValue v;
  v.type = t;
  v.i = i;
  return v;
}

GgufValue float_value(GgufValueType t, double f) {
  GgufValue v;
  v.type = t;
  v.f = f;
  return v;
}

GgufValue int_array(GgufValueType et, std::vector<int64_t> xs) {
  GgufValue v;
  v.type = GgufValueType::ARRAY;
  v.elem_type = et;
  v.arr_i = std::move(xs);
  return v;
}

void expect_same_value(const GgufValue& want, const GgufValue& got, const std::string& where) {
  ASSERT_EQ(want.type, got.type) << where;
  switch (want.type) {
    case GgufValueType::ARRAY:
      ASSERT_EQ(want.elem_type, got.elem_type) << where;
      ASSERT_EQ(want.array_size(), got.array_size()) << where;
      EXPECT_EQ(want.arr_i, got.arr_i) << where;
      EXPECT_EQ(want.arr_f, got.arr_f) << where;
      EXPECT_EQ(want.arr_s, got.arr_s) << where;
      for (size_t k = 0; k < want.arr.size(); ++k) {
        expect_same_value(want.arr[k], got.arr[k], where + "[" + std::to_string(k) + "]");
      }
      break;
    case GgufValueType::STRING:
      EXPECT_EQ(want.s, got.s) << where;
      break;
    case GgufValueType::FLOAT32:
    case GgufValueType::FLOAT64:
      EXPECT_EQ(want.f, got.f) << where;
      break;
    case GgufValueType::UINT64:
      EXPECT_EQ(want.u, got.u) << where;
      break;
    default:
      EXPECT_EQ(want.i, got.i) << where;
      break;
  }
}

class GgufVersionTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  ScratchDir dir_;
};

TEST_P(GgufVersionTest, EveryValueTypeRoundTrips) {
  constexpr uint64_t kBigU64 = std::numeric_limits<uint64_t>::max() - 5;  // above INT64_MAX
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  GgufWriter w;
  w.set_value("s.u8", scalar(GgufValueType::UINT8, 200));
  w.set_value("s.i8", scalar(GgufValueType::INT8, -100));
  w.set_value("s.u16", scalar(GgufValueType::UINT16, 60000));
  w.set_value("s.i16", scalar(GgufValueType::INT16, -30000));
  w.set_u32("s.u32", 4000000000u);
  w.set_i32("s.i32", -2000000000);
  w.set_u64("s.u64", kBigU64);
  w.set_value("s.u64small", scalar(GgufValueType::UINT64, 12345));  // given in `i` only
  w.set_value("s.i64", scalar(GgufValueType::INT64, kI64Min));
  w.set_f32("s.f32", 1.5f);
  w.set_value("s.f64", float_value(GgufValueType::FLOAT64, 1e300));
  w.set_bool("s.bool", true);
  w.set_str("s.str", std::string("h\xc3\xa9llo\0x", 8));  // UTF-8 and an embedded NUL

  w.set_value("a.u8", int_array(GgufValueType::UINT8, {0, 255}));
  w.set_value("a.i8", int_array(GgufValueType::INT8, {-128, 127}));
  w.set_value("a.u16", int_array(GgufValueType::UINT16, {0, 65535}));
  w.set_value("a.i16", int_array(GgufValueType::INT16, {-32768, 32767}));
  w.set_value("a.u32", int_array(GgufValueType::UINT32, {0, 4294967295}));
  w.set_i32_array("a.i32", {std::numeric_limits<int32_t>::min(), 7});
  w.set_value("a.u64", int_array(GgufValueType::UINT64, {1, (int64_t)kBigU64}));
  w.set_value("a.i64", int_array(GgufValueType::INT64, {kI64Min, -1}));
  w.set_value("a.bool", int_array(GgufValueType::BOOL, {1, 0, 1}));
  w.set_f32_array("a.f32", {0.1f, -2.5f});
  GgufValue f64s;
  f64s.type = GgufValueType::ARRAY;
  f64s.elem_type = GgufValueType::FLOAT64;
  f64s.arr_f = {1e-300, -3.5};
  w.set_value("a.f64", f64s);
  w.set_str_array("a.str", {"a", "", "\xc4\xa0the\xc4\x8a"});
  w.set_str_array("a.empty", {});

  // [[1, 2, 3] int32, ["x", "y"] string, [] float64, [[7] uint8] array]
  GgufValue nested;
  nested.type = GgufValueType::ARRAY;
  nested.elem_type = GgufValueType::ARRAY;
  nested.arr.push_back(int_array(GgufValueType::INT32, {1, 2, 3}));
  GgufValue strs;
  strs.type = GgufValueType::ARRAY;
  strs.elem_type = GgufValueType::STRING;
  strs.arr_s = {"x", "y"};
  nested.arr.push_back(strs);
  GgufValue empty_f;
  empty_f.type = GgufValueType::ARRAY;
  empty_f.elem_type = GgufValueType::FLOAT64;
  nested.arr.push_back(empty_f);
  GgufValue deep;
  deep.type = GgufValueType::ARRAY;
  deep.elem_type = GgufValueType::ARRAY;
  deep.arr.push_back(int_array(GgufValueType::UINT8, {7}));
  nested.arr.push_back(deep);
  w.set_value("a.nested", nested);

  const std::string path = dir_.file("kv.gguf");
  w.write(path, GetParam());
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), GetParam());
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), 27u);
  EXPECT_TRUE(f->tensors().empty());

  // Deep comparison against the values handed to the writer.
  expect_same_value(nested, *f->find("a.nested"), "a.nested");
  expect_same_value(int_array(GgufValueType::BOOL, {1, 0, 1}), *f->find("a.bool"), "a.bool");
  expect_same_value(int_array(GgufValueType::UINT64, {1, (int64_t)kBigU64}), *f->find("a.u64"),
                    "a.u64");
  expect_same_value(f64s, *f->find("a.f64"), "a.f64");

  EXPECT_EQ(f->get_int("s.u8"), 200);
  EXPECT_EQ(f->get_int("s.i8"), -100);
  EXPECT_EQ(f->get_int("s.u16"), 60000);
  EXPECT_EQ(f->get_int("s.i16"), -30000);
  EXPECT_EQ(f->get_int("s.u32"), 4000000000);
  EXPECT_EQ(f->get_int("s.i32"), -2000000000);
  EXPECT_EQ(f->get_int("s.i64"), kI64Min);
  EXPECT_EQ(f->get_int("s.u64small"), 12345);
  EXPECT_EQ(f->find("s.u64")->type, GgufValueType::UINT64);
  EXPECT_EQ(f->find("s.u64")->u, kBigU64);
  EXPECT_TRUE(contains_all(error_of([&] { f->get_int("s.u64"); }),
                           {path, "'s.u64'", std::to_string(kBigU64), "expected at most"}));
  EXPECT_THROW(f->get_float("s.u64"), Error);  // integers are not floats (strict, as llama.cpp)
  EXPECT_EQ(f->get_float("s.f32"), 1.5);
  EXPECT_EQ(f->find("s.f32")->type, GgufValueType::FLOAT32);
  EXPECT_EQ(f->get_float("s.f64"), 1e300);
  EXPECT_THROW(f->get_float("s.i16"), Error);
  EXPECT_TRUE(f->get_bool("s.bool", false));
  EXPECT_EQ(f->get_int("s.bool"), 1);
  EXPECT_EQ(f->get_string("s.str"), std::string("h\xc3\xa9llo\0x", 8));

  EXPECT_EQ(f->get_int_array("a.u8"), (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(f->get_int_array("a.i8"), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f->get_int_array("a.u16"), (std::vector<int64_t>{0, 65535}));
  EXPECT_EQ(f->get_int_array("a.i16"), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(f->get_int_array("a.u32"), (std::vector<int64_t>{0, 4294967295}));
  EXPECT_EQ(f->get_int_array("a.i32"), (std::vector<int64_t>{-2147483648LL, 7}));
  EXPECT_EQ(f->get_int_array("a.i64"), (std::vector<int64_t>{kI64Min, -1}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_int_array("a.u64"); }),
                           {"'a.u64'", "element 1", std::to_string(kBigU64)}));
  EXPECT_EQ(f->get_float_array("a.f32"), (std::vector<double>{0.1f, -2.5f}));
  EXPECT_EQ(f->get_float_array("a.f64"), (std::vector<double>{1e-300, -3.5}));
  EXPECT_EQ(f->get_string_array("a.str"),
            (std::vector<std::string>{"a", "", "\xc4\xa0the\xc4\x8a"}));
  EXPECT_TRUE(f->get_string_array("a.empty").empty());
  EXPECT_EQ(f->find("a.empty")->elem_type, GgufValueType::STRING);

  const GgufValue& n = *f->find("a.nested");
  ASSERT_EQ(n.array_size(), 4u);
  EXPECT_EQ(n.arr[0].arr_i, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(n.arr[1].arr_s, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(n.arr[2].elem_type, GgufValueType::FLOAT64);
  EXPECT_EQ(n.arr[2].array_size(), 0u);
  ASSERT_EQ(n.arr[3].array_size(), 1u);
  EXPECT_EQ(n.arr[3].arr[0].elem_type, GgufValueType::UINT8);
  EXPECT_EQ(n.arr[3].arr[0].arr_i, (std::vector<int64_t>{7}));
}

TEST_P(GgufVersionTest, EveryTensorTypeRoundTrips) {
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  struct Want {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<float> values;
  };
  std::vector<Want> wants;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_1,
                     GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    Want want{"w." + ggml_type_name(t), t, {256, 3}, std::vector<float>(256 * 3)};
    for (float& v : want.values) v = dist(rng);
    wants.push_back(std::move(want));
  }
  wants.push_back({"cube", GgmlType::F32, {32, 2, 2}, std::vector<float>(128, 0.5f)});
  wants.push_back({"vec4d", GgmlType::F16, {3, 1, 1, 2}, {1, 2, 3, 4, 5, 6}});
  GgufWriter w;
  w.set_str("general.architecture", "test");
  for (const Want& x : wants) w.add_tensor(x.name, x.type, x.ne, x.values.data());
  const std::string unknown_bytes = "12345678";
  w.add_tensor_raw("unknown", 99, {10}, unknown_bytes.data(), unknown_bytes.size());
  // Q8_K is a known ggml type (llama.cpp's activation format) that files do not carry as weights
  // and we cannot decode: 256 elements, 292 bytes.
  const std::string q8k(292, '\x11');
  w.add_tensor_raw("q8k", static_cast<uint32_t>(GgmlType::Q8_K), {256}, q8k.data(), q8k.size());

  const std::string path = dir_.file("tensors.gguf");
  w.write(path, GetParam());
  const auto f = GgufFile::open(path);
  ASSERT_EQ(f->tensors().size(), wants.size() + 2);
  for (size_t k = 0; k < wants.size(); ++k) {
    const Want& x = wants[k];
    const GgufTensorInfo& t = f->tensor(x.name);
    EXPECT_EQ(&t, &f->tensors()[k]) << "file order is kept";
    EXPECT_EQ(t.type, x.type) << x.name;
    EXPECT_EQ(t.ne, x.ne) << x.name;
    const int64_t n = (int64_t)x.values.size();
    EXPECT_EQ(t.n_elements(), n) << x.name;
    EXPECT_EQ(t.n_rows(), n / x.ne[0]) << x.name;
    ASSERT_EQ(t.nbytes, ggml_row_bytes(x.type, x.ne[0]) * (size_t)t.n_rows()) << x.name;
    EXPECT_EQ(t.offset % 32, 0u) << x.name;
    std::vector<uint8_t> packed(t.nbytes);
    ggml_from_f32(x.type, x.values.data(), packed.data(), n);
    EXPECT_EQ(std::memcmp(packed.data(), t.data, t.nbytes), 0) << x.name;
    std::vector<float> back((size_t)n);
    ggml_to_f32(t.type, t.data, back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // 2- and 3-bit K-quants of N(0, 1) values err by up to a third of the block's largest.
      const bool low_bits = x.type == GgmlType::Q2_K || x.type == GgmlType::Q3_K;
      ASSERT_NEAR(back[i], x.values[i], low_bits ? 1.5 : 0.5) << x.name << " element " << i;
    }
  }
  const GgufTensorInfo& u = f->tensor("unknown");
  EXPECT_FALSE(ggml_type_supported(u.type));
  EXPECT_EQ(ggml_type_name(u.type), "unknown(99)");
  EXPECT_EQ(u.nbytes, 0u);
  EXPECT_EQ(u.n_elements(), 10);
  EXPECT_EQ(std::memcmp(u.data, unknown_bytes.data(), unknown_bytes.size()), 0);
  const GgufTensorInfo& k = f->tensor("q8k");
  EXPECT_EQ(k.type, GgmlType::Q8_K);
  EXPECT_FALSE(ggml_type_supported(k.type));
  EXPECT_EQ(k.nbytes, 0u);
}

TEST_P(GgufVersionTest, VersionsDifferOnlyInTheVersionField) {
  GgufWriter w;
  w.set_u32("k", 1);
  const float x[32] = {1.0f};
  w.add_tensor("t", GgmlType::Q8_0, {32}, x);
  w.write(dir_.file("v.gguf"), GetParam());
  w.write(dir_.file("v3.gguf"), 3);
  std::string a = read_bytes(dir_.file("v.gguf"));
  const std::string b = read_bytes(dir_.file("v3.gguf"));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ((uint8_t)a[4], GetParam());
  a[4] = 3;
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(V2V3, GgufVersionTest, ::testing::Values(2u, 3u),
                         [](const auto& info) { return info.param == 2 ? "v2" : "v3"; });

class GgufTest : public ::testing::Test {
 protected:
  ScratchDir dir_;
};

TEST_F(GgufTest, AlignmentIsHonoured) {
  // Several alignments, and key padding so the end of the tensor infos falls at different points
  // relative to each alignment; a reader that rounded the data start wrongly would misplace data.
  for (uint32_t align : {1u, 8u, 64u, 256u}) {
    for (int pad = 0; pad < 8; ++pad) {
      SCOPED_TRACE("alignment " + std::to_string(align) + " pad " + std::to_string(pad));
      GgufWriter w;
      w.set_str("pad", std::string(pad * 7, 'p'));
      w.set_alignment(align);
      const float a[3] = {1.0f, 2.0f, 3.0f};
      float b[32];
      for (int j = 0; j < 32; ++j) b[j] = (float)j;
      w.add_tensor("a", GgmlType::F32, {3}, a);
      w.add_tensor("b", GgmlType::Q8_0, {32}, b);
      w.add_tensor("c", GgmlType::F32, {3}, a);
      const std::string path = dir_.file("aligned.gguf");
      w.write(path);
      const auto f = GgufFile::open(path);
      EXPECT_EQ(f->alignment(), align);
      EXPECT_EQ(f->get_int("general.alignment"), align);
      for (const GgufTensorInfo& t : f->tensors()) {
        EXPECT_EQ(t.offset % align, 0u) << t.name;
        // The mapping is page-aligned, so the absolute address shows the data section start.
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % align, 0u) << t.name;
      }
      float back[32];
      ggml_to_f32(GgmlType::F32, f->tensor("c").data, back, 3);
      EXPECT_EQ(back[2], 3.0f);
      ggml_to_f32(GgmlType::Q8_0, f->tensor("b").data, back, 32);
      EXPECT_NEAR(back[31], 31.0f, 0.2f);
    }
  }
}

TEST_F(GgufTest, DefaultAlignmentIs32AndBadAlignmentsAreRejected) {
  const std::string path = dir_.file("a.gguf");
  GgufWriter w;
  const float x[5] = {};
  w.add_tensor("x", GgmlType::F32, {5}, x);
  w.add_tensor("y", GgmlType::F32, {5}, x);
  w.write(path);
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->tensor("y").offset, 32u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor("y").data) % 32, 0u);

  for (uint32_t bad : {0u, 48u}) {
    GgufWriter b;
    b.set_u32("general.alignment", bad);
    b.write(path);
    EXPECT_TRUE(contains_all(
        open_error(path), {path, "'general.alignment' is " + std::to_string(bad), "power of two"}));
  }
  GgufWriter s;
  s.set_str("general.alignment", "32");
  s.write(path);
  EXPECT_TRUE(contains_all(open_error(path),
                           {"key 'general.alignment' has type string, expected an integer"}));
  EXPECT_TRUE(contains_all(error_of([] { GgufWriter().set_alignment(24); }), {"24"}));
}

TEST_F(GgufTest, RejectsBadMagicAndVersions) {
  EXPECT_TRUE(fails_with(dir_, Bytes().u32(0x12345678).u32(3).u64(0).u64(0).b,
                         {"bad magic 0x12345678, expected 'GGUF' (0x46554747)"}));
  EXPECT_TRUE(fails_with(dir_, header(1, 0, 0).b, {"GGUF version 1 is not supported"}));
  EXPECT_TRUE(
      fails_with(dir_, header(99, 0, 0).b, {"unsupported GGUF version 99 (expected 2 or 3)"}));
  EXPECT_TRUE(fails_with(dir_, header(0x03000000, 0, 0).b, {"0x03000000", "big-endian"}));
  EXPECT_TRUE(fails_with(
      dir_, "", {"truncated while reading header (need 4 bytes at offset 0, file has 0)"}));
  // Minimal valid files of both versions open.
  for (uint32_t v : {2u, 3u}) {
    write_bytes(dir_.file("ok.gguf"), header(v, 0, 0).b);
    EXPECT_EQ(GgufFile::open(dir_.file("ok.gguf"))->version(), v);
  }
}

TEST_F(GgufTest, RejectsMissingFilesAndDirectories) {
  EXPECT_TRUE(contains_all(open_error(dir_.file("nope.gguf")),
                           {dir_.file("nope.gguf"), "cannot open", "No such file"}));
  EXPECT_TRUE(contains_all(open_error(dir_.path().string()), {"not a regular file"}));
}

// A small model-like file used by the truncation tests; the last tensor's size is a multiple of
// the alignment so that the file ends exactly with tensor data.
std::string write_small_model(const std::string& path) {
  GgufWriter w;
  w.set_str("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_str_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  const std::vector<float> x(64, 0.25f);
  w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, {32, 2}, x.data());
  w.add_tensor("output_norm.weight", GgmlType::F32, {64}, x.data());
  w.write(path);
  return read_bytes(path);
}

TEST_F(GgufTest, TruncationAtEachPointIsReported) {
  const std::string full = write_small_model(dir_.file("full.gguf"));
  ASSERT_NO_THROW(GgufFile::open(dir_.file("full.gguf")));
  auto cut = [&](size_t n) { return full.substr(0, n); };

  EXPECT_TRUE(fails_with(
      dir_, cut(10), {"truncated while reading header (need 8 bytes at offset 8, file has 10)"}));

  const size_t arch = full.find("general.architecture");
  EXPECT_TRUE(
      fails_with(dir_, cut(arch + 5),
                 {"truncated while reading the name of key #0: string length 20 at offset " +
                  std::to_string(arch - 8) + " exceeds the 5 bytes left"}));

  const size_t value = full.find("llama.block_count") + 17 + 4;  // after the name and type code
  EXPECT_TRUE(
      fails_with(dir_, cut(value + 2),
                 {"truncated while reading key 'llama.block_count' (need 4 bytes at offset " +
                  std::to_string(value) + ", file has " + std::to_string(value + 2) + ")"}));

  const size_t tokens = full.find("tokenizer.ggml.tokens") + 21 + 4 + 4 + 8;  // first element
  EXPECT_TRUE(
      fails_with(dir_, cut(tokens + 3), {"truncated while reading key 'tokenizer.ggml.tokens'"}));

  const size_t info = full.find("blk.0.attn_q.weight") + 19;  // n_dims follows the name
  EXPECT_TRUE(fails_with(
      dir_, cut(info + 2),
      {"truncated while reading tensor info 'blk.0.attn_q.weight' (need 4 bytes at offset " +
       std::to_string(info) + ", file has " + std::to_string(info + 2) + ")"}));

  EXPECT_TRUE(fails_with(dir_, cut(full.size() - 1),
                         {"tensor 'output_norm.weight' (256 bytes",
                          "extends past the end of the "
                          "file"}));
}

TEST_F(GgufTest, EveryProperPrefixFailsCleanly) {
  const std::string full = write_small_model(dir_.file("full.gguf"));
  const std::string path = dir_.file("prefix.gguf");
  for (size_t n = 0; n < full.size(); ++n) {
    write_bytes(path, full.substr(0, n));
    const std::string m = open_error(path);
    ASSERT_EQ(m.rfind(path + ": ", 0), 0u) << "prefix " << n << ": " << m;
    ASSERT_TRUE(m.find("truncated") != std::string::npos ||
                m.find("past the end of the file") != std::string::npos)
        << "prefix " << n << ": " << m;
  }
}

TEST_F(GgufTest, AbsurdLengthsAndCountsAreRejectedWithoutAllocating) {
  const uint64_t huge = uint64_t{1} << 62;
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).str("k").u32(8).u64(1000000000000).raw("abc").b,
                         {"truncated while reading key 'k': string length 1000000000000",
                          "exceeds the 3 bytes left in the file"}));
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).u64(huge).raw("key").b,
                         {"the name of key #0: string length " + std::to_string(huge)}));
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).str("k").u32(9).u32(4).u64(huge).u32(1).b,
                         {"key 'k'", "array of " + std::to_string(huge) + " uint32 elements",
                          "cannot fit in the 4 bytes left"}));
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).str("k").u32(9).u32(8).u64(1 << 20).str("a").b,
                         {"array of 1048576 string elements"}));
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).str("k").u32(9).u32(9).u64(3).u32(0).u64(0).b,
                         {"array of 3 array elements"}));
  // Absurd counts stop at the first entry the file cannot hold.
  EXPECT_TRUE(fails_with(dir_, header(3, 0, uint64_t{1} << 50).str("k").u32(4).u32(1).b,
                         {"truncated while reading the name of key #1 (need 8 bytes"}));
  EXPECT_TRUE(fails_with(dir_, header(3, huge, 0).b,
                         {"truncated while reading the name of tensor info #0 (need 8 bytes"}));
  // Tensor dimensions whose product overflows.
  EXPECT_TRUE(fails_with(
      dir_,
      header(3, 1, 0).str("t").u32(2).u64(uint64_t{1} << 40).u64(uint64_t{1} << 40).u32(0).u64(0).b,
      {"tensor 't' has more elements than fit in 64 bits"}));
}

TEST_F(GgufTest, RejectsUnknownTypesDuplicatesAndDeepNesting) {
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).str("k").u32(13).u32(0).b,
                         {"key 'k' has unknown value type 13", "(expected 0..12)"}));
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 1).str("k").u32(9).u32(77).u64(0).b,
                         {"unknown array element type 77", "key 'k'"}));
  EXPECT_TRUE(fails_with(dir_, header(3, 0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2).b,
                         {"duplicate key 'k'"}));
  Bytes nest = header(3, 0, 1).str("deep").u32(9);
  for (int d = 0; d < 20; ++d) nest.u32(9).u64(1);
  EXPECT_TRUE(fails_with(dir_, nest.b, {"arrays nested more than 16 deep", "key 'deep'"}));

  Bytes dup = header(3, 2, 0);
  for (int k = 0; k < 2; ++k) dup.str("t").u32(1).u64(8).u32(0).u64(0);
  dup.pad(32).raw(std::string(32, '\0'));
  EXPECT_TRUE(fails_with(dir_, dup.b, {"duplicate tensor 't'"}));
}

// One F32 tensor "t" with the given dims, type code and offset, followed by 64 data bytes.
std::string one_tensor(std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
  Bytes x = header(3, 1, 0).str("t").u32((uint32_t)ne.size());
  for (uint64_t d : ne) x.u64(d);
  x.u32(type).u64(offset).pad(32).raw(std::string(64, '\0'));
  return x.b;
}

TEST_F(GgufTest, ValidatesTensorPlacementAndShape) {
  EXPECT_NO_THROW({
    write_bytes(dir_.file("ok.gguf"), one_tensor({16}, 0, 0));
    GgufFile::open(dir_.file("ok.gguf"));
  });
  EXPECT_TRUE(
      fails_with(dir_, one_tensor({16}, 0, 4),
                 {"tensor 't' has data offset 4, expected a multiple of the alignment 32"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({17}, 0, 0),
                         {"tensor 't' (68 bytes at offset 0 of the data section, which starts at",
                          "extends past the end of the file"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({16}, 0, 32), {"tensor 't'", "past the end"}));
  // Unknown type codes are accepted, but an offset beyond the file is still an error.
  EXPECT_NO_THROW({
    write_bytes(dir_.file("ok.gguf"), one_tensor({16}, 99, 32));
    GgufFile::open(dir_.file("ok.gguf"));
  });
  EXPECT_TRUE(
      fails_with(dir_, one_tensor({16}, 99, uint64_t{1} << 40), {"tensor 't'", "past the end"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({16}, 0, ~uint64_t{0} - 31), {"past the end"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({1, 1, 1, 1, 1}, 0, 0),
                         {"tensor 't' has 5 dimensions, expected 1..4"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({}, 0, 0), {"tensor 't' has 0 dimensions"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({33}, 3, 0),
                         {"tensor 't' of type q4_1 has row length 33, expected a multiple of the "
                          "block size 32"}));
  EXPECT_TRUE(fails_with(dir_, one_tensor({~uint64_t{0}}, 0, 0), {"dimension 0", "too large"}));
}

TEST_F(GgufTest, GettersReportMissingAndWrongTypedKeys) {
  GgufWriter w;
  w.set_str("name", "x");
  w.set_u32("count", 7);
  w.set_i32_array("ids", {1, 2});
  w.set_str_array("words", {"a"});
  w.set_f32("eps", 0.5f);
  const std::string path = dir_.file("keys.gguf");
  w.write(path);
  const auto f = GgufFile::open(path);

  const std::string missing = "missing required key 'llama.embedding_length'";
  EXPECT_TRUE(contains_all(error_of([&] { f->get_int("llama.embedding_length"); }),
                           {path + ": " + missing}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_float("llama.embedding_length"); }), {missing}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_string("llama.embedding_length"); }), {missing}));
  EXPECT_TRUE(
      contains_all(error_of([&] { f->get_string_array("llama.embedding_length"); }), {missing}));
  EXPECT_TRUE(
      contains_all(error_of([&] { f->get_int_array("llama.embedding_length"); }), {missing}));
  EXPECT_TRUE(
      contains_all(error_of([&] { f->get_float_array("llama.embedding_length"); }), {missing}));
  EXPECT_EQ(f->get_int("absent", 42), 42);
  EXPECT_EQ(f->get_float("absent", 2.5), 2.5);
  EXPECT_EQ(f->get_bool("absent", true), true);
  EXPECT_EQ(f->get_string("absent", "dflt"), "dflt");
  EXPECT_FALSE(f->has("absent"));
  EXPECT_EQ(f->find("absent"), nullptr);

  EXPECT_EQ(f->get_int("count", 1), 7);
  EXPECT_EQ(f->get_string("name", "dflt"), "x");
  EXPECT_TRUE(contains_all(error_of([&] { f->get_int("name"); }),
                           {path + ": key 'name' has type string, expected an integer"}));
  // A default does not hide a wrong type.
  EXPECT_TRUE(contains_all(error_of([&] { f->get_int("name", 1); }), {"expected an integer"}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_float("name"); }),
                           {"key 'name' has type string, expected a float"}));
  // An integer is not taken for a float: a corrupted type tag would turn a float's bits into a
  // plausible-looking integer.
  EXPECT_TRUE(contains_all(error_of([&] { f->get_float("count"); }),
                           {"key 'count' has type uint32, expected a float"}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_bool("count", false); }),
                           {"key 'count' has type uint32, expected a bool"}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_string("count"); }),
                           {"key 'count' has type uint32, expected a string"}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_string_array("ids"); }),
                           {"key 'ids' has type array of int32, expected an array of strings"}));
  EXPECT_TRUE(
      contains_all(error_of([&] { f->get_int_array("words"); }),
                   {"key 'words' has type array of string, expected an array of integers"}));
  EXPECT_TRUE(
      contains_all(error_of([&] { f->get_float_array("ids"); }), {"expected an array of floats"}));
  EXPECT_TRUE(contains_all(error_of([&] { f->get_int("ids"); }),
                           {"key 'ids' has type array of int32, expected an integer"}));
  EXPECT_EQ(f->get_float("eps"), 0.5);
  EXPECT_EQ(f->get_int_array("ids"), (std::vector<int64_t>{1, 2}));
}

TEST_F(GgufTest, AbsentTensorIsNamed) {
  const std::string path = dir_.file("m.gguf");
  write_small_model(path);
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  EXPECT_NE(f->find_tensor("output_norm.weight"), nullptr);
  EXPECT_TRUE(contains_all(error_of([&] { f->tensor("output.weight"); }),
                           {path + ": missing tensor 'output.weight' (the file has 2 tensors)"}));
}

TEST_F(GgufTest, WriterPublishesAtomicallyAndReportsFailures) {
  const std::string path = dir_.file("atomic.gguf");
  GgufWriter w;
  w.set_u32("k", 1);
  w.write(path);
  w.set_u32("k", 2);  // replaces, does not duplicate
  w.write(path);
  EXPECT_EQ(GgufFile::open(path)->get_int("k"), 2);
  EXPECT_EQ(GgufFile::open(path)->metadata().size(), 1u);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u) << "no temporary files are left behind";

  const std::string bad = dir_.file("no/such/dir/x.gguf");
  EXPECT_TRUE(contains_all(error_of([&] { w.write(bad); }), {bad, "cannot create"}));
  EXPECT_TRUE(contains_all(error_of([&] { w.write(path, 1); }), {path, "not 1"}));
  const float x[33] = {};
  EXPECT_TRUE(contains_all(error_of([&] { w.add_tensor("q", GgmlType::Q4_0, {33}, x); }),
                           {"'q'", "q4_0", "33"}));
}

TEST_F(GgufTest, RandomCorruptionNeverCrashes) {
  // Corrupts bytes of the header/metadata region of a tiny model; each open must either succeed
  // or throw ct::Error (run under ASan/UBSan, this also checks for out-of-bounds reads).
  test::TinyModelOptions o;
  o.n_layer = 1;
  o.weight_type = GgmlType::Q4_0;
  const std::string clean = read_bytes(test::write_tiny_model(dir_.file("tiny.gguf"), o));
  const std::string path = dir_.file("fuzz.gguf");
  std::mt19937 rng(99);
  int opened = 0, rejected = 0;
  for (int it = 0; it < 400; ++it) {
    std::string b = clean;
    const size_t region = std::min<size_t>(b.size(), 8192);
    const int n_mut = 1 + (int)(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      const size_t pos = rng() % region;
      // Mostly flips of high bits, which turn lengths and counts into huge values.
      b[pos] = (rng() % 2) ? (char)(b[pos] ^ (1 << (rng() % 8))) : (char)rng();
    }
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    write_bytes(path, b);
    try {
      GgufFile::open(path);
      ++opened;
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 50);
  EXPECT_GT(opened, 10);  // most mutations of token text or values are still well-formed
}

TEST_F(GgufTest, OpenMemoryParsesLikeOpenAndNamesTheImage) {
  // The from-memory route (the fuzz targets) runs the same parser as the mapped file: same
  // metadata, same tensors, data pointing into the caller's bytes, same checks.
  test::TinyModelOptions o;
  o.n_layer = 1;
  o.weight_type = GgmlType::Q8_0;
  const std::string path = test::write_tiny_model(dir_.file("tiny.gguf"), o);
  const std::string bytes = read_bytes(path);
  const auto mapped = GgufFile::open(path);
  const auto mem = GgufFile::open_memory(bytes.data(), bytes.size(), "image.gguf");
  EXPECT_EQ(mem->path(), "image.gguf");
  EXPECT_EQ(mem->version(), mapped->version());
  EXPECT_EQ(mem->file_size(), bytes.size());
  EXPECT_EQ(mem->metadata().size(), mapped->metadata().size());
  EXPECT_EQ(mem->get_string_array("tokenizer.ggml.tokens"),
            mapped->get_string_array("tokenizer.ggml.tokens"));
  ASSERT_EQ(mem->tensors().size(), mapped->tensors().size());
  for (size_t i = 0; i < mem->tensors().size(); ++i) {
    const GgufTensorInfo& a = mem->tensors()[i];
    const GgufTensorInfo& b = mapped->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.ne, b.ne);
    ASSERT_EQ(a.nbytes, b.nbytes) << a.name;
    const auto* base = reinterpret_cast<const uint8_t*>(bytes.data());
    EXPECT_TRUE(a.data >= base && a.data + a.nbytes <= base + bytes.size()) << a.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << a.name;
  }
  // One byte short of the last tensor's data (the writer pads after it, so cut inside the data).
  const GgufTensorInfo& last = mem->tensors().back();
  const size_t last_end =
      (size_t)(last.data - reinterpret_cast<const uint8_t*>(bytes.data())) + last.nbytes;
  const std::string cut = bytes.substr(0, last_end - 1);
  try {
    GgufFile::open_memory(cut.data(), cut.size(), "image.gguf");
    ADD_FAILURE() << "a truncated image opened";
  } catch (const Error& e) {
    EXPECT_TRUE(contains_all(e.what(), {"image.gguf: ", "extends past the end of the file"}));
  }
  EXPECT_TRUE(contains_all(error_of([] { GgufFile::open_memory(nullptr, 0, "empty"); }),
                           {"empty: truncated while reading header"}));
}

// --- tiny model ---------------------------------------------------------------------------------

class TinyModelTest : public ::testing::Test {
 protected:
  ScratchDir dir_;
};

double mean_of(const GgufTensorInfo& t) {
  std::vector<float> v((size_t)t.n_elements());
  ggml_to_f32(t.type, t.data, v.data(), t.n_elements());
  double s = 0;
  for (float x : v) {
    EXPECT_TRUE(std::isfinite(x)) << t.name;
    s += x;
  }
  return s / (double)v.size();
}

double rms_of(const GgufTensorInfo& t) {
  std::vector<float> v((size_t)t.n_elements());
  ggml_to_f32(t.type, t.data, v.data(), t.n_elements());
  double s = 0;
  for (float x : v) s += (double)x * x;
  return std::sqrt(s / (double)v.size());
}

TEST_F(TinyModelTest, DefaultLlamaHasTheExpectedKeysAndTensors) {
  const std::string path = test::write_tiny_model(dir_.file("tiny.gguf"), {});
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 3);
  EXPECT_EQ(f->get_int("llama.context_length"), 512);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 96);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 4);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), 16);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f->get_float("llama.attention.layer_norm_rms_epsilon"), (double)1e-5f);
  EXPECT_FALSE(f->has("llama.attention.key_length"));

  const test::TinyVocab vocab = test::tiny_vocab();
  const auto& tokens = f->get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens, vocab.tokens);
  const int64_t n_vocab = (int64_t)tokens.size();
  EXPECT_EQ(n_vocab, 256 + 42 + 3);
  EXPECT_EQ(f->get_int("llama.vocab_size"), n_vocab);

  const int64_t e = 64;
  std::map<std::string, std::vector<int64_t>> shapes = {{"token_embd.weight", {e, n_vocab}},
                                                        {"output_norm.weight", {e}}};
  for (int i = 0; i < 3; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    shapes[p + "attn_norm.weight"] = {e};
    shapes[p + "attn_q.weight"] = {e, 64};
    shapes[p + "attn_k.weight"] = {e, 32};
    shapes[p + "attn_v.weight"] = {e, 32};
    shapes[p + "attn_output.weight"] = {64, e};
    shapes[p + "ffn_norm.weight"] = {e};
    shapes[p + "ffn_gate.weight"] = {e, 96};
    shapes[p + "ffn_up.weight"] = {e, 96};
    shapes[p + "ffn_down.weight"] = {96, e};
  }
  EXPECT_EQ(f->tensors().size(), shapes.size());
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr) << "tied by default";
  for (const auto& [name, ne] : shapes) {
    const GgufTensorInfo& t = f->tensor(name);
    EXPECT_EQ(t.ne, ne) << name;
    EXPECT_EQ(t.type, GgmlType::F32) << name;
    if (name.find("norm") != std::string::npos) {
      EXPECT_NEAR(mean_of(t), 1.0, 0.05) << name;
    } else {
      EXPECT_NEAR(mean_of(t), 0.0, 0.02) << name;
      EXPECT_GT(rms_of(t), 0.02) << name;
      EXPECT_LT(rms_of(t), 0.15) << name;
    }
  }
}

TEST_F(TinyModelTest, TokenizerMetadataIsAByteLevelGpt2Vocabulary) {
  const auto f = GgufFile::open(test::write_tiny_model(dir_.file("tiny.gguf"), {}));
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "smollm");
  const auto& tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_GE(tokens.size(), 256u);
  EXPECT_EQ(tokens[65], "A");
  EXPECT_EQ(tokens[32], "\xc4\xa0");   // space -> U+0120 'Ġ'
  EXPECT_EQ(tokens[10], "\xc4\x8a");   // newline -> U+010A 'Ċ'
  EXPECT_EQ(tokens[0], "\xc4\x80");    // U+0100
  EXPECT_EQ(tokens[173], "\xc5\x83");  // soft hyphen -> U+0143
  EXPECT_EQ(tokens[255], "\xc3\xbf");  // U+00FF
  EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size());

  const std::set<std::string> all(tokens.begin(), tokens.end());
  const auto& merges = f->get_string_array("tokenizer.ggml.merges");
  EXPECT_GE(merges.size(), 40u);
  EXPECT_EQ(merges[0], "\xc4\xa0 t");
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    EXPECT_TRUE(all.count(m.substr(0, sp))) << m;
    EXPECT_TRUE(all.count(m.substr(sp + 1))) << m;
    EXPECT_TRUE(all.count(m.substr(0, sp) + m.substr(sp + 1))) << m;
  }
  EXPECT_TRUE(all.count("\xc4\xa0the"));

  const auto& types = f->get_int_array("tokenizer.ggml.token_type");
  ASSERT_EQ(types.size(), tokens.size());
  const int64_t bos = f->get_int("tokenizer.ggml.bos_token_id");
  const int64_t eos = f->get_int("tokenizer.ggml.eos_token_id");
  EXPECT_EQ(tokens[bos], "<|im_start|>");
  EXPECT_EQ(tokens[eos], "<|im_end|>");
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(types[i], tokens[i].rfind("<|", 0) == 0 ? 3 : 1) << tokens[i];
  }
  EXPECT_EQ(tokens[tokens.size() - 3], "<|endoftext|>");
  EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token", true));
  const std::string& tmpl = f->get_string("tokenizer.chat_template");
  EXPECT_TRUE(contains_all(tmpl, {"<|im_start|>", "<|im_end|>", "add_generation_prompt"}));
}

class TinyModelTypeTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  ScratchDir dir_;
};

TEST_P(TinyModelTypeTest, Qwen2UntiedWithQuantisedMatrices) {
  test::TinyModelOptions o;
  o.arch = "qwen2";
  o.tied_output = false;
  o.weight_type = GetParam();
  o.token_embd_type = GgmlType::Q8_0;
  const auto f = GgufFile::open(test::write_tiny_model(dir_.file("q.gguf"), o));
  EXPECT_EQ(f->get_string("general.architecture"), "qwen2");
  EXPECT_EQ(f->get_int("qwen2.block_count"), 3);
  EXPECT_EQ(f->get_int("qwen2.attention.head_count_kv"), 2);
  EXPECT_FALSE(f->has("llama.block_count"));
  EXPECT_EQ(f->tensors().size(), 2u + 3 * 12 + 1);
  for (int i = 0; i < 3; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    EXPECT_EQ(f->tensor(p + "attn_q.bias").ne, (std::vector<int64_t>{64}));
    EXPECT_EQ(f->tensor(p + "attn_k.bias").ne, (std::vector<int64_t>{32}));
    EXPECT_EQ(f->tensor(p + "attn_v.bias").type, GgmlType::F32);
    EXPECT_EQ(f->tensor(p + "ffn_down.weight").type, GetParam());
    EXPECT_EQ(f->tensor(p + "attn_norm.weight").type, GgmlType::F32);
    EXPECT_LT(rms_of(f->tensor(p + "ffn_up.weight")), 0.15);
  }
  const GgufTensorInfo& out = f->tensor("output.weight");
  EXPECT_EQ(out.type, GetParam());
  EXPECT_EQ(out.ne, f->tensor("token_embd.weight").ne);
  EXPECT_EQ(f->tensor("token_embd.weight").type, GgmlType::Q8_0);
  EXPECT_NEAR(mean_of(out), 0.0, 0.02);
}

INSTANTIATE_TEST_SUITE_P(Types, TinyModelTypeTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::Q8_0,
                                           GgmlType::Q4_1, GgmlType::Q4_0),
                         [](const auto& info) { return ggml_type_name(info.param); });

TEST_F(TinyModelTest, SeedDeterminesTheFileAndOptionsAreValidated) {
  test::TinyModelOptions o;
  o.weight_type = GgmlType::Q4_1;
  const std::string a = read_bytes(test::write_tiny_model(dir_.file("a.gguf"), o));
  const std::string b = read_bytes(test::write_tiny_model(dir_.file("b.gguf"), o));
  o.seed += 1;
  const std::string c = read_bytes(test::write_tiny_model(dir_.file("c.gguf"), o));
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);

  o = {};
  o.head_dim = 32;  // != n_embd / n_head
  o.gguf_version = 2;
  const auto f = GgufFile::open(test::write_tiny_model(dir_.file("hd.gguf"), o));
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->get_int("llama.attention.key_length"), 32);
  EXPECT_EQ(f->get_int("llama.attention.value_length"), 32);
  EXPECT_EQ(f->tensor("blk.0.attn_q.weight").ne, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(f->tensor("blk.0.attn_k.weight").ne, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(f->tensor("blk.0.attn_output.weight").ne, (std::vector<int64_t>{128, 64}));

  o = {};
  o.arch = "gpt2";
  EXPECT_TRUE(contains_all(error_of([&] { test::write_tiny_model(dir_.file("x.gguf"), o); }),
                           {"'gpt2'", "expected one of llama, mistral, qwen2"}));
  o = {};
  o.n_ff = 100;
  o.weight_type = GgmlType::Q4_0;
  EXPECT_TRUE(contains_all(error_of([&] { test::write_tiny_model(dir_.file("x.gguf"), o); }),
                           {"q4_0", "n_ff (100)", "multiples of 32"}));
  o = {};
  o.n_head_kv = 3;
  EXPECT_TRUE(contains_all(error_of([&] { test::write_tiny_model(dir_.file("x.gguf"), o); }),
                           {"n_head 4 is not a multiple of n_head_kv 3"}));
}

// --- the real model, when present -------------------------------------------------------------

TEST(GgufRealModelTest, SmolLm2OpensWhenPresent) {
  const char* home = std::getenv("HOME");
  const std::string path =
      std::string(home ? home : "") + "/.cache/cachetune/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent";
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 272u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  std::set<GgmlType> types;
  for (const GgufTensorInfo& t : f->tensors()) {
    types.insert(t.type);
    EXPECT_TRUE(ggml_type_supported(t.type)) << t.name;
    EXPECT_GT(t.nbytes, 0u) << t.name;
  }
  EXPECT_EQ(types, (std::set<GgmlType>{GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0}));
  const auto& tokens = f->get_string_array("tokenizer.ggml.tokens");
  const GgufTensorInfo& embd = f->tensor("token_embd.weight");
  EXPECT_EQ(embd.ne[1], (int64_t)tokens.size());
  EXPECT_EQ(embd.ne[0], f->get_int("llama.embedding_length"));
  std::vector<float> row((size_t)embd.ne[0]);
  ggml_to_f32(embd.type, embd.data + ggml_row_bytes(embd.type, embd.ne[0]) * 100, row.data(),
              embd.ne[0]);
  double s = 0;
  for (float x : row) {
    ASSERT_TRUE(std::isfinite(x));
    s += std::fabs(x);
  }
  EXPECT_GT(s, 0.0);
}

}  // namespace
}  // namespace ct
