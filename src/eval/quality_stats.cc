#include "eval/quality_stats.h"

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "eval/stats.h"

namespace ct {
namespace {

using nlohmann::json;

// One example's values for one policy in one setting.
struct Row {
  double kl = NAN, kl_ratio = NAN, fid = NAN, score = NAN, ttft = NAN, speedup = NAN,
         recall = NAN;
  long hits = 0, ref = 0;
};

double num(const json& r, const char* key) {
  return r.contains(key) && r.at(key).is_number() ? r.at(key).get<double>() : NAN;
}

json summary_json(const std::vector<double>& x, uint64_t seed) {
  if (x.empty()) return json{{"n", 0}};
  const SampleSummary s = summarize_sample(x, seed);
  return json{{"n", s.n}, {"mean", s.mean}, {"median", s.median}, {"lo", s.ci.lo},
              {"hi", s.ci.hi}};
}

using Table = std::map<std::string, std::map<std::string, Row>>;  // policy -> example -> row

json table_json(const Table& t, const std::string& label) {
  json pol = json::object();
  const char* names[] = {"kl_ratio", "kl", "fid_score", "task_score", "ttft_ms", "speedup",
                         "recall"};
  for (const auto& [p, rows] : t) {
    std::vector<double> v[7];
    long hits = 0, ref = 0;
    for (const auto& [ex, r] : rows) {
      const double vals[7] = {r.kl_ratio, r.kl, r.fid, r.score, r.ttft, r.speedup, r.recall};
      for (int i = 0; i < 7; ++i) {
        if (std::isfinite(vals[i])) v[i].push_back(vals[i]);
      }
      hits += r.hits;
      ref += r.ref;
    }
    json pj = json::object();
    for (int i = 0; i < 7; ++i) pj[names[i]] = summary_json(v[i], stream_seed(kBootstrapSeed, label + "|" + p + "|" + names[i]));
    pj["recall_pooled"] = ref > 0 ? json((double)hits / ref) : json(nullptr);
    pol[p] = pj;
  }
  json paired = json::object();
  for (const auto& [a, ra] : t) {
    for (const auto& [b, rb] : t) {
      if (a == b) continue;
      std::vector<double> dk, df;
      for (const auto& [ex, x] : ra) {
        const auto it = rb.find(ex);
        if (it == rb.end()) continue;
        if (std::isfinite(x.kl_ratio) && std::isfinite(it->second.kl_ratio))
          dk.push_back(x.kl_ratio - it->second.kl_ratio);
        if (std::isfinite(x.fid) && std::isfinite(it->second.fid)) df.push_back(x.fid - it->second.fid);
      }
      const std::string key = a + "|" + b;
      paired[key] = {{"kl_ratio", summary_json(dk, stream_seed(kBootstrapSeed, label + "|" + key + "|kl"))},
                     {"fid_score", summary_json(df, stream_seed(kBootstrapSeed, label + "|" + key + "|fid"))}};
    }
  }
  return json{{"policies", pol}, {"paired", paired}};
}

}  // namespace

json quality_stats(const std::vector<json>& recs) {
  // Reference values per example and setting: reuse's KL and full's TTFT.
  std::map<std::string, double> reuse_kl, full_ttft;
  for (const json& r : recs) {
    const std::string key = r.at("example").get<std::string>() + "|" + r.at("setting").get<std::string>();
    if (r.at("policy") == "reuse") reuse_kl[key] = num(r, "kl");
    if (r.at("policy") == "full") full_ttft[key] = num(r, "ttft_ms");
  }
  // task (and "all") -> setting -> table
  std::map<std::string, std::map<std::string, Table>> g;
  for (const json& r : recs) {
    const std::string ex = r.at("example").get<std::string>();
    const std::string setting = r.at("setting").get<std::string>();
    const std::string ref_setting =
        r.contains("ref_setting") ? r.at("ref_setting").get<std::string>() : setting;
    Row row;
    row.kl = num(r, "kl");
    auto rk = reuse_kl.find(ex + "|" + setting);
    if (rk == reuse_kl.end()) rk = reuse_kl.find(ex + "|" + ref_setting);  // sweeps: the layout's
    if (rk != reuse_kl.end() && rk->second > 0 && std::isfinite(row.kl)) row.kl_ratio = row.kl / rk->second;
    row.fid = num(r, "fid_score");
    row.score = num(r, "task_score");
    row.ttft = num(r, "ttft_ms");
    const auto ft = full_ttft.find(ex + "|" + ref_setting);
    if (ft != full_ttft.end() && row.ttft > 0) row.speedup = ft->second / row.ttft;
    row.recall = num(r, "recall");
    if (r.contains("recall_hits") && std::isfinite(row.recall)) {
      row.hits = r.at("recall_hits").get<long>();
      row.ref = r.at("recall_ref").get<long>();
    }
    const std::string p = r.at("policy").get<std::string>();
    g[r.at("task").get<std::string>()][setting][p][ex] = row;
    g["*"][setting][p][ex] = row;
  }
  json tasks = json::object(), overall = json::object();
  for (const auto& [task, settings] : g) {
    json sj = json::object();
    for (const auto& [setting, t] : settings) sj[setting] = table_json(t, task + "|" + setting);
    if (task == "*") {
      overall = sj;
    } else {
      tasks[task] = sj;
    }
  }
  return json{{"tasks", tasks}, {"overall", overall}};
}

}  // namespace ct
