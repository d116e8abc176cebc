// SHA-256 (FIPS 180-4), used for content-addressed chunk ids, model fingerprints and checksums.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ct {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  template <typename T>
  void update_pod(const T& v) {
    update(&v, sizeof(T));
  }
  std::array<uint8_t, 32> digest();  // finalises; the object must not be updated afterwards
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);
std::string to_hex(const uint8_t* p, size_t n);

}  // namespace ct
