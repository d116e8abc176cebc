// Recompute-ratio calibration: the calibration set, the cost profiler (real layers, real tier
// loads), the measured-TTFT objective and the driver that searches and persists; see
// calibration.h.
#include "engine/calibration.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu_forward.h"
#include "core/data_jsonl.h"
#include "core/error.h"
#include "core/timer.h"
#include "reuse/first_token.h"
#include "reuse/freq_rank.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

// The question asked over the example documents when no task file is available; any question
// works, calibration measures time and never looks at the answer.
constexpr const char* kDocsQuestion = "What do these documents describe?";

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CT_THROW_IF_NOT(f.good(), "calibration document '{}': cannot open for reading", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<CalibrationRequest> requests_from_dir(const std::string& dir, int limit) {
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
  }
  CT_THROW_IF_NOT(!files.empty(), "calibration directory '{}': no .txt documents", dir);
  std::sort(files.begin(), files.end());
  std::vector<std::string> docs;
  for (const std::string& f : files) docs.push_back(read_text(f));
  std::vector<CalibrationRequest> out;
  for (int i = 0; i < limit; ++i) {
    CalibrationRequest r;
    for (size_t j = 0; j < docs.size(); ++j) r.docs.push_back(docs[(i + j) % docs.size()]);
    r.question = kDocsQuestion;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<CalibrationRequest> requests_from_jsonl(const std::string& path, int limit) {
  std::vector<CalibrationRequest> out;
  for (DataExample& ex : read_data_jsonl(path, {.limit = limit}))
    out.push_back({std::move(ex.chunks), std::move(ex.question)});
  return out;
}

// Layers to time: `n` of the model's, spread evenly (all when n >= n_layer).
std::vector<int> timed_layers(int n_layer, int n) {
  n = std::clamp(n, 1, n_layer);
  std::vector<int> layers;
  for (int i = 0; i < n; ++i) layers.push_back((int)((int64_t)i * n_layer / n));
  return layers;
}

// Each case is timed once per round, rounds interleave the cases, and each case keeps its
// fastest round: a burst of load from other processes then slows one round of every case
// instead of every round of one case, which would bend the fitted slope. An untimed first run of
// the case with the most rows warms the workspace (it grows to the largest n) and the caches.
// Case has `pos` (one entry per row); time(case) returns seconds per layer.
template <class Case, class TimeFn>
std::vector<sched::CostSample> fastest_of_rounds(const std::vector<Case>& cases, int repeats,
                                                 TimeFn&& time) {
  const auto by_rows = [](const Case& a, const Case& b) { return a.pos.size() < b.pos.size(); };
  time(*std::max_element(cases.begin(), cases.end(), by_rows));
  std::vector<double> best(cases.size(), std::numeric_limits<double>::infinity());
  for (int round = 0; round < repeats; ++round) {
    for (size_t k = 0; k < cases.size(); ++k) best[k] = std::min(best[k], time(cases[k]));
  }
  std::vector<sched::CostSample> out;
  for (size_t k = 0; k < cases.size(); ++k) out.push_back({(double)cases[k].pos.size(), best[k]});
  return out;
}

}  // namespace

std::vector<CalibrationRequest> load_calibration_requests(const std::string& path, int limit) {
  CT_THROW_IF_NOT(limit > 0, "calibration --limit {}: expected at least 1 request", limit);
  std::error_code ec;
  if (fs::is_directory(path, ec)) return requests_from_dir(path, limit);
  return requests_from_jsonl(path, limit);
}

CalibrationWorkload::CalibrationWorkload(Engine& eng,
                                         const std::vector<CalibrationRequest>& requests)
    : eng_(eng), device_(eng.device()) {
  CT_THROW_IF_NOT(!requests.empty(), "calibration needs at least one request");
  const Tokenizer& tok = eng.model().tokenizer();
  int max_total = 0;
  for (const CalibrationRequest& r : requests) {
    const RagPromptTokens p = build_rag_prompt(tok, r.docs, r.question);
    Prepared prep;
    prep.req.prefix = p.prefix;
    prep.req.query = p.query;
    for (const std::vector<int32_t>& toks : p.chunks) {
      ChunkMeta meta;
      eng.ensure_chunk(toks, "", &meta);
      prep.chunks.push_back(std::make_unique<PooledChunk>(eng.pool(), std::move(meta)));
      prep.req.chunks.push_back(prep.chunks.back().get());
    }
    prep.layout = layout_request(prep.req);
    max_total = std::max(max_total, prep.layout.n_total);
    CT_THROW_IF_NOT(!device_ || prep.layout.n_total + 1 <= device_->n_ctx(),
                    "calibration request of {} tokens does not fit the {} sequence of {} positions "
                    "(use shorter documents or a smaller --limit)",
                    prep.layout.n_total, device_ ? device_->name() : "",
                    device_ ? device_->n_ctx() : 0);
    reqs_.push_back(std::move(prep));
  }
  // Checked after all puts: storing a later chunk may have demoted an earlier one.
  for (const Prepared& p : reqs_) {
    for (const auto& c : p.chunks) {
      const int t = eng.pool().tier_of(c->meta().id);
      CT_THROW_IF_NOT(t == 0,
                      "calibration chunk {} ({} tokens) is in tier {}, not in the tier under test "
                      "'{}': the calibration set must fit in it (use a smaller --limit or a "
                      "larger capacity)",
                      c->meta().id.substr(0, 12), c->meta().n_tok, t, eng.options().tiers[0].kind);
    }
  }
  kv_ = eng.model().make_cache(max_total, eng.options().kv_type);
}

CalibrationWorkload::~CalibrationWorkload() = default;

double CalibrationWorkload::mean_ttft_seconds(const PolicyOptions& policy, int repeats) {
  CT_THROW_IF_NOT(repeats >= 1, "calibration repeats={}: expected >= 1", repeats);
  const Model& m = eng_.model();
  SelectiveOptions sel;
  sel.policy = policy;
  sel.device = device_;
  sel.device_kv_to_host = false;  // only the first token is needed
  double sum = 0;
  for (Prepared& p : reqs_) {
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < repeats; ++i) {
      best = std::min(best, run_to_first_token(m, p.req, sel, kv_, ws_).ttft_ms / 1e3);
    }
    sum += best;
  }
  return sum / (double)reqs_.size();
}

sched::PrefillShape CalibrationWorkload::mean_shape() const {
  double n_reuse = 0, n_fixed = 0;
  for (const Prepared& p : reqs_) {
    int chunk_rows = 0;
    for (int8_t c : p.layout.is_chunk) chunk_rows += c;
    n_reuse += chunk_rows;
    n_fixed += p.layout.n_total - chunk_rows;
  }
  const double n = (double)reqs_.size();
  return {std::llround(n_reuse / n), std::llround(n_fixed / n), eng_.model().config().n_layer};
}

sched::ProfileSamples CalibrationWorkload::profile(const ProfileOptions& opt) {
  CT_THROW_IF_NOT(opt.repeats >= 1 && opt.max_layers >= 1 && !opt.compute_ratios.empty() &&
                      !opt.load_ratios.empty(),
                  "profile options repeats={} max_layers={} with {} compute and {} load ratios: "
                  "expected repeats >= 1, max_layers >= 1 and at least one ratio of each",
                  opt.repeats, opt.max_layers, opt.compute_ratios.size(), opt.load_ratios.size());
  const Model& m = eng_.model();
  const ModelConfig& c = m.config();
  const Prepared& p = reqs_[0];
  const int n_total = p.layout.n_total;
  int n_reuse = 0;
  for (int8_t ch : p.layout.is_chunk) n_reuse += ch;
  const int n_fixed = n_total - n_reuse;
  const std::vector<int> layers = timed_layers(c.n_layer, opt.max_layers);
  sched::ProfileSamples out;

  // Both paths are timed with fastest_of_rounds.
  //
  // Recompute path: n rows through the timed layers, at positions spread over the prompt so each
  // row attends over a prompt-length context, as recomputed chunk tokens do.
  struct ComputeCase {
    std::vector<int32_t> pos;   // [n] strictly increasing global positions
    std::vector<int32_t> toks;  // [n] the tokens there
  };
  std::vector<ComputeCase> compute_cases;
  for (double r : opt.compute_ratios) {
    CT_THROW_IF_NOT(r >= 0 && r <= 1, "profile compute ratio {}: expected [0, 1]", r);
    const int n = std::clamp(n_fixed + n_select(r, n_reuse), 1, n_total);
    ComputeCase cc;
    cc.pos.resize(n);
    cc.toks.resize(n);
    for (int i = 0; i < n; ++i) {
      cc.pos[i] = (int32_t)((int64_t)i * n_total / n);
      cc.toks[i] = p.layout.tokens[cc.pos[i]];
    }
    compute_cases.push_back(std::move(cc));
  }
  // One pass over the timed layers through the layer backend; finish() waits for a device and
  // adds the last row's logits (one row: small next to a layer of hundreds).
  auto time_compute = [&](const ComputeCase& cc) {
    std::unique_ptr<LayerBackend> be =
        device_ ? device_->layers(nullptr) : make_cpu_layers(m, kv_, ws_, PipelineOptions{});
    Timer t;
    be->begin(cc.toks.data(), cc.pos.data(), (int)cc.pos.size());
    for (int l : layers) be->layer(l, nullptr);
    be->finish();
    return t.seconds() / (double)layers.size();
  };
  out.compute = fastest_of_rounds(compute_cases, opt.repeats, time_compute);

  // Load path: each chunk's complement rank rows [n_select(r), N) read from the tier, unpacked to
  // F32 at their global positions and rotated there, exactly the loader's work per layer. It runs
  // on its own thread with single-threaded OpenMP, as the loader does.
  struct LoadCase {
    std::vector<int32_t> pos;  // global positions of the loaded rows, in read order
    std::vector<int> begin;    // per chunk: first rank row read
  };
  std::vector<LoadCase> load_cases;
  for (double r : opt.load_ratios) {
    CT_THROW_IF_NOT(r >= 0 && r < 1, "profile load ratio {}: expected [0, 1)", r);
    LoadCase lc;
    for (size_t b = 0; b < p.chunks.size(); ++b) {
      const ChunkMeta& meta = p.chunks[b]->meta();
      lc.begin.push_back(n_select(r, meta.n_tok));
      for (int j = lc.begin.back(); j < meta.n_tok; ++j) {
        lc.pos.push_back(p.layout.chunk_offset[b] + meta.order[j]);
      }
    }
    if (!lc.pos.empty()) load_cases.push_back(std::move(lc));
  }
  CT_THROW_IF_NOT(!load_cases.empty(), "profile: no load ratio leaves a chunk row to load");
  std::exception_ptr error;
  std::thread loader([&] {
    try {
      omp_set_num_threads(1);
      const int KV = c.kv_dim();
      std::vector<uint8_t> stage_k, stage_v;
      std::vector<float> cs, sn;  // RoPE angle tables of the loaded positions
      std::vector<float> rot;     // a non-F32 cache's keys in F32 while they are rotated
      const bool rotate_first = kv_.dtype() != KvDtype::F32;
      auto time_load = [&](const LoadCase& lc) {
        Timer t;
        if (rotate_first) rot.resize(lc.pos.size() * KV);
        for (int l : layers) {
          size_t n = 0;
          for (size_t b = 0; b < p.chunks.size(); ++b) {
            const ChunkMeta& meta = p.chunks[b]->meta();
            const size_t row_bytes = kv_bytes(meta.dtype, KV);
            const size_t bytes = row_bytes * (meta.n_tok - lc.begin[b]);
            if (bytes == 0) continue;
            if (stage_k.size() < bytes) {
              stage_k.resize(bytes);
              stage_v.resize(bytes);
            }
            p.chunks[b]->read_rows(l, lc.begin[b], meta.n_tok, stage_k.data(), stage_v.data());
            if (device_) continue;  // the device unpacks and rotates
            for (int j = lc.begin[b]; j < meta.n_tok; ++j, ++n) {
              const size_t src = row_bytes * (j - lc.begin[b]);
              if (rotate_first) kv_unpack(meta.dtype, stage_k.data() + src, &rot[n * KV], KV);
              kv_.place_row(l, lc.pos[n], meta.dtype, rotate_first ? nullptr : stage_k.data() + src,
                            stage_v.data() + src);
            }
          }
          if (device_) continue;
          // As the loader does: the angle table once per request, reused by every layer; a
          // non-F32 cache's keys rotated before they are packed.
          if (l == layers.front()) m.rope().angle_table(lc.pos.data(), (int)lc.pos.size(), cs, sn);
          if (rotate_first) {
            cpu::rotate_and_store_keys(m, kv_, l, lc.pos.data(), (int)lc.pos.size(), cs.data(),
                                       sn.data(), rot.data());
          } else {
            cpu::rotate_placed_keys(m, kv_, l, lc.pos.data(), (int)lc.pos.size(), cs.data(),
                                    sn.data(), rot);
          }
        }
        return t.seconds() / (double)layers.size();
      };
      out.load = fastest_of_rounds(load_cases, opt.repeats, time_load);
    } catch (...) {
      error = std::current_exception();
    }
  });
  loader.join();
  if (error) std::rethrow_exception(error);
  return out;
}

CalibrationRun calibrate_top_tier(Engine& eng, const std::vector<CalibrationRequest>& requests,
                                  const CalibrateOptions& opt) {
  CT_THROW_IF_NOT(std::isfinite(opt.r_min) && std::isfinite(opt.r_max) && opt.r_min >= 0 &&
                      opt.r_min < opt.r_max && opt.r_max <= 1,
                  "calibration bounds --rmin {} --rmax {}: expected 0 <= rmin < rmax <= 1",
                  opt.r_min, opt.r_max);
  CT_THROW_IF_NOT(std::isfinite(opt.eps) && opt.eps > 0, "calibration --eps {}: expected > 0",
                  opt.eps);
  Timer total;
  CalibrationRun run;
  const std::string& path = eng.options().calibration_path;
  sched::CalibrationStore store = sched::CalibrationStore::load_or_empty(path);
  const sched::CalibrationKey key = eng.calibration_key(0, eng.backend_name());
  if (!opt.force) {
    if (const sched::CalibrationEntry* e = store.find(key)) {
      run.entry = *e;
      run.reused = true;
      run.seconds = total.seconds();
      return run;
    }
  }

  CalibrationWorkload work(eng, requests);
  PolicyOptions policy;
  policy.kind = &find_policy("cachetune");
  if (!opt.objective) {
    // One untimed pass first: page-ins, workspace growth and cold caches would otherwise land on
    // the first probe and bias the search away from it.
    policy.ratio = opt.r_min;
    work.mean_ttft_seconds(policy);
  }
  run.fit = sched::fit_cost_model(work.profile(opt.profile));
  run.shape = work.mean_shape();
  run.analytic = sched::analytic_ratio(run.fit.params, run.shape, opt.r_min, opt.r_max);
  if (opt.on_profile) opt.on_profile(run);

  auto objective = [&](double r) {
    double seconds;
    if (opt.objective) {
      seconds = opt.objective(r);
    } else {
      policy.ratio = r;
      seconds = work.mean_ttft_seconds(policy, opt.repeats);
    }
    if (opt.on_probe) opt.on_probe(r, seconds);
    return seconds;
  };
  sched::GoldenSectionOptions g;
  g.r_min = opt.r_min;
  g.eps = opt.eps;
  g.r0 = run.analytic.r;
  g.noise = opt.noise;
  g.paired_rounds = opt.paired_rounds;
  run.search = sched::golden_section_search(objective, opt.r_min, opt.r_max, g);

  run.entry.key = key;
  run.entry.profile = run.fit.params;
  run.entry.analytic_r = run.analytic.r;
  // The search never probes below r_min and returns a bracket midpoint inside [r_min, r_max].
  CT_ASSERT(run.search.r >= opt.r_min, "search returned r={} below r_min={}", run.search.r,
            opt.r_min);
  run.entry.chosen_r = run.search.r;
  run.entry.probes = run.search.probes;
  run.entry.timestamp_unix = (int64_t)std::time(nullptr);
  store.store(run.entry);
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    CT_THROW_IF_NOT(!ec, "calibration store {}: cannot create directory {}: {}", path,
                    parent.string(), ec.message());
  }
  store.save(path);
  run.seconds = total.seconds();
  return run;
}

}  // namespace ct
