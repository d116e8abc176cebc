// Implementation of the invariant-failure path: print where and why, then abort.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace ct {

void abort_invariant(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: invariant failed: %s %s\n", file, line, expr, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ct
