// GGUF reader: maps the file read-only and parses it with a bounds check before every read, so a
// malformed file yields a ct::Error naming the file, the key or tensor and the offending value,
// never a crash or a huge allocation.
#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>

#include "core/error.h"

namespace ct {

std::string gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
      return "uint8";
    case GgufValueType::INT8:
      return "int8";
    case GgufValueType::UINT16:
      return "uint16";
    case GgufValueType::INT16:
      return "int16";
    case GgufValueType::UINT32:
      return "uint32";
    case GgufValueType::INT32:
      return "int32";
    case GgufValueType::FLOAT32:
      return "float32";
    case GgufValueType::BOOL:
      return "bool";
    case GgufValueType::STRING:
      return "string";
    case GgufValueType::ARRAY:
      return "array";
    case GgufValueType::UINT64:
      return "uint64";
    case GgufValueType::INT64:
      return "int64";
    case GgufValueType::FLOAT64:
      return "float64";
  }
  return fmt::format("unknown({})", static_cast<uint32_t>(t));
}

size_t GgufValue::array_size() const {
  if (type != GgufValueType::ARRAY) return 0;
  switch (elem_type) {
    case GgufValueType::STRING:
      return arr_s.size();
    case GgufValueType::ARRAY:
      return arr.size();
    case GgufValueType::FLOAT32:
    case GgufValueType::FLOAT64:
      return arr_f.size();
    default:
      return arr_i.size();
  }
}

int64_t GgufTensorInfo::n_elements() const {
  if (ne.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
// Real files nest arrays at most two deep; the limit keeps a crafted file from exhausting the
// stack through recursion.
constexpr int kMaxArrayDepth = 16;

bool is_valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::BOOL:
      return true;
    default:
      return false;
  }
}

bool is_float(GgufValueType t) {
  return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

// Fewest bytes one encoded value of type t can occupy; bounds array counts by the bytes left.
size_t min_encoded_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
      return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32:
      return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64:
    case GgufValueType::STRING:
      return 8;  // a string is at least its length field
    case GgufValueType::ARRAY:
      return 12;  // element type + count
  }
  return 1;
}

std::string describe(const GgufValue& v) {
  if (v.type != GgufValueType::ARRAY) return gguf_value_type_name(v.type);
  return "array of " + gguf_value_type_name(v.elem_type);
}

// Sequential reader over the mapping. `what` names the item being read for error messages
// ("header", "key 'llama.block_count'", ...).
class Parser {
 public:
  Parser(const std::string& path, const uint8_t* base, size_t size)
      : path_(path), base_(base), size_(size) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  void need(size_t n, std::string_view what) const {
    if (n > size_ - pos_) {
      CT_THROW("{}: truncated while reading {} (need {} bytes at offset {}, file has {})", path_,
               what, n, pos_, size_);
    }
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > left()) {
      CT_THROW(
          "{}: truncated while reading {}: string length {} at offset {} exceeds the {} bytes left "
          "in the file",
          path_, what, len, at, left());
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), (size_t)len);
    pos_ += (size_t)len;
    return s;
  }

  // Integer and bool elements widened to int64; uint64 keeps its bit pattern.
  int64_t read_int(GgufValueType t, std::string_view what) {
    switch (t) {
      case GgufValueType::UINT8:
        return read<uint8_t>(what);
      case GgufValueType::INT8:
        return read<int8_t>(what);
      case GgufValueType::UINT16:
        return read<uint16_t>(what);
      case GgufValueType::INT16:
        return read<int16_t>(what);
      case GgufValueType::UINT32:
        return read<uint32_t>(what);
      case GgufValueType::INT32:
        return read<int32_t>(what);
      case GgufValueType::UINT64:
        return static_cast<int64_t>(read<uint64_t>(what));
      case GgufValueType::INT64:
        return read<int64_t>(what);
      case GgufValueType::BOOL:
        return read<uint8_t>(what) != 0 ? 1 : 0;
      default:
        break;
    }
    CT_ASSERT(false, "read_int on non-integer type {}", gguf_value_type_name(t));
    return 0;
  }

  double read_float(GgufValueType t, std::string_view what) {
    if (t == GgufValueType::FLOAT32) return read<float>(what);
    return read<double>(what);
  }

  void read_value(GgufValueType t, GgufValue& out, std::string_view what, int depth) {
    out.type = t;
    if (is_integer(t)) {
      out.i = read_int(t, what);
      out.u = static_cast<uint64_t>(out.i);
    } else if (is_float(t)) {
      out.f = read_float(t, what);
    } else if (t == GgufValueType::STRING) {
      out.s = read_string(what);
    } else {
      read_array(out, what, depth);
    }
  }

 private:
  void read_array(GgufValue& out, std::string_view what, int depth) {
    const size_t at = pos_;
    if (depth >= kMaxArrayDepth) {
      CT_THROW("{}: arrays nested more than {} deep at offset {} (while reading {})", path_,
               kMaxArrayDepth, at, what);
    }
    const uint32_t et_code = read<uint32_t>(what);
    if (!is_valid_type(et_code)) {
      CT_THROW("{}: unknown array element type {} at offset {}, expected 0..12 (while reading {})",
               path_, et_code, at, what);
    }
    const auto et = static_cast<GgufValueType>(et_code);
    const uint64_t n = read<uint64_t>(what);
    if (n > left() / min_encoded_size(et)) {
      CT_THROW(
          "{}: truncated while reading {}: an array of {} {} elements at offset {} cannot fit in "
          "the {} bytes left in the file",
          path_, what, n, gguf_value_type_name(et), at, left());
    }
    out.elem_type = et;
    if (is_integer(et)) {
      out.arr_i.reserve(n);
      for (uint64_t k = 0; k < n; ++k) out.arr_i.push_back(read_int(et, what));
    } else if (is_float(et)) {
      out.arr_f.reserve(n);
      for (uint64_t k = 0; k < n; ++k) out.arr_f.push_back(read_float(et, what));
    } else if (et == GgufValueType::STRING) {
      out.arr_s.reserve(n);
      for (uint64_t k = 0; k < n; ++k) out.arr_s.push_back(read_string(what));
    } else {
      out.arr.resize(n);
      for (uint64_t k = 0; k < n; ++k)
        read_value(GgufValueType::ARRAY, out.arr[k], what, depth + 1);
    }
  }

  const std::string& path_;
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

const GgufValue& require(const std::string& path, const GgufValue* v, const std::string& key) {
  if (v == nullptr) CT_THROW("{}: missing required key '{}'", path, key);
  return *v;
}

int64_t as_int(const std::string& path, const std::string& key, const GgufValue& v) {
  if (!is_integer(v.type)) {
    CT_THROW("{}: key '{}' has type {}, expected an integer", path, key, describe(v));
  }
  if (v.type == GgufValueType::UINT64 && v.u > (uint64_t)std::numeric_limits<int64_t>::max()) {
    CT_THROW("{}: key '{}' has value {}, expected at most {}", path, key, v.u,
             std::numeric_limits<int64_t>::max());
  }
  return v.i;
}

// Strict, as llama.cpp is: a float key stored with an integer type is refused rather than
// converted, because the usual way to get one is a corrupted type tag, whose value is then the
// float's bit pattern read as an integer (1e-5 becomes 925353388).
double as_float(const std::string& path, const std::string& key, const GgufValue& v) {
  if (is_float(v.type)) return v.f;
  CT_THROW("{}: key '{}' has type {}, expected a float", path, key, describe(v));
}

void check_array(const std::string& path, const std::string& key, const GgufValue& v,
                 bool (*elem_ok)(GgufValueType), const char* expected) {
  if (v.type != GgufValueType::ARRAY || !elem_ok(v.elem_type)) {
    CT_THROW("{}: key '{}' has type {}, expected {}", path, key, describe(v), expected);
  }
}

}  // namespace

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) CT_THROW("{}: cannot open GGUF file: {}", path, std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    CT_THROW("{}: cannot stat GGUF file: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    CT_THROW("{}: not a regular file, expected a GGUF file", path);
  }
  f->size_ = (size_t)st.st_size;
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      CT_THROW("{}: cannot map {} bytes: {}", path, f->size_, std::strerror(err));
    }
    f->map_ = m;
  }
  // The mapping keeps the file referenced; the descriptor is not needed afterwards.
  ::close(fd);
  f->parse(static_cast<const uint8_t*>(f->map_));
  return f;
}

std::unique_ptr<GgufFile> GgufFile::open_memory(const void* data, size_t size,
                                                const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->size_ = size;
  f->parse(static_cast<const uint8_t*>(data));
  return f;
}

void GgufFile::parse(const uint8_t* base) {
  const std::string& path = path_;
  Parser ps(path_, base, size_);

  const uint32_t magic = ps.read<uint32_t>("header");
  if (magic != kMagic) {
    CT_THROW("{}: bad magic 0x{:08x}, expected 'GGUF' (0x{:08x})", path, magic, kMagic);
  }
  const uint32_t version = ps.read<uint32_t>("header");
  if (version == 1) {
    CT_THROW(
        "{}: GGUF version 1 is not supported (expected 2 or 3); convert the model again with "
        "a current llama.cpp",
        path);
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped == 2 || swapped == 3) {
      CT_THROW(
          "{}: GGUF version field 0x{:08x} indicates a big-endian file; only little-endian "
          "GGUF is supported",
          path, version);
    }
    CT_THROW("{}: unsupported GGUF version {} (expected 2 or 3)", path, version);
  }
  version_ = version;
  const uint64_t n_tensors = ps.read<uint64_t>("header");
  const uint64_t n_kv = ps.read<uint64_t>("header");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = ps.read_string(fmt::format("the name of key #{}", k));
    const std::string what = fmt::format("key '{}'", key);
    const uint32_t type_code = ps.read<uint32_t>(what);
    if (!is_valid_type(type_code)) {
      CT_THROW("{}: key '{}' has unknown value type {} at offset {} (expected 0..12)", path, key,
               type_code, ps.pos() - 4);
    }
    GgufValue v;
    ps.read_value(static_cast<GgufValueType>(type_code), v, what, 0);
    if (!kv_.emplace(key, std::move(v)).second) CT_THROW("{}: duplicate key '{}'", path, key);
  }

  if (has("general.alignment")) {
    const int64_t a = get_int("general.alignment");
    if (a <= 0 || !std::has_single_bit((uint64_t)a)) {
      CT_THROW("{}: key 'general.alignment' is {}, expected a power of two", path, a);
    }
    alignment_ = (uint64_t)a;
  }

  // Counts are not trusted for allocation: every entry consumes bytes, so the loops below stop at
  // the end of the file, and a tensor info takes at least 32 bytes.
  tensors_.reserve(std::min<uint64_t>(n_tensors, ps.left() / 32));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo info;
    info.name = ps.read_string(fmt::format("the name of tensor info #{}", t));
    const std::string what = fmt::format("tensor info '{}'", info.name);
    const uint32_t n_dims = ps.read<uint32_t>(what);
    if (n_dims == 0 || n_dims > kMaxDims) {
      CT_THROW("{}: tensor '{}' has {} dimensions, expected 1..{}", path, info.name, n_dims,
               kMaxDims);
    }
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = ps.read<uint64_t>(what);
      if (ne > (uint64_t)std::numeric_limits<int64_t>::max()) {
        CT_THROW("{}: tensor '{}' dimension {} is {}, too large", path, info.name, d, ne);
      }
      info.ne.push_back((int64_t)ne);
    }
    info.type = static_cast<GgmlType>(ps.read<uint32_t>(what));
    info.offset = ps.read<uint64_t>(what);
    if (!tensor_index_.emplace(info.name, tensors_.size()).second) {
      CT_THROW("{}: duplicate tensor '{}'", path, info.name);
    }
    tensors_.push_back(std::move(info));
  }

  // The data section starts at the first aligned offset after the tensor infos.
  const uint64_t data_start = (ps.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensorInfo& info : tensors_) {
    int64_t n_el = 1;
    for (int64_t d : info.ne) {
      if (__builtin_mul_overflow(n_el, d, &n_el)) {
        CT_THROW("{}: tensor '{}' has more elements than fit in 64 bits", path, info.name);
      }
    }
    if (info.offset % alignment_ != 0) {
      CT_THROW("{}: tensor '{}' has data offset {}, expected a multiple of the alignment {}", path,
               info.name, info.offset, alignment_);
    }
    // Types we cannot convert keep nbytes 0 and are rejected by the model loader, which can name
    // the tensor and its use.
    uint64_t nbytes = 0;
    if (ggml_type_supported(info.type)) {
      const int64_t be = ggml_block_elems(info.type);
      if (info.ne[0] % be != 0) {
        CT_THROW(
            "{}: tensor '{}' of type {} has row length {}, expected a multiple of the block "
            "size {}",
            path, info.name, ggml_type_name(info.type), info.ne[0], be);
      }
      const uint64_t row = (uint64_t)(info.ne[0] / be) * ggml_block_bytes(info.type);
      const uint64_t rows = info.ne[0] == 0 ? 0 : (uint64_t)(n_el / info.ne[0]);
      if (__builtin_mul_overflow(row, rows, &nbytes)) {
        CT_THROW("{}: tensor '{}' is larger than 2^64 bytes", path, info.name);
      }
    }
    uint64_t start = 0, end = 0;
    if (__builtin_add_overflow(data_start, info.offset, &start) ||
        __builtin_add_overflow(start, nbytes, &end) || end > size_) {
      CT_THROW(
          "{}: tensor '{}' ({} bytes at offset {} of the data section, which starts at {}) "
          "extends past the end of the file ({} bytes); the file may be truncated",
          path, info.name, nbytes, info.offset, data_start, size_);
    }
    info.nbytes = (size_t)nbytes;
    info.data = base + start;
  }
  // Tensor data is laid out back to back in the order of the infos, each at the next aligned
  // offset (what llama.cpp writes and checks). A tensor whose type or shape was altered then
  // no longer fits its slot: it is named here rather than read as wrong weights.
  uint64_t expected = 0, end = 0;
  bool all_sized = true;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTensorInfo& info = tensors_[i];
    if (!ggml_type_supported(info.type)) {  // size unknown; the loader names the type
      all_sized = false;
      break;
    }
    if (info.offset != expected) {
      const GgufTensorInfo* prev = i > 0 ? &tensors_[i - 1] : nullptr;
      CT_THROW(
          "{}: tensor '{}' starts at data offset {}, expected {}{}: the type or shape of {} does "
          "not match its data",
          path, info.name, info.offset, expected,
          prev ? fmt::format(" (right after tensor '{}', type {}, {} bytes)", prev->name,
                             ggml_type_name(prev->type), prev->nbytes)
               : std::string(" (the start of the data section)"),
          prev ? fmt::format("'{}' or '{}'", prev->name, info.name) : "it");
    }
    end = info.offset + info.nbytes;
    expected = (end + alignment_ - 1) / alignment_ * alignment_;
  }
  // ... and the last one ends the file (up to its padding), so a shrunken last tensor is caught.
  if (all_sized && !tensors_.empty() && size_ - (data_start + end) >= alignment_) {
    const GgufTensorInfo& last = tensors_.back();
    CT_THROW(
        "{}: the last tensor '{}' (type {}, {} bytes) ends {} bytes before the end of the file, "
        "expected less than the alignment {}: its type or shape does not match the data",
        path, last.name, ggml_type_name(last.type), last.nbytes, size_ - (data_start + end),
        alignment_);
  }
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

int64_t GgufFile::get_int(const std::string& key) const {
  return as_int(path_, key, require(path_, find(key), key));
}

int64_t GgufFile::get_int(const std::string& key, int64_t def) const {
  const GgufValue* v = find(key);
  return v == nullptr ? def : as_int(path_, key, *v);
}

double GgufFile::get_float(const std::string& key) const {
  return as_float(path_, key, require(path_, find(key), key));
}

double GgufFile::get_float(const std::string& key, double def) const {
  const GgufValue* v = find(key);
  return v == nullptr ? def : as_float(path_, key, *v);
}

bool GgufFile::get_bool(const std::string& key, bool def) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return def;
  if (v->type != GgufValueType::BOOL) {
    CT_THROW("{}: key '{}' has type {}, expected a bool", path_, key, describe(*v));
  }
  return v->i != 0;
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = require(path_, find(key), key);
  if (v.type != GgufValueType::STRING) {
    CT_THROW("{}: key '{}' has type {}, expected a string", path_, key, describe(v));
  }
  return v.s;
}

std::string GgufFile::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = require(path_, find(key), key);
  check_array(
      path_, key, v, [](GgufValueType t) { return t == GgufValueType::STRING; },
      "an array of strings");
  return v.arr_s;
}

const std::vector<int64_t>& GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = require(path_, find(key), key);
  check_array(path_, key, v, is_integer, "an array of integers");
  if (v.elem_type == GgufValueType::UINT64) {
    for (size_t k = 0; k < v.arr_i.size(); ++k) {
      if (v.arr_i[k] < 0) {
        CT_THROW("{}: key '{}' element {} is {}, expected at most {}", path_, key, k,
                 (uint64_t)v.arr_i[k], std::numeric_limits<int64_t>::max());
      }
    }
  }
  return v.arr_i;
}

const std::vector<double>& GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = require(path_, find(key), key);
  check_array(path_, key, v, is_float, "an array of floats");
  return v.arr_f;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) {
    CT_THROW("{}: missing tensor '{}' (the file has {} tensors)", path_, name, tensors_.size());
  }
  return *t;
}

}  // namespace ct
