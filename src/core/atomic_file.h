// One way to replace a file atomically: write a temporary file beside the target, fsync it, rename
// it over the target, fsync the directory. A reader (or a restart after a crash) sees the old
// content or the new, never a mix; every failure names the path and the errno text.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace ct {

// Replaces `path` with `bytes`. On any failure the temporary file is removed, `path` is left as it
// was, and ct::Error names the file and the errno text. The temporary name carries the pid and a
// per-process counter, so concurrent writers never share one; the last rename wins.
// `step`, when given (tests), is called after each step: "write", "fsync", "rename", "sync_dir".
void write_file_atomic(const std::string& path, std::string_view bytes,
                       const std::function<void(const char* step)>& step = {});

// fsyncs the directory `dir` so that a rename or create inside it survives a power failure.
// Throws ct::Error naming the directory and the errno text; file systems that do not support
// fsync on a directory (EINVAL, ENOTSUP) are accepted silently, as there is nothing to persist.
void sync_directory(const std::string& dir);

// The directory holding `path` ("." for a bare file name).
std::string parent_directory(const std::string& path);

}  // namespace ct
