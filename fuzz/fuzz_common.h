// Shared helpers of the libFuzzer targets: how a finding is reported, and a byte reader that
// carves fuzzer input into fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ct::fuzz {

// A broken promise that is not a sanitizer report (a wrong result, an unexpected exception type):
// aborting makes libFuzzer keep the input as a crash.
[[noreturn]] inline void finding(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz finding: %s %s\n", what, detail);
  std::abort();
}

// Takes fixed-size fields off the front of the input; missing bytes read as zero so every input,
// however short, is a valid program for the target.
class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  T take() {
    T v{};
    const size_t k = n_ < sizeof(T) ? n_ : sizeof(T);
    if (k) std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace ct::fuzz
