// write_file_atomic and sync_directory: the temp-fsync-rename-dirsync sequence, written once.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace ct {
namespace {

std::atomic<uint64_t> g_tmp_counter{0};

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

std::string parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CT_THROW_IF_NOT(fd >= 0, "cannot open directory {} to sync it: {}", dir, errno_text(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  CT_THROW_IF_NOT(rc == 0 || e == EINVAL || e == ENOTSUP, "fsync of directory {} failed: {}", dir,
                  errno_text(e));
}

void write_file_atomic(const std::string& path, std::string_view bytes,
                       const std::function<void(const char*)>& step) {
  // Beside the target, so that rename() stays within one file system (atomic).
  const std::string tmp = path + ".tmp." + std::to_string((long)::getpid()) + "." +
                          std::to_string(g_tmp_counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CT_THROW_IF_NOT(fd >= 0, "{}: cannot create temporary file {}: {}", path, tmp, errno_text(errno));
  auto fail = [&](const char* what, int e) {
    ::close(fd);  // harmless EBADF when it was closed already
    ::unlink(tmp.c_str());
    CT_THROW("{}: {} of temporary file {} failed: {}", path, what, tmp, errno_text(e));
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  if (step) step("write");
  if (::fsync(fd) != 0) fail("fsync", errno);
  if (step) step("fsync");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    CT_THROW("{}: close of temporary file {} failed: {}", path, tmp, errno_text(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    CT_THROW("{}: cannot rename {} into place: {}", path, tmp, errno_text(e));
  }
  if (step) step("rename");
  // Without this the rename itself may be lost on power failure.
  sync_directory(parent_directory(path));
  if (step) step("sync_dir");
}

}  // namespace ct
