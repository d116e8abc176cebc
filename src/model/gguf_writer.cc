// GGUF writer (versions 2 and 3, which share one layout): builds tiny models and malformed files
// for tests. The file is assembled in memory and published atomically, so a reader never sees a
// half-written model.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "model/gguf.h"

namespace ct {
namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_str(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

void put_int(std::string& out, GgufValueType t, int64_t v) {
  switch (t) {
    case GgufValueType::UINT8:
      put<uint8_t>(out, (uint8_t)v);
      return;
    case GgufValueType::INT8:
      put<int8_t>(out, (int8_t)v);
      return;
    case GgufValueType::UINT16:
      put<uint16_t>(out, (uint16_t)v);
      return;
    case GgufValueType::INT16:
      put<int16_t>(out, (int16_t)v);
      return;
    case GgufValueType::UINT32:
      put<uint32_t>(out, (uint32_t)v);
      return;
    case GgufValueType::INT32:
      put<int32_t>(out, (int32_t)v);
      return;
    case GgufValueType::UINT64:
      put<uint64_t>(out, (uint64_t)v);
      return;
    case GgufValueType::INT64:
      put<int64_t>(out, v);
      return;
    case GgufValueType::BOOL:
      put<uint8_t>(out, v != 0 ? 1 : 0);
      return;
    default:
      break;
  }
  CT_ASSERT(false, "put_int on non-integer type {}", gguf_value_type_name(t));
}

void put_float(std::string& out, GgufValueType t, double v) {
  if (t == GgufValueType::FLOAT32) {
    put<float>(out, (float)v);
  } else {
    put<double>(out, v);
  }
}

bool is_float(GgufValueType t) {
  return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

// Element type, count and elements of an ARRAY value (the part that follows its type code).
void put_array_body(std::string& out, const std::string& key, const GgufValue& v) {
  CT_THROW_IF_NOT(v.type == GgufValueType::ARRAY,
                  "GgufWriter: key '{}' has a nested element of type {}, expected array", key,
                  gguf_value_type_name(v.type));
  put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  put<uint64_t>(out, v.array_size());
  if (v.elem_type == GgufValueType::STRING) {
    for (const std::string& s : v.arr_s) put_str(out, s);
  } else if (v.elem_type == GgufValueType::ARRAY) {
    for (const GgufValue& e : v.arr) put_array_body(out, key, e);
  } else if (is_float(v.elem_type)) {
    for (double f : v.arr_f) put_float(out, v.elem_type, f);
  } else {
    for (int64_t i : v.arr_i) put_int(out, v.elem_type, i);
  }
}

void put_value(std::string& out, const std::string& key, const GgufValue& v) {
  put<uint32_t>(out, static_cast<uint32_t>(v.type));
  switch (v.type) {
    case GgufValueType::STRING:
      put_str(out, v.s);
      return;
    case GgufValueType::ARRAY:
      put_array_body(out, key, v);
      return;
    case GgufValueType::FLOAT32:
    case GgufValueType::FLOAT64:
      put_float(out, v.type, v.f);
      return;
    // uint64 values above INT64_MAX live in `u`; smaller ones may be given in either field.
    case GgufValueType::UINT64:
      put<uint64_t>(out, v.u != 0 ? v.u : (uint64_t)v.i);
      return;
    default:
      put_int(out, v.type, v.i);
      return;
  }
}

void pad_to(std::string& out, uint64_t alignment) {
  out.append((alignment - out.size() % alignment) % alignment, '\0');
}

GgufValue scalar(GgufValueType t) {
  GgufValue v;
  v.type = t;
  return v;
}

GgufValue array_of(GgufValueType et) {
  GgufValue v;
  v.type = GgufValueType::ARRAY;
  v.elem_type = et;
  return v;
}

}  // namespace

void GgufWriter::set_value(const std::string& key, const GgufValue& v) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = v;
      return;
    }
  }
  kv_.emplace_back(key, v);
}

void GgufWriter::set_u32(const std::string& key, uint32_t x) {
  GgufValue v = scalar(GgufValueType::UINT32);
  v.i = x;
  v.u = x;
  set_value(key, v);
}

void GgufWriter::set_i32(const std::string& key, int32_t x) {
  GgufValue v = scalar(GgufValueType::INT32);
  v.i = x;
  v.u = (uint64_t)(int64_t)x;
  set_value(key, v);
}

void GgufWriter::set_u64(const std::string& key, uint64_t x) {
  GgufValue v = scalar(GgufValueType::UINT64);
  v.i = (int64_t)x;
  v.u = x;
  set_value(key, v);
}

void GgufWriter::set_f32(const std::string& key, float x) {
  GgufValue v = scalar(GgufValueType::FLOAT32);
  v.f = x;
  set_value(key, v);
}

void GgufWriter::set_bool(const std::string& key, bool x) {
  GgufValue v = scalar(GgufValueType::BOOL);
  v.i = x ? 1 : 0;
  v.u = (uint64_t)v.i;
  set_value(key, v);
}

void GgufWriter::set_str(const std::string& key, const std::string& x) {
  GgufValue v = scalar(GgufValueType::STRING);
  v.s = x;
  set_value(key, v);
}

void GgufWriter::set_str_array(const std::string& key, const std::vector<std::string>& x) {
  GgufValue v = array_of(GgufValueType::STRING);
  v.arr_s = x;
  set_value(key, v);
}

void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& x) {
  GgufValue v = array_of(GgufValueType::INT32);
  v.arr_i.assign(x.begin(), x.end());
  set_value(key, v);
}

void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& x) {
  GgufValue v = array_of(GgufValueType::FLOAT32);
  v.arr_f.assign(x.begin(), x.end());
  set_value(key, v);
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                            const float* data) {
  CT_THROW_IF_NOT(!ne.empty() && ne.size() <= 4,
                  "GgufWriter: tensor '{}' has {} dimensions, expected 1..4", name, ne.size());
  int64_t n = 1;
  for (int64_t d : ne) {
    CT_THROW_IF_NOT(d >= 0, "GgufWriter: tensor '{}' has negative dimension {}", name, d);
    n *= d;
  }
  CT_THROW_IF_NOT(ne[0] % ggml_block_elems(type) == 0,
                  "GgufWriter: tensor '{}' of type {} has row length {}, expected a multiple of {}",
                  name, ggml_type_name(type), ne[0], ggml_block_elems(type));
  const size_t rows = ne[0] == 0 ? 0 : (size_t)(n / ne[0]);
  Tensor t{name, static_cast<uint32_t>(type), ne, {}};
  t.bytes.resize(ggml_row_bytes(type, ne[0]) * rows);
  ggml_from_f32(type, data, t.bytes.data(), n);
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor_raw(const std::string& name, uint32_t type_code,
                                const std::vector<int64_t>& ne, const void* data, size_t nbytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back(Tensor{name, type_code, ne, std::vector<uint8_t>(p, p + nbytes)});
}

void GgufWriter::set_alignment(uint32_t a) {
  CT_THROW_IF_NOT(a > 0 && std::has_single_bit(a), "GgufWriter: alignment {} is not a power of two",
                  a);
  alignment_ = a;
  set_u32("general.alignment", a);
}

void GgufWriter::write(const std::string& path, uint32_t version) const {
  CT_THROW_IF_NOT(version == 2 || version == 3,
                  "{}: GgufWriter can write GGUF versions 2 and 3, not {}", path, version);
  std::string out;
  put<uint32_t>(out, 0x46554747);  // "GGUF"
  put<uint32_t>(out, version);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [key, v] : kv_) {
    put_str(out, key);
    put_value(out, key, v);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_str(out, t.name);
    put<uint32_t>(out, (uint32_t)t.ne.size());
    for (int64_t d : t.ne) put<uint64_t>(out, (uint64_t)d);
    put<uint32_t>(out, t.type_code);
    put<uint64_t>(out, offset);
    offset += (t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  pad_to(out, alignment_);
  for (const Tensor& t : tensors_) {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    pad_to(out, alignment_);
  }

  write_file_atomic(path, out);
}

}  // namespace ct
