// write_file_atomic: the target is replaced whole or not at all, the directory is synced after the
// rename, and every failure names the path and the errno text.
#include "support/errors.h"
#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ct-atomic-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  size_t n_files() const {
    return (size_t)std::distance(fs::directory_iterator(dir_), fs::directory_iterator());
  }
  std::string dir_;
};

using test::error_of;

TEST_F(AtomicFileTest, ReplacesTheTargetAndLeavesNoTemporaryFile) {
  const std::string p = dir_ + "/a.json";
  write_file_atomic(p, "old");
  write_file_atomic(p, "new content");
  EXPECT_EQ(read(p), "new content");
  EXPECT_EQ(n_files(), 1u);
}

TEST_F(AtomicFileTest, SyncsTheDirectoryAfterTheRename) {
  std::vector<std::string> steps;
  write_file_atomic(dir_ + "/b", "x", [&](const char* s) { steps.push_back(s); });
  EXPECT_EQ(steps, (std::vector<std::string>{"write", "fsync", "rename", "sync_dir"}));
}

TEST_F(AtomicFileTest, AFailedRenameLeavesTheTargetAndNamesPathAndErrno) {
  const std::string p = dir_ + "/target";
  fs::create_directory(p);
  std::ofstream(p + "/keep") << "kept";
  const std::string m = error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_NE(m.find(p), std::string::npos) << m;
  EXPECT_NE(m.find(std::strerror(EISDIR)), std::string::npos) << m;
  EXPECT_TRUE(fs::is_directory(p));
  EXPECT_EQ(read(p + "/keep"), "kept");
  EXPECT_EQ(n_files(), 1u);  // no temporary file left behind
}

TEST_F(AtomicFileTest, AMissingDirectoryIsAnErrorNamingPathAndErrno) {
  const std::string p = dir_ + "/no/such/dir/file";
  const std::string m = error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_NE(m.find(p), std::string::npos) << m;
  EXPECT_NE(m.find(std::strerror(ENOENT)), std::string::npos) << m;
  const std::string d = error_of([&] { sync_directory(dir_ + "/none"); });
  EXPECT_NE(d.find(dir_ + "/none"), std::string::npos) << d;
  EXPECT_NE(d.find(std::strerror(ENOENT)), std::string::npos) << d;
}

// A writer killed after any step leaves the old content or the new, whole.
TEST_F(AtomicFileTest, AKillAfterAnyStepLeavesOldOrNewWhole) {
  const std::string p = dir_ + "/rec";
  const std::string old_text(100000, 'o'), new_text(200000, 'n');
  for (const char* kill_at : {"write", "fsync", "rename", "sync_dir"}) {
    write_file_atomic(p, old_text);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      write_file_atomic(p, new_text, [&](const char* s) {
        if (std::strcmp(s, kill_at) == 0) ::raise(SIGKILL);
      });
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << kill_at;
    const std::string got = read(p);
    const bool renamed =
        std::strcmp(kill_at, "rename") == 0 || std::strcmp(kill_at, "sync_dir") == 0;
    EXPECT_EQ(got, renamed ? new_text : old_text) << kill_at;
    for (const auto& e : fs::directory_iterator(dir_))  // a killed writer's temp is only litter
      if (e.path() != p) fs::remove(e.path());
  }
}

}  // namespace
}  // namespace ct
