// Default locations: the models directory (CACHETUNE_MODEL_DIR, else ~/.cache/cachetune/models)
// and the default model file inside it (CACHETUNE_MODEL overrides the whole path).
#pragma once

#include <cstdlib>
#include <string>

namespace ct {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

inline std::string models_dir() {
  if (const char* d = std::getenv("CACHETUNE_MODEL_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/cachetune/models";
}

inline std::string default_model_path() {
  if (const char* m = std::getenv("CACHETUNE_MODEL"); m && *m) return m;
  return models_dir() + "/" + kDefaultModelFile;
}

}  // namespace ct
