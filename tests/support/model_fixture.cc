// Lazily loaded real model shared by all tests of one binary.
#include "support/model_fixture.h"

#include <filesystem>
#include <map>
#include <mutex>

#include "core/model_registry.h"
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

const Model* registry_model(const std::string& name, std::string* why) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Model>> models;
  std::lock_guard<std::mutex> lock(mu);
  auto it = models.find(name);
  if (it == models.end()) {
    const Installed in = model_install_state(require_model(model_registry(), name), models_dir());
    std::unique_ptr<Model> m;
    if (in.state == InstallState::kAbsent || in.state == InstallState::kWrongSize) {
      *why = name + " is not installed at " + in.path + " (run: cachetune pull " + name + ")";
      return nullptr;
    }
    it = models.emplace(name, Model::load(in.path)).first;
  }
  return it->second.get();
}

}  // namespace ct::test
