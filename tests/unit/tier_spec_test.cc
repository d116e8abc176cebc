// Tier specs (--tier) and byte sizes: the documented forms parse, and malformed text is a ct::Error
// naming it. The malformed cases are inputs the tier_spec fuzz target found
// (fuzz/corpus/tier_spec): before the fix they escaped as std::invalid_argument / std::out_of_range
// from std::stod or were undefined behaviour (a double above 2^64 converted to size_t).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/engine.h"

namespace ct {
namespace {

// The ct::Error message of f(), failing the test for any other outcome.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ct::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ct::Error, nothing was thrown";
  return "";
}

TEST(TierSpecTest, DocumentedFormsParse) {
  EXPECT_EQ(parse_bytes("100000"), 100000u);
  EXPECT_EQ(parse_bytes("512K"), 512u << 10);
  EXPECT_EQ(parse_bytes("1.5MiB"), 3u << 19);
  EXPECT_EQ(parse_bytes("2G"), size_t{2} << 30);
  EXPECT_EQ(parse_tier_spec("device:2G").capacity, size_t{2} << 30);
  EXPECT_EQ(parse_tier_spec("host").capacity, SIZE_MAX);
  const TierSpec d = parse_tier_spec("disk:/tmp/x:1G:bw=100M");
  EXPECT_EQ(d.kind, "disk");
  EXPECT_EQ(d.dir, "/tmp/x");
  EXPECT_EQ(d.capacity, size_t{1} << 30);
  EXPECT_EQ(d.read_bytes_per_sec, 100.0 * (1 << 20));
  const TierSpec r = parse_tier_spec("redis:10.0.0.2:6380");
  EXPECT_EQ(r.host, "10.0.0.2");
  EXPECT_EQ(r.port, 6380);
  EXPECT_EQ(parse_tier_spec("redis").port, 6379);
}

TEST(TierSpecTest, MalformedSizesAreErrorsNamingTheText) {
  for (const std::string bad : {".", "..", "1.2.3M", ".G", "G", "12Q", "-1", ""}) {
    const std::string m = error_of([&] { parse_bytes(bad); });
    EXPECT_NE(m.find(bad.empty() ? "empty size" : "'" + bad + "'"), std::string::npos) << m;
  }
  // Too large for size_t: was undefined behaviour (UBSan: outside the range of unsigned long).
  const std::string huge = "99999999999999999999999G";
  EXPECT_NE(error_of([&] { parse_bytes(huge); }).find("expected less than 2^63"),
            std::string::npos);
  // 1e400 overflows a double: std::stod threw std::out_of_range.
  EXPECT_NE(error_of([] { parse_bytes("1" + std::string(400, '0')); }).find("is not a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_tier_spec("host:."); }).find("'.'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_tier_spec("disk:/d:bw=1..5M"); }).find("'1..5M'"),
            std::string::npos);
}

TEST(TierSpecTest, RedisPortMustBeTheWholeFieldAndInRange) {
  for (const std::string bad : {"redis:h:6379abc", "redis:h:99999999999", "redis:h:0",
                                "redis:h:65536", "redis:h:-1", "redis:h:", "redis:h:1:2"}) {
    const std::string m = error_of([&] { parse_tier_spec(bad); });
    EXPECT_NE(m.find("tier '" + bad + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("PORT in 1..65535"), std::string::npos) << m;
  }
  EXPECT_NE(error_of([] { parse_tier_spec("tape:1G"); }).find("unknown kind 'tape'"),
            std::string::npos);
}

}  // namespace
}  // namespace ct
