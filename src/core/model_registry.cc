// Parsing the model registry, resolving --model, and reading the verification sidecar.
#include "core/model_registry.h"

#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/models_tsv.h"
#include "core/paths.h"

namespace ct {
namespace {

constexpr const char* kColumns[] = {"name",    "file",    "bytes", "sha256", "package",
                                    "version", "parts", "member", "r_min"};
constexpr size_t kNumColumns = sizeof(kColumns) / sizeof(kColumns[0]);
constexpr size_t kRequiredColumns = kNumColumns - 1;  // r_min is optional

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

bool all_of(const std::string& s, int (*pred)(int)) {
  for (unsigned char ch : s) {
    if (!pred(ch)) return false;
  }
  return !s.empty();
}

int is_lower_hex(int ch) { return std::isdigit(ch) || (ch >= 'a' && ch <= 'f'); }
int is_name_char(int ch) { return std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-'; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CT_THROW_IF_NOT(f.good(), "cannot open model registry '{}' (named by CACHETUNE_MODELS_TSV)",
                  path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<ModelEntry> parse_model_registry(const std::string& text, const std::string& source) {
  std::vector<ModelEntry> reg;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos || line[0] == '#') continue;
    const auto cols = split_tabs(line);
    bool header = cols.size() == kNumColumns || cols.size() == kRequiredColumns;
    for (size_t i = 0; header && i < cols.size(); ++i) header = cols[i] == kColumns[i];
    if (header) continue;
    CT_THROW_IF_NOT(cols.size() == kNumColumns || cols.size() == kRequiredColumns,
                    "{}:{}: {} tab-separated columns, expected {} (name file bytes sha256 package "
                    "version parts member) or {} (and r_min)",
                    source, n, cols.size(), kRequiredColumns, kNumColumns);
    ModelEntry e;
    e.name = cols[0];
    e.file = cols[1];
    e.sha256 = cols[3];
    e.package = cols[4];
    e.version = cols[5];
    e.member = cols[7];
    CT_THROW_IF_NOT(all_of(e.name, is_name_char) && std::isalnum((unsigned char)e.name[0]),
                    "{}:{}: name '{}': expected letters, digits, '.', '_' or '-'", source, n,
                    e.name);
    CT_THROW_IF_NOT(e.file.find('/') == std::string::npos && ends_with(e.file, ".gguf"),
                    "{}:{}: file '{}': expected a plain *.gguf name", source, n, e.file);
    CT_THROW_IF_NOT(all_of(cols[2], [](int ch) -> int { return std::isdigit(ch); }) &&
                        cols[2].size() <= 18 && std::stoull(cols[2]) > 0,
                    "{}:{}: bytes '{}': expected a positive integer", source, n, cols[2]);
    e.bytes = std::stoull(cols[2]);
    CT_THROW_IF_NOT(e.sha256.size() == 64 && all_of(e.sha256, is_lower_hex),
                    "{}:{}: sha256 '{}': expected 64 lowercase hex digits", source, n, e.sha256);
    CT_THROW_IF_NOT(all_of(cols[6], [](int ch) -> int { return std::isdigit(ch); }) &&
                        cols[6].size() <= 6 && std::stoi(cols[6]) > 0,
                    "{}:{}: parts '{}': expected a positive integer", source, n, cols[6]);
    e.parts = std::stoi(cols[6]);
    CT_THROW_IF_NOT(!e.package.empty() && !e.version.empty() && !e.member.empty(),
                    "{}:{}: model '{}' has an empty package, version or member", source, n, e.name);
    if (cols.size() == kNumColumns && cols[8] != "-") {
      const std::string& v = cols[8];
      // Plain decimals only (as tools/fetch_model.py takes them): no sign, space or hex form.
      const bool plain = !v.empty() && v.find_first_not_of("0123456789.eE-+") == std::string::npos &&
                         (std::isdigit((unsigned char)v[0]) || v[0] == '.');
      size_t used = 0;
      double r = -1;
      try {
        if (plain) r = std::stod(v, &used);
      } catch (const std::exception&) {
      }
      CT_THROW_IF_NOT(plain && used == v.size() && r > 0 && r <= 1,
                      "{}:{}: r_min '{}': expected a number in (0, 1] or '-'", source, n, v);
      e.r_min = r;
    }
    CT_THROW_IF_NOT(find_model(reg, e.name) == nullptr, "{}:{}: name '{}' appears twice", source, n,
                    e.name);
    reg.push_back(std::move(e));
  }
  CT_THROW_IF_NOT(!reg.empty(), "{}: no models (expected at least one row)", source);
  return reg;
}

std::vector<ModelEntry> model_registry() {
  if (const char* p = std::getenv("CACHETUNE_MODELS_TSV"); p && *p) {
    return parse_model_registry(read_text(p), p);
  }
  return parse_model_registry(detail::kBuiltinModelsTsv, detail::kBuiltinModelsTsvSource);
}

const ModelEntry* find_model(const std::vector<ModelEntry>& reg, const std::string& name) {
  for (const auto& e : reg) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string model_names(const std::vector<ModelEntry>& reg) {
  std::string s;
  for (const auto& e : reg) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

const ModelEntry& require_model(const std::vector<ModelEntry>& reg, const std::string& name) {
  const ModelEntry* e = find_model(reg, name);
  CT_THROW_IF_NOT(e != nullptr, "unknown model '{}'; known: {}", name, model_names(reg));
  return *e;
}

const char* install_state_name(InstallState s) {
  switch (s) {
    case InstallState::kAbsent:
      return "absent";
    case InstallState::kWrongSize:
      return "wrong size";
    case InstallState::kUnverified:
      return "unverified";
    case InstallState::kVerified:
      return "verified";
  }
  return "?";
}

Installed model_install_state(const ModelEntry& e, const std::string& dir) {
  Installed r;
  r.path = dir + "/" + e.file;
  struct stat st {};
  if (::stat(r.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return r;
  r.size = (uint64_t)st.st_size;
  if (r.size != e.bytes) {
    r.state = InstallState::kWrongSize;
    return r;
  }
  r.state = InstallState::kUnverified;
  std::ifstream side(r.path + ".verified");
  std::string sha;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  if (side >> sha >> size >> mtime_ns) {
    const int64_t now_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (sha == e.sha256 && size == r.size && mtime_ns == now_ns) r.state = InstallState::kVerified;
  }
  return r;
}

std::string resolve_model(const std::string& name_or_path) {
  if (name_or_path.empty()) {
    if (const char* m = std::getenv("CACHETUNE_MODEL"); m && *m) return m;
  }
  const auto reg = model_registry();
  const ModelEntry* e = name_or_path.empty() ? &reg.front() : find_model(reg, name_or_path);
  if (e != nullptr) {
    const Installed in = model_install_state(*e, models_dir());
    CT_THROW_IF_NOT(in.state != InstallState::kAbsent,
                    "model '{}'{} is not installed (expected {}): run: cachetune pull {}", e->name,
                    name_or_path.empty() ? " (the default)" : "", in.path, e->name);
    CT_THROW_IF_NOT(in.state != InstallState::kWrongSize,
                    "model '{}': {} has {} bytes, expected {}: run: cachetune pull {}", e->name,
                    in.path, in.size, e->bytes, e->name);
    return in.path;
  }
  struct stat st {};
  CT_THROW_IF_NOT(::stat(name_or_path.c_str(), &st) == 0,
                  "--model '{}': no such file, and not a model name (known: {}; `cachetune "
                  "models` lists them)",
                  name_or_path, model_names(reg));
  return name_or_path;
}

std::string default_model_path() {
  if (const char* m = std::getenv("CACHETUNE_MODEL"); m && *m) return m;
  return models_dir() + "/" + model_registry().front().file;
}

double model_r_min(const std::string& model_path) {
  struct stat st {};
  if (::stat(model_path.c_str(), &st) != 0) return kDefaultRMin;
  const size_t slash = model_path.find_last_of('/');
  const std::string base = slash == std::string::npos ? model_path : model_path.substr(slash + 1);
  for (const ModelEntry& e : model_registry()) {
    if (e.file == base && e.bytes == (uint64_t)st.st_size && e.r_min > 0) return e.r_min;
  }
  return kDefaultRMin;
}

}  // namespace ct
