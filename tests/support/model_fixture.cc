// Lazily loaded real model shared by all tests of one binary.
#include "support/model_fixture.h"

#include <filesystem>
#include <mutex>

#include "core/paths.h"

namespace ct::test {

std::string real_model_path() { return default_model_path(); }

const Model* real_model() {
  static std::once_flag once;
  static std::unique_ptr<Model> model;
  std::call_once(once, [] {
    if (std::filesystem::exists(real_model_path())) model = Model::load(real_model_path());
  });
  return model.get();
}

}  // namespace ct::test
