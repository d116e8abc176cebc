// Error handling in two tiers (see docs/ARCHITECTURE.md):
//  - CT_ASSERT: a broken internal invariant; aborts with file:line.
//  - CT_THROW_IF_NOT / ct::Error: bad input or I/O failure; the message names the file, the value
//    and what was expected, and the caller may recover.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ct {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void abort_invariant(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace ct

#define CT_ASSERT(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) ::ct::abort_invariant(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

#define CT_THROW_IF_NOT(cond, ...)                                   \
  do {                                                               \
    if (!(cond)) throw ::ct::Error(::fmt::format(__VA_ARGS__));      \
  } while (0)

#define CT_THROW(...) throw ::ct::Error(::fmt::format(__VA_ARGS__))
