// read_data_jsonl: line-precise errors for the shared data files.
#include "core/data_jsonl.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace ct {
namespace {

using nlohmann::json;

std::string field_string(const json& j, const char* key, bool required, const std::string& where) {
  if (!j.contains(key)) {
    CT_THROW_IF_NOT(!required, "{}: missing field '{}'", where, key);
    return "";
  }
  CT_THROW_IF_NOT(j[key].is_string(), "{}: field '{}' must be a string, got {}", where, key,
                  j[key].type_name());
  return j[key].get<std::string>();
}

std::vector<std::string> field_strings(const json& j, const char* key, bool required,
                                       const std::string& where) {
  if (!j.contains(key)) {
    CT_THROW_IF_NOT(!required, "{}: missing field '{}'", where, key);
    return {};
  }
  const json& a = j[key];
  CT_THROW_IF_NOT(a.is_array(), "{}: field '{}' must be a list of strings, got {}", where, key,
                  a.type_name());
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i) {
    CT_THROW_IF_NOT(a[i].is_string(), "{}: {}[{}] must be a string, got {}", where, key, i,
                    a[i].type_name());
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

}  // namespace

std::vector<DataExample> read_data_jsonl(const std::string& path, const DataReadOptions& opt) {
  std::ifstream in(path, std::ios::binary);
  CT_THROW_IF_NOT(in.good(), "cannot open data file '{}'", path);
  std::vector<DataExample> out;
  std::set<std::string> ids;
  std::string line;
  for (int ln = 1; (opt.limit <= 0 || (int)out.size() < opt.limit) && std::getline(in, line);
       ++ln) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(ln);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      CT_THROW("{}: invalid JSON ({})", where, e.what());
    }
    CT_THROW_IF_NOT(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
    DataExample ex;
    ex.id = field_string(j, "id", opt.eval_fields, where);
    ex.task = field_string(j, "task", opt.eval_fields, where);
    ex.chunks = field_strings(j, "chunks", true, where);
    ex.question = field_string(j, "question", opt.question, where);
    ex.answers = field_strings(j, "answers", opt.eval_fields, where);
    CT_THROW_IF_NOT(!ex.chunks.empty(), "{}: example '{}' has no chunks", where, ex.id);
    for (size_t i = 0; i < ex.chunks.size(); ++i) {
      CT_THROW_IF_NOT(!ex.chunks[i].empty(), "{}: example '{}' chunk {} is empty", where, ex.id, i);
    }
    if (opt.eval_fields) {
      CT_THROW_IF_NOT(ids.insert(ex.id).second, "{}: duplicate example id '{}'", where, ex.id);
    }
    ex.file = path;
    ex.line = ln;
    out.push_back(std::move(ex));
  }
  CT_THROW_IF_NOT(!in.bad(), "read error in data file '{}'", path);
  CT_THROW_IF_NOT(opt.allow_empty || !out.empty(), "data file '{}' holds no examples", path);
  return out;
}

}  // namespace ct
