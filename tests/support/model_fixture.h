// Shared access to the real default model for tests labelled "model": loaded once per test
// binary; tests GTEST_SKIP cleanly when the file is absent.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace ct::test {

// The real model, or nullptr when the file does not exist (the caller skips).
const Model* real_model();
std::string real_model_path();

// A registry model (tools/models.tsv) by name, loaded once per test binary; nullptr when it is
// not installed at the registry's size, with `why` saying what to run.
const Model* registry_model(const std::string& name, std::string* why);

}  // namespace ct::test

#define CT_REQUIRE_REAL_MODEL(m)                                                        \
  const ::ct::Model* m = ::ct::test::real_model();                                      \
  if (!m) GTEST_SKIP() << "model file not found: " << ::ct::test::real_model_path()     \
                       << " (run tools/fetch_model.sh or set CACHETUNE_MODEL)"

#define CT_REQUIRE_REGISTRY_MODEL(m, name)                       \
  std::string m##_why;                                           \
  const ::ct::Model* m = ::ct::test::registry_model(name, &m##_why); \
  if (!m) GTEST_SKIP() << m##_why
