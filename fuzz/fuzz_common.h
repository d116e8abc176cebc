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

// Calls f(c) for each byte of JSON text outside strings: a string's opening quote, not its
// contents (escapes followed) or its closing quote.
template <class F>
void for_each_outside_strings(const char* s, size_t n, F f) {
  bool in_str = false, esc = false;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = (unsigned char)s[i];
    if (in_str) {
      if (esc) {
        esc = false;
      } else if (c == '\\') {
        esc = true;
      } else if (c == '"') {
        in_str = false;
      }
      continue;
    }
    if (c == '"') in_str = true;
    f(c);
  }
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
