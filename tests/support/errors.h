// The message of the ct::Error a callable throws, for tests that check what an error names.
#pragma once

#include <exception>
#include <string>

#include "core/error.h"

namespace ct::test {

// e.what() of the ct::Error `f` throws; a text that no expected substring matches when it throws
// nothing or another exception type (the test's substring check then fails, naming it).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a ct::Error: ") + e.what() + ")";
  }
  return "(no ct::Error thrown)";
}

}  // namespace ct::test
