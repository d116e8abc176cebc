// DiskTier: atomic file writes, pread/O_DIRECT row-range reads with per-group checksums, startup
// scan and the read-bandwidth throttle.
#include "store/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/paths.h"
#include "store/tier_registry.h"

namespace ct::store {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kAlign = 4096;
constexpr const char* kExt = ".ctkv";
constexpr const char* kTmpMarker = ".ctkv.tmp.";

uint64_t align_down(uint64_t x) { return x / kAlign * kAlign; }
uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// A growable 4 KiB-aligned buffer (O_DIRECT needs aligned memory, offsets and lengths).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(p_); }
  uint8_t* reserve(size_t n) {
    if (n > cap_) {
      std::free(p_);
      cap_ = align_up(std::max<size_t>(n, 1));
      p_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, cap_));
      CT_ASSERT(p_ != nullptr, "aligned_alloc of {} bytes failed", cap_);
    }
    return p_;
  }

 private:
  uint8_t* p_ = nullptr;
  size_t cap_ = 0;
};

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now: 0, or the errno of a failed close (NFS and quotas report write errors there).
  int close_now() {
    const int fd = fd_;
    fd_ = -1;
    return fd >= 0 && ::close(fd) != 0 ? errno : 0;
  }

 private:
  int fd_;
};

std::string errno_text(int e) { return std::strerror(e); }

// Writes exactly n bytes at off, continuing after short writes. Returns 0 or the errno of the
// failing pwrite (a full medium: a short write, then ENOSPC); a pwrite that writes nothing
// without an error (not expected from a regular file) is reported as EIO rather than retried
// forever.
int pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t off) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

// Errors that mean "this directory cannot be written": the tier then opens read-only.
bool is_read_only_errno(int e) { return e == EROFS || e == EACCES || e == EPERM; }

// Reads exactly n bytes at off. Returns 0, or the errno of a failed pread (-1 at end of file)
// with *err set.
int pread_all(int fd, uint8_t* p, size_t n, uint64_t off, std::string* err) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, (off_t)off);
    if (r < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      *err = fmt::format("pread at {}: {}", off, errno_text(e));
      return e;
    }
    if (r == 0) {
      *err = fmt::format("unexpected end of file at offset {} (truncated)", off);
      return -1;
    }
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

// Reads [off, off + n) and returns a pointer to its first byte inside buf; with direct I/O
// (opt.direct_io and not yet refused) the read is widened to 4 KiB boundaries (records are padded
// so the widened range stays in-file). If the device refuses a direct read (EINVAL, e.g. larger
// logical blocks) the fd is switched to buffered I/O, direct_ok cleared, and the read repeated.
const uint8_t* read_range(int fd, const DiskTierOptions& opt, std::atomic<bool>& direct_ok,
                          uint64_t off, size_t n, AlignedBuffer& buf, std::string* err) {
  if (opt.direct_io && direct_ok.load()) {
    const uint64_t a0 = align_down(off), a1 = align_up(off + n);
    uint8_t* p = buf.reserve(a1 - a0);
    const int e = pread_all(fd, p, a1 - a0, a0, err);
    if (e == 0) return p + (off - a0);
    if (e != EINVAL) return nullptr;
    if (direct_ok.exchange(false))
      store_log(fmt::format("{}: the device refused an O_DIRECT read in {}; using buffered reads",
                            opt.name, opt.dir));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
  } else if (opt.direct_io) {
    // Direct reads were switched off after this descriptor was opened with O_DIRECT (a record
    // pinned earlier): buffered reads need the flag cleared.
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_DIRECT)) ::fcntl(fd, F_SETFL, fl & ~O_DIRECT);
  }
  uint8_t* p = buf.reserve(n);
  return pread_all(fd, p, n, off, err) == 0 ? p : nullptr;
}

thread_local AlignedBuffer tl_read_buffer;  // reused by read_rows on each thread

}  // namespace

DiskTier::DiskTier(DiskTierOptions opt) : opt_(std::move(opt)) {
  CT_THROW_IF_NOT(!opt_.dir.empty(), "disk tier '{}': no directory given", opt_.name);
  std::error_code ec;
  fs::create_directories(opt_.dir, ec);
  CT_THROW_IF_NOT(!ec, "disk tier '{}': cannot create directory {}: {}", opt_.name, opt_.dir,
                  ec.message());
  const int e = probe_writable();
  if (is_read_only_errno(e)) {
    read_only_ = true;
    last_put_error_ =
        fmt::format("{} is not writable ({}); the tier is read-only", opt_.dir, errno_text(e));
  }
  scan();
  if (read_only_) {
    store_log(
        fmt::format("{}: {} is not writable ({}); serving its {} records read-only, new "
                    "chunks are not stored there (make it writable and restart to store)",
                    opt_.name, opt_.dir, errno_text(e), entries_.size()));
  } else if (e != 0) {
    store_log(fmt::format("{}: cannot create a file in {} ({}); puts will fail until there is room",
                          opt_.name, opt_.dir, errno_text(e)));
  }
}

int DiskTier::probe_writable() {
  // Named like a put's temporary file, so that a crash between create and unlink leaves nothing
  // the next start does not remove.
  const std::string probe =
      (fs::path(opt_.dir) /
       fmt::format(".probe{}{}.{}", kTmpMarker, (long)::getpid(), tmp_counter_.fetch_add(1)))
          .string();
  if (opt_.fault_hook) {
    if (const int e = opt_.fault_hook("probe")) return e;
  }
  Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno;
  fd.close_now();
  ::unlink(probe.c_str());
  return 0;
}

std::string DiskTier::last_put_error() const {
  std::lock_guard lock(put_err_mu_);
  return last_put_error_;
}

void DiskTier::put_failed(const std::string& why) {
  ++put_failures_;
  {
    std::lock_guard lock(put_err_mu_);
    last_put_error_ = why;
    put_refused_until_ = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(std::max(0, opt_.put_retry_after_ms));
  }
  std::string line = fmt::format("{}: {}", opt_.name, why);
  if (opt_.put_retry_after_ms > 0)
    line += fmt::format("; not writing to {} for {} ms", opt_.dir, opt_.put_retry_after_ms);
  store_log_limited("disk put " + opt_.dir, line);
}

std::string DiskTier::path_of(const std::string& id) const {
  return (fs::path(opt_.dir) / (id + kExt)).string();
}

size_t DiskTier::used_bytes() const {
  std::lock_guard lock(mu_);
  return used_bytes_;
}

size_t DiskTier::footprint(const ChunkMeta& meta) const {
  return plan_record(meta, kAlign).total_bytes;
}

void DiskTier::scan() {
  struct Found {
    fs::file_time_type mtime;
    std::string id;
    std::shared_ptr<const RecordHeader> header;
  };
  std::vector<Found> found;
  std::error_code ec;
  fs::directory_iterator it(opt_.dir, ec);
  CT_THROW_IF_NOT(!ec, "disk tier '{}': cannot list {}: {}", opt_.name, opt_.dir, ec.message());
  for (const fs::directory_entry& de : it) {
    const std::string fname = de.path().filename().string();
    if (fname[0] == '.' && fname.find(kTmpMarker) != std::string::npos) {
      if (read_only_) {
        store_log(fmt::format("{}: leftover temporary file {} not removed (read-only)", opt_.name,
                              de.path().string()));
      } else {
        store_log(
            fmt::format("{}: removing leftover temporary file {}", opt_.name, de.path().string()));
        fs::remove(de.path(), ec);
      }
      continue;
    }
    if (fname.size() <= std::strlen(kExt) || !fname.ends_with(kExt)) continue;
    const std::string id = fname.substr(0, fname.size() - std::strlen(kExt));
    if (!is_valid_chunk_id(id)) continue;
    std::string err;
    std::shared_ptr<const RecordHeader> header;
    Fd fd(::open(de.path().c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
      err = fmt::format("cannot open: {}", errno_text(errno));
    } else {
      std::vector<uint8_t> fixed(kFixedHeaderBytes);
      std::optional<size_t> hb;
      if (pread_all(fd.get(), fixed.data(), fixed.size(), 0, &err) == 0 &&
          (hb = peek_header_bytes(fixed.data(), fixed.size(), &err))) {
        std::vector<uint8_t> bytes(*hb);
        if (pread_all(fd.get(), bytes.data(), bytes.size(), 0, &err) == 0) {
          std::optional<RecordHeader> h = decode_header(bytes.data(), bytes.size(), &err);
          if (h && h->meta.id != id) {
            err = fmt::format("header names chunk {}", h->meta.id);
          } else if (h && (uint64_t)st.st_size != h->total_bytes) {
            err = fmt::format("file has {} bytes, header says {} (truncated)", st.st_size,
                              h->total_bytes);
          } else if (h) {
            header = std::make_shared<const RecordHeader>(std::move(*h));
          }
        }
      }
    }
    if (!header) {
      std::string what = "deleted";
      if (read_only_) {
        what = "ignored (the directory is read-only)";
      } else if (!fs::remove(de.path(), ec) && ec) {
        what = "ignored (cannot delete it: " + ec.message() + ")";
      }
      store_log(fmt::format("{}: {} is not a valid record ({}); {}", opt_.name, de.path().string(),
                            err, what));
      scan_rejects_.push_back(fmt::format("{}: {}; {}", de.path().string(), err, what));
      continue;
    }
    found.push_back({de.last_write_time(ec), id, std::move(header)});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.mtime != b.mtime ? a.mtime < b.mtime : a.id < b.id;
  });
  std::lock_guard lock(mu_);
  for (Found& f : found) {
    used_bytes_ += f.header->total_bytes;
    entries_[f.id] = Entry{std::move(f.header), next_seq_++};
  }
}

bool DiskTier::put(const ChunkKV& kv) {
  check_chunk(kv);
  if (read_only_) {  // logged once at start; last_put_error() says why
    ++put_failures_;
    return false;
  }
  {
    std::lock_guard lock(put_err_mu_);
    if (std::chrono::steady_clock::now() < put_refused_until_) {
      ++put_failures_;
      return false;
    }
  }
  auto hook = [this](const char* step) {
    if (opt_.write_hook) opt_.write_hook(step);
  };
  auto fault = [this](const char* op) { return opt_.fault_hook ? opt_.fault_hook(op) : 0; };
  const ChunkMeta& m = kv.meta;
  const RecordLayout lay = plan_record(m, kAlign);
  const int n_groups = n_row_groups(m.n_tok);
  const std::string final_path = path_of(m.id);
  const std::string tmp_path =
      (fs::path(opt_.dir) /
       fmt::format(".{}{}{}.{}", m.id, kTmpMarker, (long)::getpid(), tmp_counter_.fetch_add(1)))
          .string();
  // Every failure removes the temporary file; the record under final_path (if any) is untouched.
  auto fail = [&](const std::string& what, int e) {
    ::unlink(tmp_path.c_str());
    put_failed(fmt::format("put chunk {}: {}: {}", m.id, what, errno_text(e)));
    return false;
  };
  std::vector<uint32_t> crcs((size_t)m.n_layer * n_groups);
  {
    int e = fault("create");
    Fd fd(e ? -1 : ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) return fail("cannot create " + tmp_path, e ? e : errno);
    // A short write (half the bytes, then the error) when the fault hook asks for one.
    auto write_at = [&](const uint8_t* p, size_t n, uint64_t off) {
      if (const int fe = fault("write")) {
        pwrite_all(fd.get(), p, n / 2, off);
        return fe;
      }
      return pwrite_all(fd.get(), p, n, off);
    };
    std::vector<uint8_t> slab(lay.slab_stride, 0);  // tail stays zero: the 4 KiB padding
    for (int l = 0; l < m.n_layer; ++l) {
      slab_pack(kv, l, slab.data());
      slab_group_crcs(slab.data(), m, &crcs[(size_t)l * n_groups]);
      if ((e = write_at(slab.data(), slab.size(), lay.data_offset + l * lay.slab_stride)))
        return fail(fmt::format("cannot write layer {} to {}", l, tmp_path), e);
      hook("slab");
    }
    std::vector<uint8_t> header = encode_header(lay, m, crcs);
    header.resize(lay.data_offset, 0);
    if ((e = write_at(header.data(), header.size(), 0)))
      return fail("cannot write the header to " + tmp_path, e);
    hook("header");
    if (opt_.sync_writes && ((e = fault("fsync")) || (::fsync(fd.get()) != 0 && (e = errno))))
      return fail("cannot fsync " + tmp_path, e);
    hook("fsync");
    if ((e = fault("close")) || (e = fd.close_now())) return fail("cannot close " + tmp_path, e);
  }
  RecordHeader h;
  h.meta = m;
  h.n_groups = n_groups;
  h.group_crc = std::move(crcs);
  h.header_bytes = lay.header_bytes;
  h.data_offset = lay.data_offset;
  h.slab_stride = lay.slab_stride;
  h.total_bytes = lay.total_bytes;
  {
    std::lock_guard lock(mu_);
    int e = fault("rename");
    if (e || (::rename(tmp_path.c_str(), final_path.c_str()) != 0 && (e = errno)))
      return fail(fmt::format("cannot rename {} to {}", tmp_path, final_path), e);
    hook("rename");
    auto [it, inserted] = entries_.try_emplace(m.id);
    if (!inserted) used_bytes_ -= it->second.header->total_bytes;
    used_bytes_ += h.total_bytes;
    it->second = Entry{std::make_shared<const RecordHeader>(std::move(h)), next_seq_++};
  }
  if (opt_.sync_writes) {
    Fd dir(::open(opt_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() >= 0) ::fsync(dir.get());
    hook("dirsync");
  }
  return true;
}

bool DiskTier::contains(const std::string& id) const {
  std::lock_guard lock(mu_);
  return entries_.count(id) != 0;
}

std::optional<ChunkMeta> DiskTier::get_meta(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.header->meta;
}

DiskTier::Opened DiskTier::open_entry(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return {};
  Opened o{it->second.header, it->second.seq, -1};
  const std::string path = path_of(id);
  if (opt_.direct_io && direct_ok_.load()) {
    o.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (o.fd < 0 && errno == EINVAL) {
      store_log(fmt::format("{}: O_DIRECT is not supported in {}; using buffered reads", opt_.name,
                            opt_.dir));
      direct_ok_ = false;
    }
  }
  if (o.fd < 0) o.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (o.fd < 0 && errno != ENOENT && errno != ENOTDIR) {
    // Out of descriptors (EMFILE, ENFILE: many requests hold pinned records), memory or
    // permission: the record itself may be intact, so it stays; this read is a miss.
    store_log_limited(opt_.name + " open",
                      fmt::format("{}: cannot open {}: {}; read as a miss, record kept", opt_.name,
                                  path, errno_text(errno)));
    return {};
  }
  if (o.fd < 0) {
    const std::string why = fmt::format("cannot open {}: {}", path, errno_text(errno));
    // The lock is held, so the entry is still this version: drop it right here.
    store_log(fmt::format("{}: chunk {}: {}; dropped", opt_.name, id, why));
    ::unlink(path.c_str());
    used_bytes_ -= it->second.header->total_bytes;
    entries_.erase(it);
    return {};
  }
  return o;
}

void DiskTier::drop(const std::string& id, uint64_t seq, const std::string& why) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.seq != seq) return;  // already replaced or erased
  store_log(fmt::format("{}: chunk {}: {}; dropped", opt_.name, id, why));
  ::unlink(path_of(id).c_str());
  used_bytes_ -= it->second.header->total_bytes;
  entries_.erase(it);
}

std::chrono::steady_clock::time_point DiskTier::throttle_reserve(size_t bytes) {
  const auto now = std::chrono::steady_clock::now();
  if (opt_.read_bytes_per_sec <= 0) return now;
  const auto duration = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>((double)bytes / opt_.read_bytes_per_sec));
  std::lock_guard lock(throttle_mu_);
  medium_free_at_ = std::max(medium_free_at_, now) + duration;
  return medium_free_at_;
}

bool DiskTier::read_rows(const std::string& id, int layer, int row_begin, int row_end, void* k_dst,
                         void* v_dst) {
  Opened o = open_entry(id);
  if (o.fd < 0) return false;
  Fd fd(o.fd);
  return read_opened(id, o, layer, row_begin, row_end, k_dst, v_dst);
}

class DiskTier::Pin final : public PinnedRecord {
 public:
  Pin(DiskTier& tier, std::string id, Opened o) : tier_(tier), id_(std::move(id)), o_(o), fd_(o.fd) {}
  bool read_rows(int layer, int row_begin, int row_end, void* k_dst, void* v_dst) override {
    return tier_.read_opened(id_, o_, layer, row_begin, row_end, k_dst, v_dst);
  }

 private:
  DiskTier& tier_;
  const std::string id_;
  const Opened o_;
  Fd fd_;  // closes o_.fd with the pin
};

std::shared_ptr<PinnedRecord> DiskTier::pin(const std::string& id) {
  Opened o = open_entry(id);
  if (o.fd < 0) return nullptr;
  return std::make_shared<Pin>(*this, id, o);
}

bool DiskTier::read_opened(const std::string& id, const Opened& o, int layer, int row_begin,
                           int row_end, void* k_dst, void* v_dst) {
  const int fd = o.fd;
  const RecordHeader& h = *o.header;
  check_row_args(h.meta, layer, row_begin, row_end);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (uint64_t)st.st_size != h.total_bytes) {
    drop(id, o.seq,
         fmt::format("file has {} bytes, expected {} (truncated)", st.st_size, h.total_bytes));
    return false;
  }
  if (row_begin == row_end) return true;
  const GroupSpan span = covering_groups(h, row_begin, row_end);
  const size_t row = slab_row_bytes(h.meta);
  const uint64_t off = h.slab_offset(layer) + (uint64_t)span.row_lo * row;
  const size_t n = (size_t)(span.row_hi - span.row_lo) * row;
  const auto done_at = throttle_reserve(n);
  std::string err;
  const uint8_t* p = read_range(fd, opt_, direct_ok_, off, n, tl_read_buffer, &err);
  if (!p || !check_groups(h, layer, span, p, &err)) {
    drop(id, o.seq, err);
    return false;
  }
  bytes_read_ += n;
  slab_unpack(p + (size_t)(row_begin - span.row_lo) * row, (size_t)(row_end - row_begin),
              kv_row_bytes(h.meta), k_dst, v_dst);
  std::this_thread::sleep_until(done_at);
  return true;
}

bool DiskTier::load_checked(const std::string& id, ChunkKV* out) {
  Opened o = open_entry(id);
  if (o.fd < 0) return false;
  Fd fd(o.fd);
  const uint64_t total = o.header->total_bytes;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || (uint64_t)st.st_size != total) {
    drop(id, o.seq, fmt::format("file has {} bytes, expected {} (truncated)", st.st_size, total));
    return false;
  }
  const auto done_at = throttle_reserve(total);
  AlignedBuffer buf;
  std::string err;
  const uint8_t* p = read_range(fd.get(), opt_, direct_ok_, 0, total, buf, &err);
  std::optional<RecordHeader> h;
  if (p) h = decode_header(p, total, &err);
  if (h && h->meta.id != id) {
    err = fmt::format("header names chunk {}", h->meta.id);
    h.reset();
  }
  if (h && h->total_bytes != total) {
    err = fmt::format("header records {} bytes, index {}", h->total_bytes, total);
    h.reset();
  }
  if (!h) {
    drop(id, o.seq, err);
    return false;
  }
  bytes_read_ += total;
  const size_t row = kv_row_bytes(h->meta);
  const GroupSpan all = covering_groups(*h, 0, h->meta.n_tok);
  if (out) {
    out->meta = h->meta;
    out->k.assign(h->meta.n_layer, std::vector<uint8_t>(h->meta.layer_bytes()));
    out->v.assign(h->meta.n_layer, std::vector<uint8_t>(h->meta.layer_bytes()));
  }
  for (int l = 0; l < h->meta.n_layer; ++l) {
    const uint8_t* slab = p + h->slab_offset(l);
    if (!check_groups(*h, l, all, slab, &err)) {
      drop(id, o.seq, err);
      return false;
    }
    if (out) slab_unpack(slab, h->meta.n_tok, row, out->k[l].data(), out->v[l].data());
  }
  std::this_thread::sleep_until(done_at);
  return true;
}

std::optional<ChunkKV> DiskTier::get(const std::string& id) {
  ChunkKV kv;
  if (!load_checked(id, &kv)) return std::nullopt;
  return kv;
}

bool DiskTier::verify(const std::string& id) { return load_checked(id, nullptr); }

bool DiskTier::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  ::unlink(path_of(id).c_str());
  used_bytes_ -= it->second.header->total_bytes;
  entries_.erase(it);
  return true;
}

std::vector<std::string> DiskTier::list() const {
  std::lock_guard lock(mu_);
  return ids_oldest_first(entries_);
}

}  // namespace ct::store

// ---------------------------------------------------------------------------------------------
// The "disk" tier kind: "disk[:DIR][:CAPACITY][:bw=RATE][:direct][:nosync]".

namespace ct::store {

DiskTierOptions disk_tier_options(const TierSpec& s) {
  DiskTierOptions d;
  d.dir = !s.fields.empty() && !s.fields[0].empty() ? s.fields[0] : default_cache_dir();
  for (size_t i = 1; i < s.fields.size(); ++i) {
    const std::string& f = s.fields[i];
    if (f.rfind("bw=", 0) == 0) {
      d.read_bytes_per_sec = (double)parse_bytes(f.substr(3));
    } else if (f == "direct") {
      d.direct_io = true;
    } else if (f == "nosync") {
      d.sync_writes = false;
    } else {
      d.capacity_bytes = parse_bytes(f);
    }
  }
  return d;
}

namespace {

void disk_check(const TierSpec& s) { (void)disk_tier_options(s); }
std::unique_ptr<Tier> disk_make(const TierSpec& s) {
  return std::make_unique<DiskTier>(disk_tier_options(s));
}
std::string disk_key(const TierSpec& s) {
  const DiskTierOptions d = disk_tier_options(s);
  return d.read_bytes_per_sec > 0 ? fmt::format("disk:bw={:.0f}", d.read_bytes_per_sec) : "disk";
}

}  // namespace

extern const TierKind kDiskTierKind;  // listed in tier_registry.cc
const TierKind kDiskTierKind{"disk", "disk[:DIR][:CAPACITY][:bw=RATE][:direct][:nosync]",
                             disk_check, disk_make, disk_key};

}  // namespace ct::store
