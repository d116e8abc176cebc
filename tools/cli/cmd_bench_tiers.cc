// `cachetune bench-tiers`: the cache-loading ablation of paper Table 4 on every storage tier. The
// same chunks are stored in one tier at a time and the same requests are prefilled with cachetune
// at a fixed ratio while the loader's optimisations are switched on one after another.
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/data_jsonl.h"
#include "core/error.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "reuse/first_token.h"
#include "reuse/pooled_chunk.h"
#include "reuse/prompt.h"
#include "sched/calibration_store.h"
#include "store/disk_tier.h"
#include "store/redis_tier.h"
#include "store/tier_registry.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"

namespace ct::cli {
namespace {

namespace fs = std::filesystem;

struct BenchTiersArgs {
  std::string model;              // a registry name or a path; empty: the default model
  std::vector<std::string> docs;  // default: examples/docs/*.txt
  std::string question = "Who directs the institute that discovered the Harrow Reef?";
  std::string data;  // JSONL with "chunks" and "question" per line
  int limit = 3;
  double ratio = 0.15;
  int repeats = 3;
  std::vector<std::string> tiers = {"device", "host", "disk", "hdd", "redis"};
  std::string disk_dir;  // parent of the temporary disk-tier directories
  std::string hdd_bw = "100M";
  std::string redis;  // HOST:PORT of a running server; empty: start a local redis-server
  std::string kv_dtype = "f16";
  std::string cache_type = kv_dtype_name(EngineOptions().kv_type);  // the live K/V caches' type
  std::string json_out;
  bool no_full = false;
};

struct BenchRequest {
  std::string name;
  std::vector<std::string> docs;
  std::string question;
};

// The ablation steps of Table 4; each adds one optimisation to the previous one.
struct Step {
  const char* key;
  const char* label;
  PipelineOptions pipe;
};
const Step kSteps[] = {
    {"a", "(a) no overlap, dense, RoPE on compute thread", {false, false, false}},
    {"b", "(b) + overlap (prefetch next layer)", {true, false, false}},
    {"c", "(c) + sparse loading (complement only)", {true, true, false}},
    {"d", "(d) + deferred RoPE in the loader", {true, true, true}},
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CT_THROW_IF_NOT(f.good(), "cannot open document '{}'", path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

std::vector<BenchRequest> load_requests(const BenchTiersArgs& a) {
  std::vector<BenchRequest> out;
  if (!a.data.empty()) {
    for (DataExample& ex : read_data_jsonl(a.data, {.limit = a.limit})) {
      BenchRequest r;
      r.name = ex.id.empty() ? fmt::format("{}:{}", ex.file, ex.line) : ex.id;
      r.docs = std::move(ex.chunks);
      r.question = std::move(ex.question);
      out.push_back(std::move(r));
    }
    return out;
  }
  std::vector<std::string> files = a.docs;
  if (files.empty()) {
    const fs::path dir = "examples/docs";
    if (fs::is_directory(dir)) {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".txt") files.push_back(e.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    CT_THROW_IF_NOT(!files.empty(),
                    "no documents: examples/docs/*.txt not found in {} (run from the repository "
                    "root, or give --docs FILES or --data FILE.jsonl)",
                    fs::current_path().string());
  }
  BenchRequest r;
  r.name = "examples/docs";
  for (const auto& f : files) r.docs.push_back(read_text(f));
  r.question = a.question;
  out.push_back(std::move(r));
  return out;
}

// CPU time of the whole process (every thread: the layer loop, its OpenMP team, the loader).
double process_cpu_ms() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// One prefill measurement: TTFT = selective prefill + choosing and detokenising the first token.
struct Sample {
  double ttft_ms = 0;
  // Process CPU time during the run. On a machine shared with other jobs TTFT stretches more
  // than this, so cpu_ms / ttft_ms well below the core count shows time lost to other processes.
  double cpu_ms = 0;
  PrefillBreakdown bd;
  uint64_t bytes_read = 0;  // from the disk tier, when there is one
};

struct Prepared {
  ComposedRequest req;
  int n_total = 0;
};

class Runner {
 public:
  Runner(const Model& m, double ratio, KvDtype cache_type)
      : m_(m), ratio_(ratio), cache_type_(cache_type) {}

  Sample run(const Prepared& p, const Policy* kind, const PipelineOptions& pipe,
             const store::DiskTier* disk) {
    SelectiveOptions sel;
    sel.policy.kind = kind;
    sel.policy.ratio = ratio_;
    sel.pipeline = pipe;
    // A fresh, zeroed cache per run (its pages are touched here, outside the timer), as a new
    // request gets; the workspace is kept warm across runs like a serving loop's.
    KVCache kv = m_.make_cache(p.n_total + 1, cache_type_);
    Sample s;
    const uint64_t b0 = disk ? disk->bytes_read() : 0;
    const double cpu0 = process_cpu_ms();
    const FirstToken ft = run_to_first_token(m_, p.req, sel, kv, ws_);  // reuse/first_token.h
    s.ttft_ms = ft.ttft_ms;
    s.bd = ft.bd;
    s.cpu_ms = process_cpu_ms() - cpu0;
    if (disk) s.bytes_read = disk->bytes_read() - b0;
    return s;
  }

 private:
  const Model& m_;
  double ratio_;
  KvDtype cache_type_;
  Workspace ws_;
};

Sample median_of(std::vector<Sample> v) {
  std::sort(v.begin(), v.end(),
            [](const Sample& a, const Sample& b) { return a.ttft_ms < b.ttft_ms; });
  return v[v.size() / 2];
}

// Mean over requests of each request's median sample.
struct Summary {
  double ttft_ms = 0, cpu_ms = 0, load_ms = 0, load_wait_ms = 0, compute_ms = 0, select_ms = 0,
         logits_ms = 0;
  double mib_read = 0;
  nlohmann::json per_request = nlohmann::json::array();
};
Summary summarise(const std::vector<Sample>& medians, const std::vector<Prepared>& reqs) {
  Summary s;
  const double n = (double)medians.size();
  for (size_t i = 0; i < medians.size(); ++i) {
    const Sample& m = medians[i];
    s.ttft_ms += m.ttft_ms / n;
    s.cpu_ms += m.cpu_ms / n;
    s.load_ms += m.bd.load_ms / n;
    s.load_wait_ms += m.bd.load_wait_ms / n;
    s.compute_ms += m.bd.compute_ms / n;
    s.select_ms += m.bd.select_ms / n;
    s.logits_ms += m.bd.logits_ms / n;
    s.mib_read += m.bytes_read / 1048576.0 / n;
    s.per_request.push_back({{"n_prompt", reqs[i].n_total},
                             {"ttft_ms", m.ttft_ms},
                             {"cpu_ms", m.cpu_ms},
                             {"load_ms", m.bd.load_ms},
                             {"load_wait_ms", m.bd.load_wait_ms},
                             {"compute_ms", m.bd.compute_ms},
                             {"select_ms", m.bd.select_ms},
                             {"logits_ms", m.bd.logits_ms},
                             {"n_active", m.bd.n_active},
                             {"n_loaded", m.bd.n_loaded},
                             {"bytes_read", m.bytes_read}});
  }
  return s;
}

nlohmann::json to_json(const Summary& s) {
  return {{"ttft_ms", s.ttft_ms},        {"cpu_ms", s.cpu_ms},
          {"load_ms", s.load_ms},        {"load_wait_ms", s.load_wait_ms},
          {"compute_ms", s.compute_ms},  {"select_ms", s.select_ms},
          {"logits_ms", s.logits_ms},    {"mib_read", s.mib_read},
          {"per_request", s.per_request}};
}

// The tier under test, alone in its pool, plus what is needed to tear it down.
struct TierUnderTest {
  std::string name, spec;
  std::unique_ptr<store::CachePool> pool;
  store::DiskTier* disk = nullptr;
  std::string tmp_dir;  // removed afterwards
  std::unique_ptr<store::LocalRedisServer> redis;
};

std::string make_temp_dir(const std::string& parent, const std::string& what) {
  std::string base = parent;
  if (base.empty()) {
    const char* t = std::getenv("TMPDIR");
    base = t && *t ? t : "/tmp";
  }
  std::string templ = base + "/cachetune-bench-" + what + "-XXXXXX";
  CT_THROW_IF_NOT(::mkdtemp(templ.data()) != nullptr, "cannot create a temporary directory in {}",
                  base);
  return templ;
}

// Builds the tier `name` alone in a pool from a spec (store/tier_registry.h); nullptr (after
// printing why) when Redis is unavailable. The bench's names are labels for spec variants:
// disk-direct is a disk with O_DIRECT reads, hdd a disk with reads throttled to --hdd-bw.
std::unique_ptr<TierUnderTest> make_tier(const std::string& name, const BenchTiersArgs& a) {
  auto t = std::make_unique<TierUnderTest>();
  t->name = name;
  std::string spec, note;
  if (name == "device" || name == "host") {
    spec = name;
  } else if (name == "disk" || name == "disk-direct" || name == "hdd") {
    t->tmp_dir = make_temp_dir(a.disk_dir, name);
    // nosync: the files are written once, before any timing.
    spec = "disk:" + t->tmp_dir + ":nosync" + (name == "disk-direct" ? ":direct" : "") +
           (name == "hdd" ? ":bw=" + a.hdd_bw : "");
    note = std::string(name == "disk-direct" ? " (O_DIRECT)" : " (buffered: page cache)") +
           (name == "hdd" ? ", reads throttled" : "");
  } else if (name == "redis") {
    std::string addr = a.redis;
    if (!addr.empty()) {
      const store::RedisTierOptions r = store::redis_tier_options(parse_tier_spec("redis:" + addr));
      if (!store::redis_ping(r.host, r.port)) {
        std::printf("redis: no server answers PING at %s; skipped\n", a.redis.c_str());
        return nullptr;
      }
    } else {
      t->tmp_dir = make_temp_dir(a.disk_dir, "redis");
      std::string why;
      t->redis = store::LocalRedisServer::start(t->tmp_dir, &why);
      if (!t->redis) {
        std::printf("redis: %s; skipped (or give --redis HOST:PORT)\n", why.c_str());
        fs::remove_all(t->tmp_dir);
        return nullptr;
      }
      addr = fmt::format("127.0.0.1:{}", t->redis->port());
    }
    // A prefix of our own, so that the tier indexes only this run's chunks on a shared server; a
    // loaded machine must not turn slow replies into misses (10 s timeout).
    spec = fmt::format("redis:{}:prefix=ct-bench-{}.:timeout=10000", addr, ::getpid());
  } else {
    CT_THROW("unknown tier '{}', expected device, host, disk, disk-direct, hdd or redis", name);
  }
  t->spec = spec + note;
  std::vector<std::unique_ptr<store::Tier>> tiers;
  tiers.push_back(store::make_tier(parse_tier_spec(spec)));
  t->disk = dynamic_cast<store::DiskTier*>(tiers.back().get());
  t->pool = std::make_unique<store::CachePool>(std::move(tiers));
  return t;
}

void print_row(const std::string& tier, const std::string& config, const Summary& s,
               double base_ttft, double full_ttft, bool show_read) {
  std::printf("| %s | %s | %.1f | %.2fx | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %s |\n",
              tier.c_str(), config.c_str(), s.ttft_ms, base_ttft / s.ttft_ms,
              full_ttft > 0 ? fmt::format("{:.2f}x", full_ttft / s.ttft_ms).c_str() : "-",
              s.load_ms, s.load_wait_ms, s.compute_ms, s.select_ms + s.logits_ms, s.cpu_ms,
              show_read ? fmt::format("{:.1f}", s.mib_read).c_str() : "-");
}

void run_bench_tiers(const BenchTiersArgs& a) {
  CT_THROW_IF_NOT(a.repeats >= 1, "--repeats must be at least 1, got {}", a.repeats);
  CT_THROW_IF_NOT(a.ratio > 0 && a.ratio < 1, "--ratio must be in (0, 1), got {}", a.ratio);
  for (const std::string& t : a.tiers) {
    CT_THROW_IF_NOT(t == "device" || t == "host" || t == "disk" || t == "disk-direct" ||
                        t == "hdd" || t == "redis",
                    "unknown tier '{}' in --tiers, expected device, host, disk, disk-direct, hdd "
                    "or redis",
                    t);
  }
  if (std::find(a.tiers.begin(), a.tiers.end(), "hdd") != a.tiers.end()) {
    CT_THROW_IF_NOT(parse_bytes(a.hdd_bw) > 0, "--hdd-bw must be a positive rate, got '{}'",
                    a.hdd_bw);
  }
  const std::vector<BenchRequest> requests = load_requests(a);
  const std::string model_path = resolve_model(a.model);
  auto model = Model::load(model_path);
  const Model& m = *model;
  EncodeOptions eo;
  eo.dtype = parse_kv_dtype(a.kv_dtype);

  // Offline stage, once: every distinct chunk is encoded and kept as a record; each tier then
  // receives exactly these bytes.
  std::map<std::string, ChunkKV> records;
  std::vector<RagPromptTokens> prompts;
  std::vector<std::vector<std::string>> chunk_ids;
  Timer enc;
  for (const BenchRequest& r : requests) {
    prompts.push_back(build_rag_prompt(m.tokenizer(), r.docs, r.question));
    std::vector<std::string> ids;
    for (const auto& toks : prompts.back().chunks) {
      const std::string id = chunk_id(m.fingerprint(), toks, eo);
      if (!records.count(id)) records.emplace(id, encode_chunk(m, toks, eo));
      ids.push_back(id);
    }
    chunk_ids.push_back(std::move(ids));
  }
  size_t kv_bytes = 0;
  for (const auto& [id, rec] : records) kv_bytes += rec.meta.kv_bytes();
  std::fprintf(stderr, "%zu requests, %zu distinct chunks (%.1f MiB of K/V) encoded in %.1f s\n",
               requests.size(), records.size(), kv_bytes / 1048576.0, enc.seconds());

  Runner runner(m, a.ratio, parse_kv_dtype(a.cache_type));
  nlohmann::json out;
  out["command"] = "bench-tiers";
  out["model"] = model_path;
  out["machine"] = sched::machine_identity();
  out["omp_max_threads"] = omp_get_max_threads();
  out["ratio"] = a.ratio;
  out["repeats"] = a.repeats;
  out["kv_dtype"] = a.kv_dtype;
  out["cache_type"] = a.cache_type;
  out["requests"] = nlohmann::json::array();
  out["load_average_start"] = load_average();

  // Reference: full prefill (every chunk row recomputed, nothing loaded).
  std::vector<std::unique_ptr<InMemoryChunk>> mem;
  std::map<std::string, const ChunkSource*> mem_src;
  for (const auto& [id, rec] : records) {
    mem.push_back(std::make_unique<InMemoryChunk>(rec));
    mem_src[id] = mem.back().get();
  }
  auto prepare = [&](const std::map<std::string, const ChunkSource*>& src) {
    std::vector<Prepared> ps;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Prepared p;
      p.req = ComposedRequest{prompts[i].prefix, {}, prompts[i].query};
      for (const auto& id : chunk_ids[i]) p.req.chunks.push_back(src.at(id));
      p.n_total = layout_request(p.req).n_total;
      ps.push_back(std::move(p));
    }
    return ps;
  };
  const std::vector<Prepared> mem_reqs = prepare(mem_src);
  for (size_t i = 0; i < requests.size(); ++i) {
    out["requests"].push_back({{"name", requests[i].name},
                               {"n_prompt", mem_reqs[i].n_total},
                               {"n_chunks", chunk_ids[i].size()}});
  }
  Summary full;
  if (!a.no_full) {
    std::vector<Sample> full_medians;
    for (const Prepared& p : mem_reqs) {
      runner.run(p, &find_policy("full"), {}, nullptr);  // warm-up
      std::vector<Sample> v;
      for (int r = 0; r < a.repeats; ++r)
        v.push_back(runner.run(p, &find_policy("full"), {}, nullptr));
      full_medians.push_back(median_of(v));
    }
    full = summarise(full_medians, mem_reqs);
    out["full"] = to_json(full);
  }

  std::printf(
      "\nbench-tiers: %s, %zu request(s), mean prompt %.0f tokens, cachetune r=%.2f, "
      "median of %d after 1 warm-up, %s, load average %s\n\n",
      fs::path(model_path).filename().string().c_str(), requests.size(),
      [&] {
        double s = 0;
        for (const auto& p : mem_reqs) s += p.n_total;
        return s / mem_reqs.size();
      }(),
      a.ratio, a.repeats, sched::machine_identity().c_str(), load_average().c_str());
  std::printf(
      "| tier | configuration | TTFT ms | vs (a) | vs full | load ms | load wait ms | "
      "compute ms | select+logits ms | CPU ms | MiB read |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  if (!a.no_full)
    print_row("-", "full prefill (reference)", full, full.ttft_ms, full.ttft_ms, false);
  std::fflush(stdout);

  std::map<std::string, std::map<std::string, double>> ttft;  // tier -> step -> mean TTFT
  for (const std::string& name : a.tiers) {
    std::unique_ptr<TierUnderTest> t = make_tier(name, a);
    if (!t) {
      out["tiers"].push_back({{"tier", name}, {"skipped", true}});
      continue;
    }
    for (const auto& [id, rec] : records) {
      CT_THROW_IF_NOT(t->pool->put(rec), "tier {}: chunk {} could not be stored", name,
                      id.substr(0, 12));
    }
    std::vector<std::unique_ptr<PooledChunk>> keep;
    std::map<std::string, const ChunkSource*> src;
    for (const auto& [id, rec] : records) {
      std::optional<ChunkMeta> meta = t->pool->lookup(id);
      CT_THROW_IF_NOT(meta.has_value(), "tier {}: chunk {} missing right after put", name,
                      id.substr(0, 12));
      keep.push_back(std::make_unique<PooledChunk>(*t->pool, std::move(*meta)));
      src[id] = keep.back().get();
    }
    const std::vector<Prepared> reqs = prepare(src);
    // One warm-up run per request, then the steps interleaved round by round, each round
    // starting at the next step, so that a slow phase of the machine (the cores are shared) and
    // the position within a round hit every step alike.
    std::vector<std::vector<std::vector<Sample>>> samples(
        std::size(kSteps), std::vector<std::vector<Sample>>(reqs.size()));
    for (const Prepared& p : reqs) runner.run(p, &find_policy("cachetune"), kSteps[0].pipe, t->disk);
    for (int r = 0; r < a.repeats; ++r) {
      for (size_t k = 0; k < std::size(kSteps); ++k) {
        const size_t si = (r + k) % std::size(kSteps);
        for (size_t q = 0; q < reqs.size(); ++q) {
          samples[si][q].push_back(
              runner.run(reqs[q], &find_policy("cachetune"), kSteps[si].pipe, t->disk));
        }
      }
    }
    nlohmann::json tj = {{"tier", name}, {"spec", t->spec}, {"steps", nlohmann::json::array()}};
    double base = 0;
    for (size_t si = 0; si < std::size(kSteps); ++si) {
      std::vector<Sample> medians;
      for (auto& v : samples[si]) medians.push_back(median_of(v));
      const Summary s = summarise(medians, reqs);
      if (si == 0) base = s.ttft_ms;
      ttft[name][kSteps[si].key] = s.ttft_ms;
      print_row(name, kSteps[si].label, s, base, full.ttft_ms, t->disk != nullptr);
      nlohmann::json sj = to_json(s);
      sj["step"] = kSteps[si].key;
      sj["label"] = kSteps[si].label;
      sj["pipeline"] = {{"overlap", kSteps[si].pipe.overlap},
                        {"sparse", kSteps[si].pipe.sparse},
                        {"rope_in_loader", kSteps[si].pipe.rope_in_loader}};
      tj["steps"].push_back(std::move(sj));
    }
    std::fflush(stdout);
    const store::PoolStat st = t->pool->stat();
    CT_THROW_IF_NOT(st.misses == 0 && st.dropped == 0,
                    "tier {}: {} failed reads and {} dropped chunks during the benchmark; the "
                    "timings are not valid",
                    name, st.misses, st.dropped);
    out["tiers"].push_back(std::move(tj));
    keep.clear();
    // Leaves nothing behind, which matters for a Redis server given with --redis.
    for (const auto& [id, rec] : records) t->pool->evict(id);
    t->pool.reset();
    t->redis.reset();
    if (!t->tmp_dir.empty()) fs::remove_all(t->tmp_dir);
  }

  if (ttft.count("host") && ttft.count("device")) {
    const double host = ttft["host"]["d"], dev_d = ttft["device"]["d"], dev_a = ttft["device"]["a"];
    std::printf(
        "\nhost tier (d) vs device-resident: %.1f ms vs %.1f ms with the same pipeline "
        "(%.2fx), vs %.1f ms on the unpipelined path (a) (%.2fx)\n",
        host, dev_d, host / dev_d, dev_a, host / dev_a);
    out["host_vs_device"] = {{"host_d_ms", host},
                             {"device_d_ms", dev_d},
                             {"device_a_ms", dev_a},
                             {"host_d_over_device_d", host / dev_d},
                             {"host_d_over_device_a", host / dev_a}};
  }
  out["load_average_end"] = load_average();
  std::printf("\nload average at the end: %s\n", load_average().c_str());
  out["peak_rss_mib"] = peak_rss_bytes() / 1048576.0;
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    CT_THROW_IF_NOT(f.good(), "cannot write --json file '{}'", a.json_out);
    f << out.dump(2) << "\n";
  }
}

}  // namespace

void register_bench_tiers(CLI::App& app) {
  auto a = std::make_shared<BenchTiersArgs>();
  CLI::App* c = app.add_subcommand(
      "bench-tiers",
      "Cache-loading ablation per storage tier (paper Table 4): TTFT with overlap, sparse loading "
      "and deferred RoPE switched on in turn");
  add_model_option(c, &a->model);
  c->add_option("--docs", a->docs, "Documents of the one request (default: examples/docs/*.txt)");
  c->add_option("-q,--question", a->question, "Question over --docs")->capture_default_str();
  c->add_option("--data", a->data, "JSONL file of requests (\"chunks\", \"question\" per line)");
  c->add_option("--limit", a->limit, "Requests read from --data (0: all)")->capture_default_str();
  c->add_option("-r,--ratio", a->ratio, "cachetune recompute ratio r")->capture_default_str();
  c->add_option("--repeats", a->repeats, "Timed runs per configuration (median kept)")
      ->capture_default_str();
  c->add_option("--tiers", a->tiers,
                "Tiers to measure: device, host, disk (buffered), disk-direct (O_DIRECT), hdd "
                "(disk throttled to --hdd-bw), redis")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--disk-dir", a->disk_dir,
                "Parent of the temporary disk-tier directories "
                "(default: $TMPDIR or /tmp)");
  c->add_option("--hdd-bw", a->hdd_bw,
                "Read bandwidth of the emulated HDD (bytes/s; K/M/G are "
                "binary)")
      ->capture_default_str();
  c->add_option("--redis", a->redis,
                "HOST:PORT of a running Redis server (default: start a local redis-server)");
  add_kv_dtype_option(c, &a->kv_dtype);
  add_cache_type_option(c, &a->cache_type);
  c->add_option("--json", a->json_out, "Also write the results as JSON to this file");
  c->add_flag("--no-full", a->no_full, "Skip the full-prefill reference");
  c->callback([a] { run_bench_tiers(*a); });
}

}  // namespace ct::cli
