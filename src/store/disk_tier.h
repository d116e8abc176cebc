// Disk tier: one file per chunk in a local directory, written atomically (temporary name, fsync,
// rename, directory fsync) and indexed in memory; the index is rebuilt by scanning the directory,
// so the tier survives a restart. Reads use pread, optionally O_DIRECT, and an optional bandwidth
// throttle emulates a slow medium.
//
// File "<dir>/<id>.ctkv" is exactly the record of record_format.h with align = 4096: header, zero
// padding to the next 4 KiB, then one interleaved K|V slab per layer, each padded to 4 KiB. Rows
// [a, b) of layer l (keys and values) are therefore ONE pread of the covering 16-row groups; every
// group read is checked against its CRC32C before any byte reaches the caller.
// Temporary files are ".<id>.ctkv.tmp.<pid>.<n>"; the startup scan deletes them (a crash left
// them behind), and deletes files with a bad magic, version or header checksum, or whose size is
// not the size the header records (truncated). Slab checksums are checked on every read, on get()
// and on verify(), not during the scan. One process per directory.
//
// A failed put (ENOSPC, EDQUOT, EROFS, EACCES, EIO, a short write; at create, write, fsync,
// close or rename) removes its temporary file, leaves every stored record as it was (the final
// name is only ever replaced by rename), is logged (path and errno text; repeats within a minute
// are counted, not printed) and returns false, so the pool tries the next tier or the engine
// serves the request from memory. Puts are then refused for put_retry_after_ms.
// A directory that exists but cannot be written (read-only mount, no permission) is opened in
// read-only mode: its valid records are indexed and served, damaged ones are ignored instead of
// deleted, and every put is refused (last_put_error() says why); one line is logged at start.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "store/record_format.h"
#include "store/tier.h"

namespace ct::store {

struct DiskTierOptions {
  std::string name = "disk";
  std::string dir;  // created when missing
  size_t capacity_bytes = SIZE_MAX;
  double read_bytes_per_sec = 0;  // > 0: every read takes at least bytes / this (below)
  bool direct_io = false;         // O_DIRECT reads; buffered if the filesystem refuses
  bool sync_writes = true;        // fsync file and directory in put()
  // Tests only: called between the steps of put() ("slab", "header", "fsync", "rename",
  // "dirsync"), so a crash test can kill the process at each point of a write.
  std::function<void(const char* step)> write_hook;
  // Tests only: consulted before each system call of put() that can fail on a full or read-only
  // medium ("create", "write", "fsync", "close", "rename"). A non-zero return is an errno value
  // that call then fails with (for "write": after half of its bytes were really written, as a
  // short write followed by the error), so every failure point can be reached without a full disk.
  std::function<int(const char* op)> fault_hook;
  // After a failed put, further puts are refused without touching the disk for this long (a full
  // disk is not written to again on every request); 0 retries every time.
  int put_retry_after_ms = 5000;
};

struct TierSpec;  // store/tier_registry.h
// The options a "disk[:DIR][:CAPACITY][:bw=RATE][:direct][:nosync]" spec stands for (DIR empty or
// absent: default_cache_dir()); throws ct::Error naming a malformed size.
DiskTierOptions disk_tier_options(const TierSpec& spec);

class DiskTier final : public Tier {
 public:
  // Creates the directory if needed and indexes the records in it (see above). Throws ct::Error
  // naming the directory when it cannot be created or listed; a directory that exists but is not
  // writable opens read-only.
  explicit DiskTier(DiskTierOptions opt);

  const std::string& name() const override { return opt_.name; }
  size_t capacity_bytes() const override { return opt_.capacity_bytes; }
  size_t used_bytes() const override;
  // The file size: header and slabs, each padded to 4 KiB.
  size_t footprint(const ChunkMeta& meta) const override;

  bool put(const ChunkKV& kv) override;
  bool contains(const std::string& id) const override;
  std::optional<ChunkMeta> get_meta(const std::string& id) const override;
  bool read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                 void* v_dst) override;
  // Holds the record's file open: reads go on after it is erased or replaced (the old file stays
  // readable through its descriptor), with the same checks as read_rows.
  std::shared_ptr<PinnedRecord> pin(const std::string& id) override;
  std::optional<ChunkKV> get(const std::string& id) override;
  bool erase(const std::string& id) override;
  std::vector<std::string> list() const override;
  bool verify(const std::string& id) override;

  std::string path_of(const std::string& id) const;
  uint64_t bytes_read() const { return bytes_read_.load(); }

  std::vector<std::string> scan_rejects() const override { return scan_rejects_; }
  std::string last_put_error() const override;

  // True when the directory was not writable at start (see above).
  bool read_only() const { return read_only_; }
  uint64_t put_failures() const { return put_failures_.load(); }

 private:
  struct Entry {
    std::shared_ptr<const RecordHeader> header;
    uint64_t seq = 0;  // order of storing (scan: file mtime order); also identifies this version
  };
  // Looks the entry up and opens its file under the lock, so the file opened is the one the
  // header describes (put renames under the same lock). fd < 0 when absent or unopenable; a
  // missing file of an indexed entry is logged and dropped.
  struct Opened {
    std::shared_ptr<const RecordHeader> header;
    uint64_t seq = 0;
    int fd = -1;
  };
  Opened open_entry(const std::string& id);
  // read_rows on an opened entry (the caller keeps o.fd open).
  bool read_opened(const std::string& id, const Opened& o, int layer, int row_begin, int row_end,
                   void* k_dst, void* v_dst);
  class Pin;
  // Removes the entry and its file if the entry is still version `seq`, logging `why`.
  void drop(const std::string& id, uint64_t seq, const std::string& why);
  // Reserves the emulated medium for `bytes` and returns when the read may complete (now when
  // unthrottled); the caller sleeps until then after doing the real read.
  std::chrono::steady_clock::time_point throttle_reserve(size_t bytes);
  // Whole-record load with every checksum checked; out may be null (verify).
  bool load_checked(const std::string& id, ChunkKV* out);
  void scan();
  // Tries to create (and removes) a temporary file; errno of the failure, 0 when writable.
  int probe_writable();
  // Records a failed put: `why` (with errno text) becomes last_put_error(), puts are refused for
  // put_retry_after_ms, and the line is logged (store_log_limited: at most once a minute).
  void put_failed(const std::string& why);
  std::vector<std::string> scan_rejects_;  // written by the constructor's scan only
  bool read_only_ = false;                 // set by the constructor only

  DiskTierOptions opt_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  size_t used_bytes_ = 0;
  uint64_t next_seq_ = 1;
  std::atomic<uint64_t> tmp_counter_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<bool> direct_ok_{true};
  std::atomic<uint64_t> put_failures_{0};

  mutable std::mutex put_err_mu_;
  std::string last_put_error_;
  std::chrono::steady_clock::time_point put_refused_until_{};

  // Throttle: the emulated medium serves one read at a time at read_bytes_per_sec, so each read
  // reserves the interval after the previous reservation and sleeps until its end.
  std::mutex throttle_mu_;
  std::chrono::steady_clock::time_point medium_free_at_{};
};

}  // namespace ct::store
