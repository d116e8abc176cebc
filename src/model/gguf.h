// GGUF reader (versions 2 and 3): metadata of every value type and memory-mapped tensors.
// Errors name the file, the key or tensor, and what was expected.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/ggml_types.h"

namespace ct {

enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

std::string gguf_value_type_name(GgufValueType t);

// One metadata value. Scalars are widened: integers (and bool) into `i` (uint64 values above
// INT64_MAX keep their bit pattern in `u`), floats into `f`. Arrays keep their element type and
// hold their elements in exactly one of the vectors (nested arrays in `arr`); uint64 elements above
// INT64_MAX keep their bit pattern in `arr_i`.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string s;
  GgufValueType elem_type = GgufValueType::UINT8;  // for ARRAY
  std::vector<int64_t> arr_i;                      // integer and bool arrays
  std::vector<double> arr_f;                       // float arrays
  std::vector<std::string> arr_s;                  // string arrays
  std::vector<GgufValue> arr;                      // arrays of arrays
  size_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;        // dimensions, ne[0] is the fastest-varying (row length)
  uint64_t offset = 0;            // relative to the start of the data section
  const uint8_t* data = nullptr;  // points into the mapping
  size_t nbytes = 0;
  int64_t n_elements() const;
  int64_t n_rows() const { return ne.empty() ? 0 : n_elements() / ne[0]; }
};

class GgufFile {
 public:
  // Maps and parses the file; throws ct::Error on any malformation (bad magic, unsupported version,
  // truncation, a tensor extending past the end of file, unknown value type, misaligned offsets).
  // Tensor types the engine cannot convert are accepted here and rejected by the model loader.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses a GGUF image already in memory (the fuzz targets; same parser and checks as open).
  // The file does not copy or own the bytes: tensor data points into them, so they must outlive
  // the returned file. `name` stands for the path in error messages.
  static std::unique_ptr<GgufFile> open_memory(const void* data, size_t size,
                                               const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }

  // Metadata access. find() returns nullptr when absent; the typed getters throw ct::Error naming
  // the file and key when the key is missing or has an incompatible type/range.
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  int64_t get_int(const std::string& key) const;  // any integer or bool type
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key) const;  // FLOAT32/FLOAT64 only (integers refused)
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  const std::string& get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  // Integer or bool arrays; throws if a uint64 element exceeds INT64_MAX.
  const std::vector<int64_t>& get_int_array(const std::string& key) const;
  const std::vector<double>& get_float_array(const std::string& key) const;
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // Throws ct::Error naming the file and tensor if absent.
  const GgufTensorInfo& tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  // Parses size_ bytes at base (the mapping or the caller's buffer) into the metadata and tensors.
  void parse(const uint8_t* base);
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Writes GGUF v3 (or v2) files; used by tests to build tiny random models and malformed files.
class GgufWriter {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_str(const std::string& key, const std::string& v);
  void set_str_array(const std::string& key, const std::vector<std::string>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  // A generic value (any type, including nested arrays), for round-trip tests of every type.
  void set_value(const std::string& key, const GgufValue& v);
  // Adds a tensor from floats, converted to `type` with ggml_from_f32. ne[0] is the row length.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                  const float* data);
  // Adds a tensor from already packed bytes (any type code, for negative tests).
  void add_tensor_raw(const std::string& name, uint32_t type_code, const std::vector<int64_t>& ne,
                      const void* data, size_t nbytes);
  void set_alignment(uint32_t a);
  // Writes atomically (temporary file + rename). Throws ct::Error on I/O failure.
  void write(const std::string& path, uint32_t version = 3) const;

 private:
  struct Tensor {
    std::string name;
    uint32_t type_code;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace ct
