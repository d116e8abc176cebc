// JSON persistence of calibration entries with atomic replace, and the host identity used in keys.
// Schema: {"format": "cachetune-calibration", "version": 1, "entries": [ {...}, ... ]}.
#include "sched/calibration_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ct::sched {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "cachetune-calibration";
constexpr int kVersion = 1;

json entry_to_json(const CalibrationEntry& e) {
  json probes = json::array();
  for (const GoldenSectionProbe& p : e.probes) {
    probes.push_back({{"r", p.r}, {"value", p.value}, {"paired", p.paired}});
  }
  return {{"model_fingerprint", e.key.model_fingerprint},
          {"backend", e.key.backend},
          {"tier", e.key.tier},
          {"machine", e.key.machine},
          {"kv_dtype", e.key.kv_dtype},
          {"cache_type", e.key.cache_type},
          {"profile", {{"t_c", e.profile.t_c}, {"t_i", e.profile.t_i}, {"t_o", e.profile.t_o}}},
          {"analytic_r", e.analytic_r},
          {"chosen_r", e.chosen_r},
          {"probes", probes},
          {"timestamp_unix", e.timestamp_unix}};
}

// json::at and get<T> throw json::exception on a missing field or a wrong type, and shape errors
// throw std::invalid_argument; the caller turns both into a ct::Error naming the file.
CalibrationEntry entry_from_json(const json& j) {
  CalibrationEntry e;
  e.key.model_fingerprint = j.at("model_fingerprint").get<std::string>();
  e.key.backend = j.at("backend").get<std::string>();
  e.key.tier = j.at("tier").get<std::string>();
  e.key.machine = j.at("machine").get<std::string>();
  // Entries written before the K/V type was part of the key read as "" and so match no engine:
  // they are recalibrated rather than applied to a dtype they were not measured with.
  e.key.kv_dtype = j.value("kv_dtype", std::string());
  // Entries written before the live cache had a type were measured with F32 caches.
  e.key.cache_type = j.value("cache_type", std::string("f32"));
  const json& profile = j.at("profile");
  e.profile.t_c = profile.at("t_c").get<double>();
  e.profile.t_i = profile.at("t_i").get<double>();
  e.profile.t_o = profile.at("t_o").get<double>();
  e.analytic_r = j.at("analytic_r").get<double>();
  e.chosen_r = j.at("chosen_r").get<double>();
  const json& probes = j.at("probes");
  if (!probes.is_array()) throw std::invalid_argument("\"probes\" is not an array");
  for (const json& p : probes) {
    e.probes.push_back(
        {p.at("r").get<double>(), p.at("value").get<double>(), p.value("paired", false)});
  }
  e.timestamp_unix = j.at("timestamp_unix").get<int64_t>();
  return e;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CT_THROW_IF_NOT(in, "calibration store {}: cannot open for reading: {}", path,
                  std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  CT_THROW_IF_NOT(!in.bad(), "calibration store {}: read failed", path);
  return text.str();
}

}  // namespace

CalibrationStore CalibrationStore::load(const std::string& path) {
  CalibrationStore store;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) return store;
  const std::string text = read_file(path);
  try {
    const json root = json::parse(text);
    CT_THROW_IF_NOT(root.is_object() && root.value("format", "") == kFormat,
                    "calibration store {}: missing \"format\": \"{}\"; not a calibration file",
                    path, kFormat);
    const int version = root.at("version").get<int>();
    CT_THROW_IF_NOT(version == kVersion, "calibration store {}: version {}, expected {}", path,
                    version, kVersion);
    const json& entries = root.at("entries");
    CT_THROW_IF_NOT(entries.is_array(), "calibration store {}: \"entries\" is not an array", path);
    for (const json& j : entries) store.store(entry_from_json(j));
  } catch (const json::exception& e) {
    CT_THROW("calibration store {}: corrupt JSON: {}", path, e.what());
  } catch (const std::invalid_argument& e) {
    CT_THROW("calibration store {}: corrupt entry: {}", path, e.what());
  }
  return store;
}

CalibrationStore CalibrationStore::load_or_empty(const std::string& path, std::string* error) {
  try {
    return load(path);
  } catch (const ct::Error& e) {
    if (error) {
      *error = e.what();
    } else {
      std::fprintf(stderr, "warning: %s; starting from an empty calibration store\n", e.what());
    }
    return {};
  }
}

void CalibrationStore::save(const std::string& path) const {
  json root = {{"format", kFormat}, {"version", kVersion}, {"entries", json::array()}};
  for (const CalibrationEntry& e : entries_) root["entries"].push_back(entry_to_json(e));
  const std::string text = root.dump(2) + "\n";

  try {
    write_file_atomic(path, text);
  } catch (const Error& e) {
    CT_THROW("calibration store: {}", e.what());
  }
}

const CalibrationEntry* CalibrationStore::find(const CalibrationKey& key) const {
  for (const CalibrationEntry& e : entries_) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

void CalibrationStore::store(CalibrationEntry entry) {
  for (CalibrationEntry& e : entries_) {
    if (e.key == entry.key) {
      e = std::move(entry);
      return;
    }
  }
  entries_.push_back(std::move(entry));
}

std::string machine_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        const size_t begin = line.find_first_not_of(" \t", colon + 1);
        if (begin != std::string::npos) cpu = line.substr(begin);
      }
      break;
    }
  }
  return "host=" + std::string(host) + ";cpu=" + cpu +
         ";cores=" + std::to_string(std::thread::hardware_concurrency());
}

}  // namespace ct::sched
