// summarize_eval (eval/runner.h): per task, setting and policy the means of a results
// directory's records, with the intervals of eval/quality_stats.h, written to summary.json.
#include <fstream>
#include <map>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "eval/quality_stats.h"
#include "eval/results_io.h"
#include "eval/runner.h"

namespace ct {

using eval::kResultsFile;
using eval::kRunFile;
using eval::kSummaryFile;
using nlohmann::json;

namespace {
struct Acc {
  double sum = 0;
  int n = 0;
  void add(const json& v) {
    if (v.is_number()) {
      sum += v.get<double>();
      ++n;
    }
  }
  json mean() const { return n > 0 ? json(sum / n) : json(nullptr); }
};
}  // namespace

json summarize_eval(const std::string& dir) {
  const std::string path = dir + "/" + kResultsFile;
  std::ifstream in(path);
  CT_THROW_IF_NOT(in.good(), "cannot read results file '{}'", path);
  std::vector<json> recs;
  std::map<std::string, const json*> full;  // example|setting -> full record
  std::string line;
  for (int ln = 1; std::getline(in, line); ++ln) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      recs.push_back(json::parse(line));
    } catch (const json::parse_error& e) {
      CT_THROW("{}:{}: invalid JSON ({})", path, ln, e.what());
    }
  }
  for (const json& r : recs) {
    if (r["policy"] == "full")
      full[r["example"].get<std::string>() + "|" + r["setting"].get<std::string>()] = &r;
  }
  // task -> setting -> policy -> records
  std::map<std::string, std::map<std::string, std::map<std::string, std::vector<const json*>>>> g;
  for (const json& r : recs) g[r["task"]][r["setting"]][r["policy"]].push_back(&r);

  json tasks = json::object();
  for (const auto& [task, settings] : g) {
    json tj = json::object();
    json sj = json::object();
    std::vector<double> band;
    int n_band = 0;
    Acc prompt;
    std::set<std::string> examples;
    for (const auto& [setting, policies] : settings) {
      json pj = json::object();
      for (const auto& [policy, rs] : policies) {
        Acc score, full_score, fid, kl, cos, ttft, full_ttft, decode, n_prompt;
        std::map<std::string, Acc> bd;
        long hits = 0, ref = 0;
        for (const json* r : rs) {
          const auto it = full.find(r->at("example").get<std::string>() + "|" +
                                    r->at("ref_setting").get<std::string>());
          const json* f = it == full.end() ? nullptr : it->second;
          score.add(r->at("task_score"));
          if (f && r->at("task_score").is_number()) full_score.add(f->at("task_score"));
          fid.add(r->at("fid_score"));
          kl.add(r->at("kl"));
          cos.add(r->at("attn_cos"));
          ttft.add(r->at("ttft_ms"));
          if (f) full_ttft.add(f->at("ttft_ms"));
          decode.add(r->at("decode_ms"));
          n_prompt.add(r->at("n_prompt"));
          for (auto b = r->at("breakdown").begin(); b != r->at("breakdown").end(); ++b) {
            bd[b.key()].add(b.value());
          }
          if (r->contains("recall_ref") && r->at("recall").is_number()) {
            hits += r->at("recall_hits").get<long>();
            ref += r->at("recall_ref").get<long>();
          }
          if (setting == "base" && policy == "full") {
            examples.insert(r->at("example").get<std::string>());
            prompt.add(r->at("n_prompt"));
            if (r->contains("band_energy")) {
              const auto e = r->at("band_energy").get<std::vector<double>>();
              if (band.empty()) band.assign(e.size(), 0.0);
              for (size_t i = 0; i < e.size() && i < band.size(); ++i) band[i] += e[i];
              ++n_band;
            }
          }
        }
        json p = {{"n", (int)rs.size()},
                  {"ratio", rs.front()->at("ratio")},
                  {"alpha", rs.front()->at("alpha")},
                  {"metric", rs.front()->at("metric")},
                  {"task_score", score.mean()},
                  {"full_task_score", full_score.mean()},
                  {"fid_score", fid.mean()},
                  {"kl", kl.mean()},
                  {"attn_cos", cos.mean()},
                  {"recall", ref > 0 ? json((double)hits / ref) : json(nullptr)},
                  {"recall_hits", hits},
                  {"recall_ref", ref},
                  {"ttft_ms", ttft.mean()},
                  {"full_ttft_ms", full_ttft.mean()},
                  {"decode_ms", decode.mean()},
                  {"n_prompt", n_prompt.mean()}};
        p["score_vs_full"] = score.n > 0 && full_score.n > 0 && full_score.sum > 0
                                 ? json(score.sum / full_score.sum)
                                 : json(nullptr);
        p["speedup"] = ttft.n > 0 && full_ttft.n == ttft.n && ttft.sum > 0
                           ? json(full_ttft.sum / ttft.sum)
                           : json(nullptr);
        json bj = json::object();
        for (const auto& [k, a] : bd) bj[k] = a.mean();
        p["breakdown"] = bj;
        pj[policy] = p;
      }
      sj[setting] = pj;
    }
    for (double& b : band) b /= std::max(1, n_band);
    tj["n_examples"] = (int)examples.size();
    tj["mean_prompt_tokens"] = prompt.mean();
    tj["band_energy"] = band;
    tj["settings"] = sj;
    tasks[task] = tj;
  }
  json run;
  if (std::ifstream rin(dir + "/" + kRunFile); rin.good()) {
    try {
      run = json::parse(rin);
    } catch (const json::parse_error&) {
      run = nullptr;
    }
  }
  // Intervals: per task (into each task's settings) and over all tasks ("overall").
  const json qs = quality_stats(recs);
  for (auto it = qs["tasks"].begin(); it != qs["tasks"].end(); ++it) {
    if (tasks.contains(it.key())) tasks[it.key()]["stats"] = it.value();
  }
  json summary = {
      {"run", run}, {"n_records", (int)recs.size()}, {"tasks", tasks}, {"overall", qs["overall"]}};
  const std::string spath = dir + "/" + kSummaryFile;
  write_file_atomic(spath, summary.dump(2) + "\n");
  return summary;
}

}  // namespace ct
