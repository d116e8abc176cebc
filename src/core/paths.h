// Default locations: the models directory (CACHETUNE_MODEL_DIR, else ~/.cache/cachetune/models)
// and the default model file inside it (CACHETUNE_MODEL overrides the whole path). Which file is
// the default is the first row of the model registry (core/model_registry.h).
#pragma once

#include <cstdlib>
#include <string>

namespace ct {

inline std::string models_dir() {
  if (const char* d = std::getenv("CACHETUNE_MODEL_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/cachetune/models";
}

// The chunk cache of the disk tier: $CACHETUNE_CACHE_DIR or ~/.cache/cachetune/chunks.
inline std::string default_cache_dir() {
  if (const char* d = std::getenv("CACHETUNE_CACHE_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/cachetune/chunks";
}

// $CACHETUNE_CALIBRATION or ~/.cache/cachetune/calibration.json
inline std::string default_calibration_path() {
  if (const char* p = std::getenv("CACHETUNE_CALIBRATION"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/cachetune/calibration.json";
}

// $CACHETUNE_MODEL, else the registry's default file in models_dir() (defined in
// model_registry.cc); a path whether or not the file exists (resolve_model checks).
std::string default_model_path();

}  // namespace ct
