// Disk tier specifics: restart recovery (index rebuilt from the directory, temporary files
// removed), detection of flipped bytes, truncation, missing files and bad magic (logged, dropped,
// reported as a miss), write failures (injected at every point of a put, and on a real full or
// read-only tmpfs where mounting is allowed), read-only directories, and the read-bandwidth
// throttle (a lower bound only).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "store/disk_tier.h"
#include "store/memory_tier.h"
#include "store/record_format.h"
#include "support/chunk_fixtures.h"

// clang's way of saying that the address sanitizer is on (gcc defines __SANITIZE_ADDRESS__).
#if defined(__has_feature)
#define CT_ASAN_BY_FEATURE __has_feature(address_sanitizer)
#else
#define CT_ASAN_BY_FEATURE 0
#endif

namespace ct::store {
namespace {

namespace fs = std::filesystem;

class DiskTierTest : public ::testing::Test {
 protected:
  DiskTierOptions options() const {
    DiskTierOptions o;
    o.dir = dir_.path() + "/chunks";
    return o;
  }
  static ChunkKV chunk(const std::string& id, uint64_t seed) {
    return test::make_random_chunk(id, 200, 3, 32, KvDtype::F16, seed);
  }
  static void flip_byte(const std::string& path, uint64_t offset) {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << path;
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, (off_t)offset), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, (off_t)offset), 1);
    ::close(fd);
  }
  // Offset in the file of byte `byte_in_row` of slab row `row` of `layer`.
  static uint64_t slab_byte(const ChunkKV& kv, int layer, int row, size_t byte_in_row) {
    const RecordLayout lay = plan_record(kv.meta, 4096);
    return lay.data_offset + layer * lay.slab_stride + row * slab_row_bytes(kv.meta) + byte_in_row;
  }
  static bool read_layer_rows(Tier& t, const ChunkKV& kv, int layer, int a, int b) {
    std::vector<uint8_t> k((b - a) * kv_row_bytes(kv.meta)), v(k.size());
    const bool ok = t.read_rows(kv.meta.id, layer, a, b, k.data(), v.data());
    if (ok) {
      EXPECT_EQ(k, test::block_rows(kv, layer, false, a, b));
      EXPECT_EQ(v, test::block_rows(kv, layer, true, a, b));
    }
    return ok;
  }

  test::TempDir dir_;
};

TEST_F(DiskTierTest, RestartRebuildsTheIndexAndRemovesTemporaryFiles) {
  const ChunkKV a = chunk("a", 1), b = chunk("b", 2), c = chunk("c", 3);
  size_t used = 0;
  {
    DiskTier tier(options());
    for (const ChunkKV* kv : {&a, &b, &c}) ASSERT_TRUE(tier.put(*kv));
    used = tier.used_bytes();
  }
  // What a crash during put() leaves behind, and a file that is not ours.
  const std::string tmp = options().dir + "/.d.ctkv.tmp.999.0";
  std::ofstream(tmp) << "partial";
  std::ofstream(options().dir + "/notes.txt") << "keep me";

  DiskTier tier(options());
  EXPECT_EQ(tier.list(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(tier.used_bytes(), used);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(options().dir + "/notes.txt"));
  for (const ChunkKV* kv : {&a, &b, &c}) {
    std::optional<ChunkKV> back = tier.get(kv->meta.id);
    ASSERT_TRUE(back);
    EXPECT_TRUE(test::chunks_equal(*back, *kv));
    EXPECT_TRUE(read_layer_rows(tier, *kv, 2, 77, 200));
  }
}

TEST_F(DiskTierTest, FlippedSlabByteFailsOnlyReadsOfItsGroupThenTheEntryIsDropped) {
  DiskTier tier(options());
  const ChunkKV kv = chunk("flip", 4);
  ASSERT_TRUE(tier.put(kv));
  static_assert(kGroupRows == 16, "the row numbers below assume 16-row groups");
  flip_byte(tier.path_of("flip"), slab_byte(kv, 1, 100, 5));  // layer 1, group 6 (rows 96-111)
  EXPECT_TRUE(read_layer_rows(tier, kv, 1, 0, 96));           // groups 0-5: still verifiable
  EXPECT_TRUE(read_layer_rows(tier, kv, 1, 112, 200));        // groups 7-12
  EXPECT_TRUE(read_layer_rows(tier, kv, 0, 90, 110));         // another layer
  EXPECT_FALSE(read_layer_rows(tier, kv, 1, 108, 114));       // touches group 6
  EXPECT_FALSE(tier.contains("flip"));
  EXPECT_FALSE(fs::exists(tier.path_of("flip")));
  EXPECT_EQ(tier.used_bytes(), 0u);
  EXPECT_FALSE(read_layer_rows(tier, kv, 1, 0, 64));  // now a plain miss
}

TEST_F(DiskTierTest, APinnedRecordChecksItsGroupsAndDropsTheDamagedEntry) {
  // A byte flipped in place after the pin (the same file): the pinned read fails like read_rows
  // and the entry, still this version, is dropped.
  DiskTier tier(options());
  const ChunkKV kv = chunk("pinflip", 4);
  ASSERT_TRUE(tier.put(kv));
  const std::shared_ptr<PinnedRecord> pin = tier.pin("pinflip");
  ASSERT_NE(pin, nullptr);
  flip_byte(tier.path_of("pinflip"), slab_byte(kv, 1, 100, 5));  // layer 1, rows 96-111
  const size_t row = kv_bytes(kv.meta.dtype, kv.meta.kv_dim);
  std::vector<uint8_t> k(200 * row), v(200 * row);
  EXPECT_TRUE(pin->read_rows(1, 0, 96, k.data(), v.data()));
  EXPECT_TRUE(tier.contains("pinflip"));
  EXPECT_FALSE(pin->read_rows(1, 90, 110, k.data(), v.data()));
  EXPECT_FALSE(tier.contains("pinflip"));
  EXPECT_FALSE(fs::exists(tier.path_of("pinflip")));
  EXPECT_EQ(tier.used_bytes(), 0u);
}

TEST_F(DiskTierTest, OutOfDescriptorsIsAMissThatKeepsTheRecord) {
  // Pinned records hold descriptors; when the process runs out (EMFILE), an intact record must
  // not be taken for a missing file and deleted.
#if defined(__SANITIZE_ADDRESS__) || CT_ASAN_BY_FEATURE
  // The sanitizer runtime itself needs descriptors (its symbolizer, UBSan's type checks) and
  // reports false errors once they run out.
  GTEST_SKIP() << "descriptor exhaustion is not testable under the address sanitizer";
#endif
  DiskTier tier(options());
  const ChunkKV kv = chunk("fds", 4);
  ASSERT_TRUE(tier.put(kv));
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::dup(0);  // every descriptor below it is in use
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  struct rlimit low = saved;
  low.rlim_cur = (rlim_t)lowest_free;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const bool read = read_layer_rows(tier, kv, 0, 0, 64);
  const bool pinned = tier.pin("fds") != nullptr;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_FALSE(read);
  EXPECT_FALSE(pinned);
  EXPECT_TRUE(tier.contains("fds"));
  EXPECT_TRUE(fs::exists(tier.path_of("fds")));
  EXPECT_TRUE(read_layer_rows(tier, kv, 0, 0, 64));
}

TEST_F(DiskTierTest, VerifyAndGetDetectFlippedBytes) {
  DiskTier tier(options());
  const ChunkKV kv1 = chunk("v1", 5), kv2 = chunk("v2", 6), kv3 = chunk("v3", 7);
  for (const ChunkKV* kv : {&kv1, &kv2, &kv3}) ASSERT_TRUE(tier.put(*kv));
  EXPECT_TRUE(tier.verify("v1"));
  flip_byte(tier.path_of("v1"), slab_byte(kv1, 2, 199, 0));  // last row of the last layer
  flip_byte(tier.path_of("v2"), 100);                        // inside the meta JSON
  EXPECT_FALSE(tier.verify("v1"));
  EXPECT_FALSE(tier.get("v2"));
  EXPECT_FALSE(tier.contains("v1"));
  EXPECT_FALSE(tier.contains("v2"));
  EXPECT_TRUE(tier.verify("v3"));
  EXPECT_EQ(tier.list(), std::vector<std::string>{"v3"});
}

TEST_F(DiskTierTest, TruncatedFileIsAMissAtReadAndAtRestart) {
  const ChunkKV kv1 = chunk("t1", 8), kv2 = chunk("t2", 9);
  {
    DiskTier tier(options());
    ASSERT_TRUE(tier.put(kv1));
    ASSERT_TRUE(tier.put(kv2));
    fs::resize_file(tier.path_of("t1"), fs::file_size(tier.path_of("t1")) - 4096);
    EXPECT_FALSE(read_layer_rows(tier, kv1, 0, 0, 10));  // even rows far from the cut
    EXPECT_FALSE(tier.contains("t1"));
    fs::resize_file(tier.path_of("t2"), 30);
  }
  DiskTier tier(options());
  EXPECT_FALSE(tier.contains("t2"));
  EXPECT_FALSE(fs::exists(tier.path_of("t2")));
  EXPECT_TRUE(tier.list().empty());
  // What the scan deleted is reported (cache verify prints it and fails), not only logged.
  const std::vector<std::string> rejects = tier.scan_rejects();
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_NE(rejects[0].find(tier.path_of("t2")), std::string::npos) << rejects[0];
  EXPECT_NE(rejects[0].find("truncated"), std::string::npos) << rejects[0];
}

// Crash consistency, with the kill landing inside writes: each round a child process puts one
// record (a new id, or a new version of an existing one) and SIGKILLs itself at one step of the
// write, cycling through every step (after each layer's slab, the header, fsync, rename and the
// directory sync). After each crash a restart must index only whole records: every id listed
// reads back equal to the version it had before the round, or to the new one once the rename was
// done, never to a partial file; leftover temporary files are removed.
TEST_F(DiskTierTest, KillInsideWritesNeverLeavesAPartialRecord) {
  constexpr int kLayers = 3, kIds = 4, kRounds = 280;
  constexpr int kSteps = kLayers + 4;  // slab x kLayers, header, fsync, rename, dirsync
  auto version = [](int id, int v) {
    return test::make_random_chunk("c" + std::to_string(id), 24, kLayers, 16, KvDtype::F16,
                                   (uint64_t)(1000 * id + v + 1));
  };
  std::map<int, int> have;  // id -> version the tier holds (absent: none)
  int kills = 0, renamed = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int id = round % kIds, kill_at = round % kSteps;
    const ChunkKV next = version(id, round);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      DiskTierOptions o = options();
      int step = 0;
      o.write_hook = [&](const char*) {
        if (step++ == kill_at) ::raise(SIGKILL);
      };
      DiskTier tier(o);
      tier.put(next);
      ::_exit(3);  // not reached: every put makes kSteps hook calls
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "round " << round;
    ++kills;
    const bool after_rename = kill_at >= kLayers + 2;
    if (after_rename) {
      have[id] = round;
      ++renamed;
    }
    DiskTier tier(options());
    ASSERT_EQ(tier.list().size(), have.size()) << "round " << round;
    for (const auto& [i, v] : have) {
      std::optional<ChunkKV> got = tier.get("c" + std::to_string(i));
      ASSERT_TRUE(got.has_value()) << "round " << round << " id " << i;
      ASSERT_TRUE(test::chunks_equal(*got, version(i, v))) << "round " << round << " id " << i;
    }
    for (const auto& e : fs::directory_iterator(options().dir))
      ASSERT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  EXPECT_EQ(kills, kRounds);
  EXPECT_EQ(renamed, kRounds / kSteps * 2);
}

TEST_F(DiskTierTest, MissingFileIsAMiss) {
  DiskTier tier(options());
  const ChunkKV kv = chunk("gone", 10);
  ASSERT_TRUE(tier.put(kv));
  fs::remove(tier.path_of("gone"));
  EXPECT_FALSE(read_layer_rows(tier, kv, 0, 0, 200));
  EXPECT_FALSE(tier.contains("gone"));
  EXPECT_EQ(tier.used_bytes(), 0u);
  ASSERT_TRUE(tier.put(kv));
  fs::remove(tier.path_of("gone"));
  EXPECT_FALSE(tier.get("gone"));
}

TEST_F(DiskTierTest, BadMagicIsDetectedByVerifyAndAtRestart) {
  const ChunkKV kv1 = chunk("m1", 11), kv2 = chunk("m2", 12);
  {
    DiskTier tier(options());
    ASSERT_TRUE(tier.put(kv1));
    ASSERT_TRUE(tier.put(kv2));
    flip_byte(tier.path_of("m1"), 0);
    flip_byte(tier.path_of("m2"), 3);
    EXPECT_FALSE(tier.verify("m1"));
    EXPECT_FALSE(tier.contains("m1"));
  }
  DiskTier tier(options());
  EXPECT_TRUE(tier.list().empty());
  EXPECT_FALSE(fs::exists(tier.path_of("m2")));
}

TEST_F(DiskTierTest, WriteFailureIsReportedNotThrown) {
  DiskTier tier(options());
  fs::remove_all(options().dir);
  EXPECT_FALSE(tier.put(chunk("nowhere", 13)));
  EXPECT_FALSE(tier.contains("nowhere"));
}

// Names of the files in dir (temporary files included).
std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Every point of a put that a full or read-only medium can fail (create, each slab write, the
// header write, fsync, close, rename), with each errno such a medium gives: the put returns
// false, names the path and the errno text, leaves no temporary file, and the records stored
// before (including an older version of the same id) stay readable, now and after a restart.
TEST_F(DiskTierTest, InjectedWriteFailuresLeaveNoPartialRecordAndKeepExistingOnes) {
  const ChunkKV keep = chunk("keep", 20), v1 = chunk("same", 21), v2 = chunk("same", 22);
  std::function<int(const char*)> fault;  // set per case below
  DiskTierOptions o = options();
  o.put_retry_after_ms = 0;
  o.fault_hook = [&](const char* op) { return fault ? fault(op) : 0; };
  DiskTier tier(o);
  ASSERT_TRUE(tier.put(keep));
  ASSERT_TRUE(tier.put(v1));
  const std::set<std::string> stored = files_in(o.dir);
  ASSERT_EQ(stored.size(), 2u);

  struct Point {
    const char* op;
    int nth;  // which call of that op fails (3 layers: writes 0-2 are slabs, 3 the header)
  };
  const Point points[] = {{"create", 0}, {"write", 0}, {"write", 1}, {"write", 2},
                          {"write", 3},  {"fsync", 0}, {"close", 0}, {"rename", 0}};
  const int errnos[] = {ENOSPC, EDQUOT, EROFS, EACCES, EIO};
  int cases = 0;
  for (const Point& pt : points) {
    for (int e : errnos) {
      SCOPED_TRACE(std::string(pt.op) + " #" + std::to_string(pt.nth) + " " + std::strerror(e));
      int seen = 0;
      fault = [&](const char* op) { return std::string(op) == pt.op && seen++ == pt.nth ? e : 0; };
      EXPECT_FALSE(tier.put(v2));
      EXPECT_EQ(seen, pt.nth + 1) << "the failure point was not reached";
      const std::string err = tier.last_put_error();
      EXPECT_NE(err.find(o.dir), std::string::npos) << err;
      EXPECT_NE(err.find(std::strerror(e)), std::string::npos) << err;
      EXPECT_EQ(files_in(o.dir), stored) << "a temporary or partial file was left";
      std::optional<ChunkKV> got = tier.get("same");
      ASSERT_TRUE(got);
      EXPECT_TRUE(test::chunks_equal(*got, v1));
      got = tier.get("keep");
      ASSERT_TRUE(got);
      EXPECT_TRUE(test::chunks_equal(*got, keep));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 40);
  EXPECT_EQ(tier.put_failures(), 40u);
  {
    DiskTier again(options());
    EXPECT_EQ(again.list(), (std::vector<std::string>{"keep", "same"}));
    EXPECT_TRUE(again.scan_rejects().empty());
    std::optional<ChunkKV> got = again.get("same");
    ASSERT_TRUE(got);
    EXPECT_TRUE(test::chunks_equal(*got, v1));
  }
  // Once the medium works again, the same put succeeds.
  fault = nullptr;
  ASSERT_TRUE(tier.put(v2));
  std::optional<ChunkKV> got = tier.get("same");
  ASSERT_TRUE(got);
  EXPECT_TRUE(test::chunks_equal(*got, v2));
}

// After a failure, puts are refused without touching the medium for put_retry_after_ms (a full
// disk is not rewritten on every request), then tried again.
TEST_F(DiskTierTest, AFailedPutIsNotRetriedBeforeTheInterval) {
  int calls = 0;
  bool full = true;
  DiskTierOptions o = options();
  o.put_retry_after_ms = 1000;
  o.fault_hook = [&](const char* op) {
    ++calls;
    return full && std::string(op) == "create" ? ENOSPC : 0;
  };
  DiskTier tier(o);
  calls = 0;
  EXPECT_FALSE(tier.put(chunk("x", 30)));
  EXPECT_EQ(calls, 1);
  full = false;
  EXPECT_FALSE(tier.put(chunk("x", 30)));  // within the interval: refused, the medium untouched
  EXPECT_EQ(calls, 1);
  EXPECT_NE(tier.last_put_error().find(std::strerror(ENOSPC)), std::string::npos)
      << tier.last_put_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(tier.put(chunk("x", 30)));
  EXPECT_TRUE(tier.contains("x"));
}

// A directory that cannot be written (here: the start-up probe fails with EROFS) opens
// read-only: valid records are served, a damaged record and a leftover temporary file are left
// alone (and the damaged record reported), and puts are refused without trying, saying why.
TEST_F(DiskTierTest, ReadOnlyDirectoryServesItsRecordsAndRefusesPuts) {
  const ChunkKV a = chunk("a", 40), b = chunk("b", 41);
  std::string bad_path;
  {
    DiskTier tier(options());
    ASSERT_TRUE(tier.put(a));
    ASSERT_TRUE(tier.put(b));
    ASSERT_TRUE(tier.put(chunk("bad", 42)));
    bad_path = tier.path_of("bad");
  }
  flip_byte(bad_path, 5);  // header checksum fails
  const std::string tmp = options().dir + "/.c.ctkv.tmp.999.0";
  std::ofstream(tmp) << "partial";

  std::vector<std::string> ops;
  DiskTierOptions o = options();
  o.fault_hook = [&](const char* op) {
    ops.push_back(op);
    return std::string(op) == "probe" ? EROFS : 0;
  };
  DiskTier tier(o);
  EXPECT_TRUE(tier.read_only());
  EXPECT_EQ(tier.list(), (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(tier.scan_rejects().size(), 1u);
  EXPECT_NE(tier.scan_rejects()[0].find("read-only"), std::string::npos) << tier.scan_rejects()[0];
  EXPECT_TRUE(fs::exists(bad_path));
  EXPECT_TRUE(fs::exists(tmp));
  for (const ChunkKV* kv : {&a, &b}) {
    std::optional<ChunkKV> got = tier.get(kv->meta.id);
    ASSERT_TRUE(got);
    EXPECT_TRUE(test::chunks_equal(*got, *kv));
    EXPECT_TRUE(read_layer_rows(tier, *kv, 1, 30, 120));
  }
  ops.clear();
  EXPECT_FALSE(tier.put(chunk("new", 43)));
  EXPECT_TRUE(ops.empty()) << "a read-only tier tried to write";
  EXPECT_NE(tier.last_put_error().find("not writable"), std::string::npos) << tier.last_put_error();
  EXPECT_NE(tier.last_put_error().find(std::strerror(EROFS)), std::string::npos);
  EXPECT_FALSE(fs::exists(tier.path_of("new")));
}

// The same on a real filesystem: a tmpfs of 512 KiB (about five records) mounted over the tier's
// directory, filled by puts until one fails with ENOSPC, then remounted read-only. Needs
// permission to mount (root in a container that allows it); skipped otherwise.
TEST_F(DiskTierTest, RealFullThenReadOnlyFilesystem) {
  test::TmpfsMount mnt;
  std::string err;
  const std::string dir = options().dir;
  if (!mnt.mount(dir, 512 * 1024, &err))
    GTEST_SKIP() << "cannot mount a tmpfs here (" << err
                 << "); run as root where mounting is allowed to test a real full filesystem";
  DiskTierOptions o = options();
  o.put_retry_after_ms = 0;
  std::vector<ChunkKV> stored;
  {
    DiskTier tier(o);
    bool failed = false;
    for (int i = 0; i < 20 && !failed; ++i) {
      ChunkKV kv = chunk("f" + std::to_string(i), 50 + i);
      if (tier.put(kv)) {
        stored.push_back(std::move(kv));
      } else {
        failed = true;
      }
    }
    ASSERT_TRUE(failed) << "20 records fit in 512 KiB";
    ASSERT_GE(stored.size(), 2u);
    const std::string e = tier.last_put_error();
    EXPECT_NE(e.find(std::strerror(ENOSPC)), std::string::npos) << e;
    EXPECT_NE(e.find(dir), std::string::npos) << e;
    EXPECT_EQ(files_in(dir).size(), stored.size()) << "a partial file was left";
    for (const ChunkKV& kv : stored) {
      std::optional<ChunkKV> got = tier.get(kv.meta.id);
      ASSERT_TRUE(got) << kv.meta.id;
      EXPECT_TRUE(test::chunks_equal(*got, kv));
    }
  }
  ASSERT_TRUE(mnt.remount_read_only(&err)) << err;
  DiskTier tier(o);
  EXPECT_TRUE(tier.read_only());
  EXPECT_EQ(tier.list().size(), stored.size());
  for (const ChunkKV& kv : stored) {
    std::optional<ChunkKV> got = tier.get(kv.meta.id);
    ASSERT_TRUE(got) << kv.meta.id;
    EXPECT_TRUE(test::chunks_equal(*got, kv));
  }
  EXPECT_FALSE(tier.put(chunk("late", 99)));
  EXPECT_NE(tier.last_put_error().find(std::strerror(EROFS)), std::string::npos)
      << tier.last_put_error();
}

TEST_F(DiskTierTest, ThrottleMakesReadsTakeAtLeastBytesOverBandwidth) {
  DiskTierOptions o = options();
  o.read_bytes_per_sec = 4e6;  // 4 MB/s
  DiskTier tier(o);
  const ChunkKV kv = chunk("slow", 14);
  ASSERT_TRUE(tier.put(kv));
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  };

  uint64_t before = tier.bytes_read();
  auto t0 = clock::now();
  ASSERT_TRUE(read_layer_rows(tier, kv, 1, 20, 200));
  double elapsed = seconds_since(t0);
  const uint64_t n_rows = tier.bytes_read() - before;
  EXPECT_EQ(n_rows, (200 - 16) * slab_row_bytes(kv.meta));  // rows 20-199 widen to 16-199
  EXPECT_GE(elapsed, (double)n_rows / o.read_bytes_per_sec);

  before = tier.bytes_read();
  t0 = clock::now();
  ASSERT_TRUE(tier.get("slow"));
  elapsed = seconds_since(t0);
  EXPECT_GE(elapsed, (double)(tier.bytes_read() - before) / o.read_bytes_per_sec);

  // The emulated medium is shared: two concurrent reads take at least their sum.
  before = tier.bytes_read();
  t0 = clock::now();
  std::thread other([&] { EXPECT_TRUE(read_layer_rows(tier, kv, 0, 0, 200)); });
  EXPECT_TRUE(read_layer_rows(tier, kv, 2, 0, 200));
  other.join();
  elapsed = seconds_since(t0);
  EXPECT_GE(elapsed, (double)(tier.bytes_read() - before) / o.read_bytes_per_sec);
}

TEST(MemoryTier, VerifyDetectsAFlippedBitAndDrops) {
  MemoryTier tier("device", SIZE_MAX);
  const ChunkKV kv = test::make_random_chunk("mem", 70, 2, 8, KvDtype::BF16, 15);
  ASSERT_TRUE(tier.put(kv));
  EXPECT_TRUE(tier.verify("mem"));
  ASSERT_TRUE(tier.flip_bit_for_test("mem", 1, true, 17));
  EXPECT_FALSE(tier.verify("mem"));
  EXPECT_FALSE(tier.contains("mem"));
  EXPECT_EQ(tier.used_bytes(), 0u);
}

}  // namespace
}  // namespace ct::store
