#include "eval/results_io.h"

#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"
#include "eval/plan.h"
#include "reuse/encoder.h"
#include "reuse/policy/probe.h"

namespace ct::eval {

using nlohmann::json;
namespace fs = std::filesystem;

std::set<std::string> load_done_keys(const std::string& path,
                                     const std::function<void(const std::string&)>& log) {
  std::set<std::string> done;
  if (!fs::exists(path)) return done;
  std::ifstream in(path, std::ios::binary);
  CT_THROW_IF_NOT(in.good(), "cannot read results file '{}'", path);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0, good_end = 0;
  for (int ln = 1; pos < all.size(); ++ln) {
    const size_t nl = all.find('\n', pos);
    const bool complete = nl != std::string::npos;
    const std::string line = all.substr(pos, complete ? nl - pos : std::string::npos);
    json j;
    bool ok = complete;
    if (ok && line.find_first_not_of(" \t\r") != std::string::npos) {
      try {
        j = json::parse(line);
        ok =
            j.is_object() && j.contains("example") && j.contains("setting") && j.contains("policy");
      } catch (const json::parse_error&) {
        ok = false;
      }
      if (ok) done.insert(unit_key(j["example"], j["setting"], j["policy"]));
    }
    if (!ok) {
      CT_THROW_IF_NOT(!complete,
                      "{}:{}: not a result record (expected a JSON object with "
                      "example, setting and policy); fix or remove the line",
                      path, ln);
      if (log)
        log(fmt::format("{}:{}: dropping an unfinished last line ({} bytes)", path, ln,
                        line.size()));
      fs::resize_file(path, good_end);
      break;
    }
    pos = nl + 1;
    good_end = pos;
  }
  return done;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(" \t", c + 1));
    }
  }
  return "unknown";
}

namespace {

// The 1/5/15-minute load averages: TTFT on a shared machine depends on what else runs.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? a + " " + b + " " + c : "unknown";
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Settings that change the numbers of a unit: a directory holds results of one configuration.
json result_config(const Model& m, const EvalOptions& o) {
  return {{"model", fs::path(m.path()).filename().string()},
          {"model_fingerprint", m.fingerprint()},
          {"ratio", o.ratio},
          {"alpha", o.alpha},
          {"max_tokens_qa", o.max_tokens_qa},
          {"max_tokens_summary", o.max_tokens_summary},
          {"kl_positions", o.kl_positions},
          {"extra_context_tokens", o.extra_context_tokens},
          {"seed", o.seed},
          {"n_bands", o.n_bands},
          {"kv_dtype", kv_dtype_name(o.dtype)},
          {"sink", o.sink},
          {"rank", rank_mode_name(EncodeOptions().rank.mode)},
          {"probe", fmt::format("{} (layers {})", probe_params(o.probe),
                                probe_layers(o.probe, m.config().n_layer))},
          {"decoding", "greedy"}};
}

void write_run_json(const std::string& path, const json& run) {
  write_file_atomic(path, run.dump(2) + "\n");
}

}  // namespace

void update_run_json(const Model& m, const EvalOptions& o, const std::string& dir) {
  const std::string path = dir + "/" + kRunFile;
  const json cfg = result_config(m, o);
  json run;
  if (fs::exists(path)) {
    std::ifstream in(path);
    try {
      run = json::parse(in);
    } catch (const json::parse_error& e) {
      CT_THROW("{}: invalid JSON ({})", path, e.what());
    }
    const json& old = run["config"];
    for (auto it = cfg.begin(); it != cfg.end(); ++it) {
      // A setting added after the directory was started (the probe context) did not affect the
      // policies recorded before it: it is adopted and applies from now on.
      if (!old.contains(it.key()) && (it.key() == "probe" || it.key() == "rank")) {
        run["config"][it.key()] = it.value();
        continue;
      }
      CT_THROW_IF_NOT(old.contains(it.key()) && old[it.key()] == it.value(),
                      "{}: this directory holds results with {} = {}, but this run uses {}; "
                      "write to another --out directory",
                      path, it.key(), old.contains(it.key()) ? old[it.key()].dump() : "(unset)",
                      it.value().dump());
    }
  } else {
    run["config"] = cfg;
    run["invocations"] = json::array();
  }
  std::vector<std::string> pols;
  for (const Policy* k : o.policies) pols.push_back(k->name());
  std::vector<std::string> sweep;
  for (const Policy* k : o.sweep_policies) sweep.push_back(k->name());
  run["machine"] = {
      {"cpu", cpu_model()},
      {"cores", std::thread::hardware_concurrency()},
      {"omp_wait_policy", std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : ""}};
  run["model_path"] = m.path();
  run["invocations"].push_back({{"command", o.command},
                                {"started", now_utc()},
                                {"loadavg_at_start", load_average()},
                                {"data", o.data_files},
                                {"limit", o.limit},
                                {"policies", pols},
                                {"robustness", o.robustness},
                                {"sweep_ratios", o.sweep_ratios},
                                {"sweep_alphas", o.sweep_alphas},
                                {"sweep_policies", sweep}});
  write_run_json(path, run);
}

// Records the wall time and unit count of this invocation (the last one in run.json), so that
// the cost of a run is part of its record.
void finish_run_json(const std::string& dir, double seconds, int units_run) {
  const std::string path = dir + "/" + kRunFile;
  std::ifstream in(path);
  json run = json::parse(in, nullptr, /*allow_exceptions=*/false);
  CT_THROW_IF_NOT(!run.is_discarded() && run.contains("invocations") &&
                      run["invocations"].is_array() && !run["invocations"].empty(),
                  "{}: expected the run record written at the start of this invocation", path);
  run["invocations"].back()["seconds"] = seconds;
  run["invocations"].back()["units_run"] = units_run;
  write_run_json(path, run);
}

ResultsWriter::ResultsWriter(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "ab");
  CT_THROW_IF_NOT(f_ != nullptr, "cannot open results file '{}' for appending", path);
}

ResultsWriter::~ResultsWriter() {
  if (f_) std::fclose(f_);
}

void ResultsWriter::append(const json& j) {
  const std::string line = j.dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), f_) == line.size() &&
                  std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  CT_THROW_IF_NOT(ok, "cannot write to results file '{}'", path_);
}

namespace {

constexpr char kRefMagic[8] = {'C', 'T', 'E', 'V', 'R', 'E', 'F', '1'};

template <class T>
void put_vec(std::ostream& f, const T* p, uint64_t n) {
  f.write(reinterpret_cast<const char*>(&n), sizeof n);
  f.write(reinterpret_cast<const char*>(p), (std::streamsize)(n * sizeof(T)));
}

template <class T>
bool get_vec(std::ifstream& f, std::vector<T>& v, uint64_t max_n) {
  uint64_t n = 0;
  if (!f.read(reinterpret_cast<char*>(&n), sizeof n) || n > max_n) return false;
  v.resize(n);
  return (bool)f.read(reinterpret_cast<char*>(v.data()), (std::streamsize)(n * sizeof(T)));
}

}  // namespace

void write_reference(const std::string& path, const Reference& r) {
  std::ostringstream f;
  f.write(kRefMagic, sizeof kRefMagic);
  put_vec(f, r.answer.data(), r.answer.size());
  put_vec(f, r.forced.data(), r.forced.size());
  put_vec(f, r.forced_logits.data(), r.forced_logits.size());
  put_vec(f, r.attn.data(), r.attn.size());
  const uint64_t nc = r.drift.size();
  f.write(reinterpret_cast<const char*>(&nc), sizeof nc);
  for (const auto& d : r.drift) put_vec(f, d.data(), d.size());
  write_file_atomic(path, f.str());
}

// False (and the caller recomputes) when the file is missing, truncated or does not fit the
// request: another vocabulary, prompt length or chunk split.
bool read_reference(const std::string& path, int n_vocab, int n_total,
                    const std::vector<int>& chunk_tokens, Reference& r) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  char magic[sizeof kRefMagic];
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kRefMagic, sizeof magic) != 0) {
    return false;
  }
  std::vector<char> answer;
  if (!get_vec(f, answer, 1u << 24) || !get_vec(f, r.forced, 1u << 16) ||
      !get_vec(f, r.forced_logits, (uint64_t)n_vocab << 16) || !get_vec(f, r.attn, 1u << 24)) {
    return false;
  }
  r.answer.assign(answer.begin(), answer.end());
  uint64_t nc = 0;
  if (!f.read(reinterpret_cast<char*>(&nc), sizeof nc) || nc != chunk_tokens.size()) return false;
  r.drift.resize(nc);
  for (uint64_t b = 0; b < nc; ++b) {
    if (!get_vec(f, r.drift[b], 1u << 24) || (int)r.drift[b].size() != chunk_tokens[b]) {
      return false;
    }
  }
  return (int)r.attn.size() == n_total &&
         r.forced_logits.size() == (size_t)std::max<size_t>(1, r.forced.size()) * n_vocab;
}

}  // namespace ct::eval
