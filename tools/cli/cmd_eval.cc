// `cachetune eval`: runs data files through the reuse policies (src/eval/runner.h), prints a
// progress line with ETA per finished unit on stderr and a table of the base setting on stdout.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/timer.h"
#include "eval/runner.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"

namespace ct::cli {
namespace {

// Defaults sized so that `cachetune eval --data shared/data --out DIR` (all five tasks) takes
// about an hour on the 2-core development machine. Measured with all 11 policies: ~2.6 min per
// hotpotqa example (1.9K tokens), ~10 min per musique example (6.2K tokens); estimated from
// token counts: ~10 min per 2wikimqa, ~5 min per multi_news / cacheblend_wiki example. The
// policies left out of the default list (prefix: quality of full by construction at nearly full
// cost; l2 and lfonly: the ablations of Sec. 5.4) cost about a fifth of that; list them with
// --policies. docs/RESULTS.md records the measured runs.
constexpr const char* kDefaultPolicies =
    "full,reuse,cachetune,cacheblend,epic,random,highfreq,prophetkv";
constexpr int kDefaultLimit = 2;

struct EvalArgs {
  std::string model;  // a registry name or a path; empty: the default model
  std::vector<std::string> data;
  std::string policies = kDefaultPolicies;
  double ratio = 0.15;
  double alpha = 0.5;
  int limit = kDefaultLimit;
  std::string out;
  int max_tokens_qa = 32;
  int max_tokens_summary = 128;
  int kl_positions = 8;
  bool robustness = false;
  int extra_context = 1024;
  bool sweep_ratio = false;
  bool sweep_alpha = false;
  std::string sweep_ratios = "0.05,0.1,0.15,0.2,0.3,0.4";
  std::string sweep_alphas = "0.1,0.3,0.5,0.7,0.9,1.0";
  std::string sweep_policies = "cachetune";
  uint64_t seed = 0;
  int cache_mib = 1024;
  bool no_sink = false;
  bool no_attention = false;
  bool summarize_only = false;
  int probe_layers = 0;
  std::string probe_text = kDefaultProbeText;
  std::string command;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<const Policy*> parse_policies(const std::string& s) {
  std::vector<const Policy*> out;
  for (const auto& n : split_list(s)) out.push_back(&find_policy(n));
  CT_THROW_IF_NOT(!out.empty(), "empty policy list '{}'", s);
  return out;
}

std::vector<double> parse_numbers(const std::string& s, const char* what) {
  std::vector<double> out;
  for (const auto& n : split_list(s)) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(n, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CT_THROW_IF_NOT(used == n.size(), "{}: '{}' is not a number", what, n);
    out.push_back(v);
  }
  return out;
}

// Files as given; a directory stands for its *.jsonl files in name order.
std::vector<std::string> expand_data(const std::vector<std::string>& in) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const auto& p : in) {
    if (fs::is_directory(p)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.path().extension() == ".jsonl") files.push_back(e.path().string());
      }
      std::sort(files.begin(), files.end());
      CT_THROW_IF_NOT(!files.empty(), "data directory '{}' holds no .jsonl files", p);
      out.insert(out.end(), files.begin(), files.end());
    } else {
      CT_THROW_IF_NOT(fs::exists(p), "data file '{}' not found", p);
      out.push_back(p);
    }
  }
  return out;
}

std::string clock(double s) {
  const long t = (long)(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string cell(const nlohmann::json& v, const char* f) {
  return v.is_number() ? fmt::format(fmt::runtime(f), v.get<double>()) : std::string("-");
}

void print_table(const nlohmann::json& summary) {
  std::printf("%-16s %-11s %6s %6s %6s %7s %6s %6s %9s %7s\n", "task", "policy", "score", "vsfull",
              "fid", "KL", "cos", "recall", "TTFT ms", "speedup");
  for (auto t = summary["tasks"].begin(); t != summary["tasks"].end(); ++t) {
    const auto& settings = t.value()["settings"];
    if (!settings.contains("base")) continue;
    for (auto p = settings["base"].begin(); p != settings["base"].end(); ++p) {
      const auto& v = p.value();
      std::printf("%-16s %-11s %6s %6s %6s %7s %6s %6s %9s %7s\n", t.key().c_str(), p.key().c_str(),
                  cell(v["task_score"], "{:.3f}").c_str(),
                  cell(v["score_vs_full"], "{:.2f}").c_str(),
                  cell(v["fid_score"], "{:.3f}").c_str(), cell(v["kl"], "{:.4f}").c_str(),
                  cell(v["attn_cos"], "{:.3f}").c_str(), cell(v["recall"], "{:.3f}").c_str(),
                  cell(v["ttft_ms"], "{:.0f}").c_str(), cell(v["speedup"], "{:.2f}").c_str());
    }
  }
}

// The command as typed (from /proc/self/cmdline), recorded in run.json and docs/RESULTS.md.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string cmd;
  size_t pos = 0;
  for (bool first = true; pos < raw.size(); first = false) {
    size_t end = raw.find('\0', pos);
    if (end == std::string::npos) end = raw.size();
    std::string arg = raw.substr(pos, end - pos);
    if (first) arg = std::filesystem::path(arg).filename().string();
    if (arg.find_first_of(" \t'\"$") != std::string::npos) arg = "'" + arg + "'";
    cmd += (cmd.empty() ? "" : " ") + arg;
    pos = end + 1;
  }
  return cmd;
}

void run_eval_one(const EvalArgs& a, const std::string& model_path, const std::string& out);

void run_eval_cmd(const EvalArgs& a) {
  if (a.summarize_only) {
    CT_THROW_IF_NOT(!a.out.empty(), "give the output directory with --out DIR");
    // A directory of several models' results (--model A,B) is summarised model by model.
    std::vector<std::string> dirs;
    if (!std::filesystem::exists(a.out + "/results.jsonl") && std::filesystem::is_directory(a.out)) {
      for (const auto& e : std::filesystem::directory_iterator(a.out)) {
        if (std::filesystem::exists(e.path() / "results.jsonl")) dirs.push_back(e.path().string());
      }
      std::sort(dirs.begin(), dirs.end());
    }
    if (dirs.empty()) dirs.push_back(a.out);
    for (const std::string& d : dirs) {
      const nlohmann::json s = summarize_eval(d);
      std::fprintf(stderr, "eval: %d records summarised into %s/summary.json\n",
                   s["n_records"].get<int>(), d.c_str());
    }
    return;
  }
  CT_THROW_IF_NOT(!a.data.empty(), "give the data with --data FILE.jsonl (or a directory)");
  CT_THROW_IF_NOT(!a.out.empty(), "give the output directory with --out DIR");
  // --model A,B: one results directory per model under --out, named after the argument (a
  // registry name, or a path's file name without .gguf). Every model resolves before any runs.
  std::vector<std::string> models, names, paths;
  for (size_t b = 0, e = 0; b <= a.model.size(); b = e + 1) {
    e = std::min(a.model.find(',', b), a.model.size());
    std::string m = a.model.substr(b, e - b);
    m.erase(0, m.find_first_not_of(" \t"));
    m.erase(m.find_last_not_of(" \t") + 1);
    models.push_back(m);
    CT_THROW_IF_NOT(!models.back().empty() || a.model.empty(),
                    "--model '{}': an empty name in the comma-separated list", a.model);
  }
  for (const std::string& m : models) {
    paths.push_back(resolve_model(m));  // before the data: fail fast
    std::string name = std::filesystem::path(m).filename().string();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
    CT_THROW_IF_NOT(std::find(names.begin(), names.end(), name) == names.end(),
                    "--model '{}': two models named '{}' would share {}/{}", a.model, name, a.out,
                    name);
    names.push_back(name);
  }
  for (size_t i = 0; i < models.size(); ++i) {
    const std::string out = models.size() > 1 ? a.out + "/" + names[i] : a.out;
    if (models.size() > 1) {
      std::fprintf(stderr, "eval: model %zu of %zu, %s, into %s\n", i + 1, models.size(),
                   models[i].c_str(), out.c_str());
    }
    run_eval_one(a, paths[i], out);
  }
}

void run_eval_one(const EvalArgs& a, const std::string& model_path, const std::string& out) {
  EvalOptions o;
  o.data_files = expand_data(a.data);
  o.policies = parse_policies(a.policies);
  o.ratio = a.ratio;
  o.alpha = a.alpha;
  o.limit = a.limit;
  o.out_dir = out;
  o.max_tokens_qa = a.max_tokens_qa;
  o.max_tokens_summary = a.max_tokens_summary;
  o.kl_positions = a.kl_positions;
  o.robustness = a.robustness;
  o.extra_context_tokens = a.extra_context;
  if (a.sweep_ratio) o.sweep_ratios = parse_numbers(a.sweep_ratios, "--sweep-ratios");
  if (a.sweep_alpha) o.sweep_alphas = parse_numbers(a.sweep_alphas, "--sweep-alphas");
  o.sweep_policies = parse_policies(a.sweep_policies);
  o.seed = a.seed;
  o.sink = !a.no_sink;
  o.probe.layers = a.probe_layers;
  o.attention = !a.no_attention;
  o.probe.text = a.probe_text;
  o.chunk_cache_bytes = (size_t)a.cache_mib << 20;
  o.command = a.command;
  o.log = [](const std::string& s) { std::fprintf(stderr, "eval: %s\n", s.c_str()); };
  o.progress = [](const EvalProgress& p) {
    const double eta = p.done > 0 ? p.elapsed_s / p.done * (p.total - p.done) : 0.0;
    std::fprintf(stderr, "eval: [%d/%d] %s %s %s %.1fs | elapsed %s | ETA %s\n", p.done, p.total,
                 p.example.c_str(), p.setting.c_str(), p.policy.c_str(), p.unit_s,
                 clock(p.elapsed_s).c_str(), clock(eta).c_str());
  };
  if (!std::getenv("OMP_WAIT_POLICY")) {
    std::fprintf(
        stderr,
        "eval: note: OMP_WAIT_POLICY is unset; on a shared machine OMP_WAIT_POLICY=passive "
        "avoids spinning threads (decoding was 20x faster with it on the 2-core box)\n");
  }
  Timer lt;
  std::fprintf(stderr, "eval: loading %s ...\n", model_path.c_str());
  auto model = Model::load(model_path);
  std::fprintf(stderr, "eval: loaded in %.1fs; settings:", lt.seconds());
  for (const auto& s : eval_setting_names(o)) std::fprintf(stderr, " %s", s.c_str());
  std::fprintf(stderr, "\n");
  const EvalStats st = run_eval(*model, o);
  std::fprintf(stderr, "eval: %d units run, %d already done, %s; results in %s, summary in %s\n",
               st.n_run, st.n_skipped, clock(st.seconds).c_str(), st.results_path.c_str(),
               st.summary_path.c_str());
  std::ifstream in(st.summary_path);
  print_table(nlohmann::json::parse(in));
}

}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = app.add_subcommand(
      "eval", "Run data files through the reuse policies: task score, fidelity to full, TTFT");
  add_model_option(c, &a->model)
      ->description(
          "Model(s): a name from `cachetune models` or a GGUF path; several, comma-separated, "
          "write one results directory per model under --out (--out/NAME; one model writes into "
          "--out itself)");
  c->add_option("--data", a->data, "JSONL data file(s) or a directory of them")->required();
  c->add_option("--policies", a->policies,
                "Comma-separated policies (full is always run): " + policy_names())
      ->capture_default_str();
  c->add_option("--ratio", a->ratio, "Recompute ratio r")->capture_default_str();
  c->add_option("--alpha", a->alpha, "Low-frequency cutoff of the stored ranking")
      ->capture_default_str();
  c->add_option("--limit", a->limit, "First N examples of each file (0 = all)")
      ->capture_default_str();
  c->add_option("--out", a->out, "Output directory (resumed if it holds results)")->required();
  c->add_option("--max-tokens-qa", a->max_tokens_qa, "Answer budget for QA tasks")
      ->capture_default_str();
  c->add_option("--max-tokens-summary", a->max_tokens_summary,
                "Answer budget for summarisation tasks")
      ->capture_default_str();
  c->add_option("--kl-positions", a->kl_positions, "Teacher-forced answer positions for the KL")
      ->capture_default_str();
  c->add_flag("--robustness", a->robustness,
              "Also run shuffled chunk order and extra preceding context");
  c->add_option("--extra-context", a->extra_context, "Filler tokens for --robustness")
      ->capture_default_str();
  c->add_flag("--sweep-ratio", a->sweep_ratio, "Add settings r=<v> for --sweep-ratios");
  c->add_option("--sweep-ratios", a->sweep_ratios, "Ratios of --sweep-ratio")
      ->capture_default_str();
  c->add_flag("--sweep-alpha", a->sweep_alpha, "Add settings alpha=<v> for --sweep-alphas");
  c->add_option("--sweep-alphas", a->sweep_alphas, "Cutoffs of --sweep-alpha")
      ->capture_default_str();
  c->add_option("--sweep-policies", a->sweep_policies, "Policies run in the sweep settings")
      ->capture_default_str();
  c->add_option("--seed", a->seed, "Seed of the random policy and the shuffles")
      ->capture_default_str();
  c->add_option("--chunk-cache-mib", a->cache_mib, "In-memory chunk encoding cache")
      ->capture_default_str();
  c->add_flag("--summarize-only", a->summarize_only,
              "Only rewrite summary.json of --out from its results.jsonl (e.g. after a run was "
              "stopped); --data is then ignored");
  c->add_flag("--no-attention", a->no_attention,
              "Skip the untimed second prefill per policy that measures the query attention "
              "(attn_cos is then empty)");
  c->add_option("--probe-layers", a->probe_layers,
                 "Layers of the probe policy's second pass (0: max(2, ceil(n_layer/5)))")
      ->capture_default_str();
  c->add_option("--probe-text", a->probe_text, "Probe context of the probe policy")
      ->capture_default_str();
  c->add_flag("--no-sink", a->no_sink,
              "Encode chunks from position 0 without a BOS sink token (the drift reference too)");
  c->callback([a] {
    a->command = command_line();
    run_eval_cmd(*a);
  });
}

}  // namespace ct::cli
