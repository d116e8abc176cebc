// Tier specs (--tier) and byte sizes: the documented forms parse, and malformed text is a ct::Error
// naming it. The malformed cases are inputs the tier_spec fuzz target found
// (fuzz/corpus/tier_spec): before the fix they escaped as std::invalid_argument / std::out_of_range
// from std::stod or were undefined behaviour (a double above 2^64 converted to size_t).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/errors.h"
#include "core/error.h"
#include "engine/engine.h"
#include "store/disk_tier.h"
#include "store/redis_tier.h"

namespace ct {
namespace {

// The ct::Error message of f(), failing the test for any other outcome.
using test::error_of;

TEST(TierSpecTest, DocumentedFormsParse) {
  EXPECT_EQ(parse_bytes("100000"), 100000u);
  EXPECT_EQ(parse_bytes("512K"), 512u << 10);
  EXPECT_EQ(parse_bytes("1.5MiB"), 3u << 19);
  EXPECT_EQ(parse_bytes("2G"), size_t{2} << 30);
  EXPECT_EQ(store::make_tier(parse_tier_spec("device:2G"))->capacity_bytes(), size_t{2} << 30);
  EXPECT_EQ(store::make_tier(parse_tier_spec("host"))->capacity_bytes(), SIZE_MAX);
  const TierSpec d = parse_tier_spec("disk:/tmp/x:1G:bw=100M");
  EXPECT_EQ(d.kind, "disk");
  const store::DiskTierOptions dopt = store::disk_tier_options(d);
  EXPECT_EQ(dopt.dir, "/tmp/x");
  EXPECT_EQ(dopt.capacity_bytes, size_t{1} << 30);
  EXPECT_EQ(dopt.read_bytes_per_sec, 100.0 * (1 << 20));
  EXPECT_TRUE(dopt.sync_writes);
  EXPECT_FALSE(dopt.direct_io);
  const store::DiskTierOptions bench =
      store::disk_tier_options(parse_tier_spec("disk:/t:direct:nosync"));
  EXPECT_TRUE(bench.direct_io);
  EXPECT_FALSE(bench.sync_writes);
  const store::RedisTierOptions r =
      store::redis_tier_options(parse_tier_spec("redis:10.0.0.2:6380"));
  EXPECT_EQ(r.host, "10.0.0.2");
  EXPECT_EQ(r.port, 6380);
  EXPECT_EQ(store::redis_tier_options(parse_tier_spec("redis")).port, 6379);
  const store::RedisTierOptions rb =
      store::redis_tier_options(parse_tier_spec("redis:h:7000:prefix=ct-bench-1.:timeout=10000"));
  EXPECT_EQ(rb.port, 7000);
  EXPECT_EQ(rb.key_prefix, "ct-bench-1.");
  EXPECT_EQ(rb.command_timeout_ms, 10000);
}

// The registry is the one place that knows the kinds: an unknown kind names every known one, and
// each kind builds its tier from its spec.
TEST(TierSpecTest, TheRegistryListsAndBuildsEveryKind) {
  EXPECT_EQ(store::tier_kinds(), (std::vector<std::string>{"device", "host", "disk", "redis"}));
  const std::string m = error_of([] { parse_tier_spec("tape:1G"); });
  EXPECT_NE(m.find("expected device, host, disk, redis"), std::string::npos) << m;
  const std::string dir = testing::TempDir() + "ct-tier-registry";
  auto disk = store::make_tier(parse_tier_spec("disk:" + dir + ":64M"));
  EXPECT_EQ(disk->name(), "disk");
  EXPECT_EQ(disk->capacity_bytes(), size_t{64} << 20);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(store::make_tier(parse_tier_spec("device"))->name(), "device");
  EXPECT_NE(error_of([] { parse_tier_spec("redis:h:1:timeout=0"); }).find("timeout '0'"),
            std::string::npos);
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
