// Evaluation runner. Per example: encode its chunks once (cached by id), then per prompt layout
// (base, shuffled, extra preceding context) run full recompute as the reference, capture the
// full-context K/V for drift when a selection policy needs it, and run each pending policy.
#include "eval/runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "backend/cpu_forward.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/timer.h"
#include "engine/generate.h"
#include "eval/chunk_cache.h"
#include "eval/dataset.h"
#include "eval/fidelity.h"
#include "eval/plan.h"
#include "eval/results_io.h"
#include "model/sampler.h"
#include "reuse/encoder.h"
#include "reuse/first_token.h"
#include "reuse/freq_rank.h"
#include "reuse/prompt.h"
#include "reuse/selective.h"

namespace ct {
namespace {

using nlohmann::json;
using namespace eval;
namespace fs = std::filesystem;

// ---- one example
// ------------------------------------------------------------------------------------

struct Outcome {
  DecodeResult answer;
  double ttft_ms = 0;
  PrefillBreakdown bd;
  SelectionReport sel;
  std::vector<float> attn;           // F32 [n_total] query attention (when measured)
  std::vector<float> forced_logits;  // F32 [n_forced][n_vocab]
};

// One policy on one request: the timed prefill plus first-token sample (TTFT), greedy decoding,
// then teacher forcing of `forced` from the same prompt cache. The query attention comes from a
// second, untimed prefill with the tap on, so that TTFT carries no instrumentation.
Outcome run_policy(const Model& m, const ComposedRequest& req, const PolicyOptions& po,
                   int max_tokens, bool want_attn,
                   const std::function<std::vector<int32_t>(const DecodeResult&)>& forced_of,
                   KVCache& kv, Workspace& ws) {
  // The prefix policy reuses the instruction head from an earlier request with the same head,
  // simulated by a cache seeded with a prefill of exactly that head (deterministic, and the
  // same whether or not the run was resumed).
  PrefixCache pc(1);
  if (po.kind->uses_prefix_cache() && !req.prefix.empty()) {
    KVCache pkv = m.make_cache((int)req.prefix.size());
    cpu::prefill(m, req.prefix.data(), (int)req.prefix.size(), 0, pkv, ws);
    pc.remember(req.prefix, pkv);
  }
  SelectiveOptions so;
  so.policy = po;
  so.prefix_cache = &pc;
  Outcome out;
  kv.n_pos = 0;
  // TTFT as every measuring tool defines it (reuse/first_token.h); rankings a deployment would
  // store (l2, highfreq, freq on a record laid out otherwise) are computed before the timer.
  FirstToken ft = run_to_first_token(m, req, so, kv, ws, &out.sel);
  out.ttft_ms = ft.ttft_ms;
  out.bd = ft.bd;
  std::vector<float> logits = std::move(ft.logits);
  const int n_prompt = kv.n_pos;
  GenerateOptions g;
  g.max_tokens = max_tokens;
  out.answer = decode(m, kv, ws, logits, g);
  const std::vector<int32_t> forced = forced_of(out.answer);
  kv.n_pos = n_prompt;  // decoding's rows are overwritten by the forced tokens
  if (!forced.empty()) {
    out.forced_logits = forced_decode_logits(m, kv, ws, logits, forced);
  } else {
    out.forced_logits = logits;
  }
  if (want_attn && po.kind->stage() != PolicyStage::kTokens) {
    so.query_attention = &out.attn;
    kv.n_pos = 0;
    PrefillBreakdown unused;
    selective_prefill(m, req, so, kv, ws, &unused);
  }
  return out;
}

json breakdown_json(const PrefillBreakdown& b) {
  return {
      {"select_ms", b.select_ms},   {"load_ms", b.load_ms},     {"load_wait_ms", b.load_wait_ms},
      {"compute_ms", b.compute_ms}, {"logits_ms", b.logits_ms}, {"total_ms", b.total_ms},
      {"n_total", b.n_total},       {"n_active", b.n_active},   {"n_loaded", b.n_loaded}};
}

// KV energy fraction per frequency band of the isolated encodings, averaged over the chunks.
std::vector<double> band_energy(const std::vector<std::shared_ptr<const ChunkKV>>& recs,
                                int n_bands) {
  std::vector<double> band(n_bands, 0.0);
  for (const auto& r : recs) {
    const ChunkMeta& mt = r->meta;
    const ChunkKVF32 f = unpack_text_order(*r);
    std::vector<const float*> kl(mt.n_layer), vl(mt.n_layer);
    for (int l = 0; l < mt.n_layer; ++l) {
      kl[l] = f.k_layer(l, mt.n_tok, mt.kv_dim);
      vl[l] = f.v_layer(l, mt.n_tok, mt.kv_dim);
    }
    const auto e = kv_band_energy(kl, vl, mt.n_tok, mt.kv_dim, n_bands);
    for (int i = 0; i < n_bands; ++i) band[i] += e[i] / recs.size();
  }
  return band;
}

class Runner {
 public:
  Runner(const Model& m, const EvalOptions& o)
      : m_(m),
        o_(o),
        settings_(make_settings(o)),
        cache_(m, encode_options(o), o.chunk_cache_bytes) {}

  EvalStats run();

 private:
  static EncodeOptions encode_options(const EvalOptions& o) {
    EncodeOptions e;
    e.dtype = o.dtype;
    e.sink = o.sink;
    e.rank.alpha = o.alpha;
    e.probe = o.probe;
    // The stored ranking is the product's (EncodeOptions' default, which `cachetune` selects
    // from); the rankings the other policies read (Policy::ingest_rankings: freq's, the probe
    // ones) are computed from the same isolated encoding in F32 when they are not the stored one.
    for (const auto* list : {&o.policies, &o.sweep_policies}) {
      for (const Policy* p : *list) {
        for (RankMode mode : p->ingest_rankings()) {
          const bool have = mode == e.rank.mode ||
                            std::any_of(e.also.begin(), e.also.end(),
                                        [&](const RankOptions& r) { return r.mode == mode; });
          if (have) continue;
          RankOptions r;
          r.mode = mode;
          r.alpha = o.alpha;
          e.also.push_back(r);
        }
      }
    }
    return e;
  }
  void note(const std::string& s) const {
    if (o_.log) o_.log(s);
  }
  // Units (setting name, policy) of one example not yet in the results file, reference units
  // first per layout.
  std::vector<std::pair<const Setting*, const Policy*>> pending_units(const EvalExample& ex) const;
  void run_example(const std::vector<EvalExample>& file, size_t idx,
                   const std::vector<std::pair<const Setting*, const Policy*>>& units);
  void finish_unit(const std::string& ex, const std::string& setting, const Policy* k) {
    ++stats_.n_run;
    EvalProgress p;
    p.done = stats_.n_run;
    p.total = total_units_;
    p.example = ex;
    p.setting = setting;
    p.policy = k->name();
    p.unit_s = unit_t_.seconds();
    p.elapsed_s = run_t_.seconds();
    unit_t_.reset();
    if (o_.progress) o_.progress(p);
  }

  const Model& m_;
  const EvalOptions& o_;
  std::vector<Setting> settings_;
  ChunkCache cache_;
  std::set<std::string> done_;
  std::unique_ptr<ResultsWriter> out_;
  EvalStats stats_;
  int total_units_ = 0;
  Timer run_t_, unit_t_;
};

std::vector<std::pair<const Setting*, const Policy*>> Runner::pending_units(
    const EvalExample& ex) const {
  std::vector<std::pair<const Setting*, const Policy*>> u;
  for (Layout l : {Layout::kBase, Layout::kShuffle, Layout::kExtraContext}) {
    std::vector<std::pair<const Setting*, const Policy*>> lu;
    const Setting* ref = nullptr;
    for (const Setting& s : settings_) {
      if (s.layout != l) continue;
      if (s.name == layout_setting_name(l, o_)) ref = &s;
      for (const Policy* k : s.policies) {
        if (!done_.count(unit_key(ex.id, s.name, k->name()))) lu.push_back({&s, k});
      }
    }
    if (!ref) continue;
    const bool ref_done = done_.count(unit_key(ex.id, ref->name, "full")) > 0;
    if (!ref_done) u.push_back({ref, &find_policy("full")});
    u.insert(u.end(), lu.begin(), lu.end());
  }
  return u;
}

void Runner::run_example(const std::vector<EvalExample>& file, size_t idx,
                         const std::vector<std::pair<const Setting*, const Policy*>>& units) {
  const EvalExample& ex = file[idx];
  const TaskSpec spec = task_spec(ex.task);
  const int max_tokens = spec.kind == TaskKind::kSummary ? o_.max_tokens_summary : o_.max_tokens_qa;
  const Tokenizer& tok = m_.tokenizer();
  const ModelConfig& c = m_.config();
  const int V = c.n_vocab;
  const RagPromptTokens prompt = build_rag_prompt(tok, ex.chunks, ex.question, spec.instruction);

  const double enc_before = cache_.encode_ms(), fwd_before = cache_.forward_ms(),
               rank_before = cache_.rank_ms(), probe_before = cache_.also_ms();
  const std::map<std::string, double> also_before = cache_.also_ms_by_name();
  std::vector<std::shared_ptr<const ChunkKV>> recs;
  for (const auto& t : prompt.chunks) recs.push_back(cache_.get(t));
  const double encode_ms = cache_.encode_ms() - enc_before;
  const double encode_forward_ms = cache_.forward_ms() - fwd_before;
  const double encode_rank_ms = cache_.rank_ms() - rank_before;
  const double encode_probe_ms = cache_.also_ms() - probe_before;
  int n_chunk_tokens = 0;
  for (const auto& r : recs) n_chunk_tokens += r->meta.n_tok;

  Workspace ws;
  for (Layout layout : {Layout::kBase, Layout::kShuffle, Layout::kExtraContext}) {
    std::vector<std::pair<const Setting*, const Policy*>> lu;
    for (const auto& u : units) {
      if (u.first->layout == layout) lu.push_back(u);
    }
    if (lu.empty()) continue;
    const std::string ref_name = layout_setting_name(layout, o_);

    // Prompt layout: chunk order and prefix.
    std::vector<int> order(recs.size());
    std::iota(order.begin(), order.end(), 0);
    if (layout == Layout::kShuffle) order = shuffled_order((int)recs.size(), o_.seed, ex.id);
    ComposedRequest base_req{prompt.prefix, {}, prompt.query};
    if (layout == Layout::kExtraContext) {
      const auto fill = filler_tokens(tok, file, idx, o_.extra_context_tokens);
      base_req.prefix.insert(base_req.prefix.end(), fill.begin(), fill.end());
    }
    std::vector<std::unique_ptr<InMemoryChunk>> srcs;
    for (int b : order) {
      srcs.push_back(std::make_unique<InMemoryChunk>(*recs[b]));
      base_req.chunks.push_back(srcs.back().get());
    }
    const RequestLayout lay = layout_request(base_req);
    const int n_ctx = lay.n_total + max_tokens + o_.kl_positions + 2;
    CT_THROW_IF_NOT(n_ctx <= c.n_ctx_train,
                    "{}:{}: example '{}' ({}) needs {} positions ({} prompt tokens + answer), more "
                    "than the model's context of {}",
                    ex.file, ex.line, ex.id, ref_name, n_ctx, lay.n_total, c.n_ctx_train);
    KVCache kv = m_.make_cache(n_ctx);
    const Setting* ref_setting = nullptr;
    for (const Setting& st : settings_) {
      if (st.name == ref_name) ref_setting = &st;
    }
    CT_ASSERT(ref_setting != nullptr, "no setting for layout {}", ref_name);
    const bool has_gold = !ex.answers.empty();
    auto record = [&](const Setting& st, const Policy* k, const Outcome& r, const Reference& ref) {
      json j = {{"example", ex.id},
                {"task", ex.task},
                {"setting", st.name},
                {"ref_setting", ref_name},
                {"policy", k->name()},
                {"ratio", st.ratio},
                {"alpha", st.alpha},
                {"n_prompt", lay.n_total},
                {"n_chunks", (int)recs.size()},
                {"n_chunk_tokens", n_chunk_tokens},
                {"answer", r.answer.text},
                {"n_answer_tokens", (int)r.answer.tokens.size()},
                {"stopped_at_eog", r.answer.stopped_at_eog},
                {"metric", spec.metric},
                {"task_score",
                 has_gold ? json(task_metric_max(spec, r.answer.text, ex.answers)) : json(nullptr)},
                {"ttft_ms", r.ttft_ms},
                // 2: reuse/first_token.h (the first token's text included, every policy's
                // ingest-time ranking computed before the timer); records without it are 1.
                {"ttft_def", 2},
                {"decode_ms", r.answer.decode_s * 1e3},
                {"breakdown", breakdown_json(r.bd)}};
      // Identical answers are fully faithful even when the metric scores "" vs "" as 0.
      j["fid_score"] =
          r.answer.text == ref.answer ? 1.0 : task_metric(spec, r.answer.text, ref.answer);
      const int n_kl = std::max<int>(1, (int)ref.forced.size());
      j["kl"] = mean_kl_from_logits(ref.forced_logits, r.forced_logits, V, n_kl);
      j["kl_positions"] = n_kl;
      j["attn_cos"] =
          r.attn.empty() ? json(nullptr)
                         : json(cosine_similarity(ref.attn.data(), r.attn.data(), lay.query_begin));
      return j;
    };

    // Reference: full recompute, then one tapped full prefill for drift and query attention.
    std::vector<int> chunk_tokens;
    for (int b : order) chunk_tokens.push_back(recs[b]->meta.n_tok);
    const std::string ref_file = o_.out_dir + "/refs/" + ex.id + "." + ref_name + ".bin";
    const bool ref_recorded = done_.count(unit_key(ex.id, ref_name, "full")) > 0;
    Reference ref;
    if (!ref_recorded || !read_reference(ref_file, V, lay.n_total, chunk_tokens, ref)) {
      PolicyOptions fpo;
      fpo.kind = &find_policy("full");
      Outcome full = run_policy(
          m_, base_req, fpo, max_tokens, false,
          [&](const DecodeResult& d) {
            return std::vector<int32_t>(
                d.tokens.begin(),
                d.tokens.begin() + std::min<size_t>(d.tokens.size(), o_.kl_positions));
          },
          kv, ws);
      ref.answer = full.answer.text;
      ref.forced.assign(full.answer.tokens.begin(),
                        full.answer.tokens.begin() +
                            std::min<size_t>(full.answer.tokens.size(), o_.kl_positions));
      ref.forced_logits = full.forced_logits;
      {
        const PrefillKV ctx = capture_prefill_kv(m_, lay.tokens, lay.query_begin);
        ref.attn = ctx.query_attention;
        ref.drift.clear();
        for (size_t b = 0; b < base_req.chunks.size(); ++b) {
          ref.drift.push_back(chunk_drift(*recs[order[b]], ctx, lay.chunk_offset[b]));
        }
      }
      write_reference(ref_file, ref);
      if (!ref_recorded) {
        full.attn = ref.attn;
        json j = record(*ref_setting, &find_policy("full"), full, ref);
        j["encode_ms"] = encode_ms;
        // Ingest cost: the isolated prefill, the stored (freq) ranking, the probe pass.
        j["encode_forward_ms"] = encode_forward_ms;
        j["encode_rank_ms"] = encode_rank_ms;
        j["encode_probe_ms"] = encode_probe_ms;
        // Per ranking of EncodeOptions::also (encode_probe_ms is their sum), and whether the
        // isolated prefill (encode_forward_ms) carried the attention tap of the attn rankings.
        json by_name = json::object();
        for (const auto& [name, ms] : cache_.also_ms_by_name()) {
          const auto it = also_before.find(name);
          by_name[name] = ms - (it == also_before.end() ? 0.0 : it->second);
        }
        j["encode_also_ms"] = by_name;
        j["encode_attention_tap"] = encode_taps_attention(encode_options(o_));
        if (layout == Layout::kBase) j["band_energy"] = band_energy(recs, o_.n_bands);
        // Per chunk in prompt order: the mean true drift, and the mean stored probe score (the
        // chunk's probe drift), for analysing how a shared budget should split across chunks.
        json drift_mean = json::array(), probe_mean = json::array();
        for (size_t b = 0; b < ref.drift.size(); ++b) {
          const auto& d = ref.drift[b];
          double sum = 0;
          for (float v : d) sum += v;
          drift_mean.push_back(d.empty() ? 0.0 : sum / d.size());
          const ChunkMeta& mt = recs[order[b]]->meta;
          if (mt.rank_mode == rank_mode_name(RankMode::kProbe) && !mt.scores.empty()) {
            double ps = 0;
            for (float v : mt.scores) ps += v;
            probe_mean.push_back(ps / mt.scores.size());
          }
        }
        j["chunk_drift_mean"] = drift_mean;
        if (probe_mean.size() == ref.drift.size()) j["chunk_probe_mean"] = probe_mean;
        out_->append(j);
        done_.insert(unit_key(ex.id, ref_name, "full"));
        finish_unit(ex.id, ref_name, &find_policy("full"));
      }
    }
    const std::vector<std::vector<float>>& drift = ref.drift;

    for (const auto& [s, k] : lu) {
      if (k == &find_policy("full")) continue;
      ComposedRequest req = base_req;
      std::vector<ChunkKV> reranked;
      std::vector<std::unique_ptr<InMemoryChunk>> rsrcs;
      if (s->rerank) {
        RankOptions ro;
        ro.alpha = s->alpha;
        for (int b : order) reranked.push_back(rerank_record(*recs[b], ro));
        req.chunks.clear();
        for (const ChunkKV& r : reranked) {
          rsrcs.push_back(std::make_unique<InMemoryChunk>(r));
          req.chunks.push_back(rsrcs.back().get());
        }
      }
      PolicyOptions po;
      po.kind = k;
      po.ratio = s->ratio;
      po.alpha = s->alpha;
      po.seed = o_.seed;
      if (k->eval_only()) {
        CT_THROW_IF_NOT(drift.size() == req.chunks.size(), "{}: no drift of the chunks", k->name());
        po.drift = &drift;
      }
      Outcome r = run_policy(
          m_, req, po, max_tokens, o_.attention, [&](const DecodeResult&) { return ref.forced; },
          kv, ws);
      json j = record(*s, k, r, ref);
      if (k->scored() && !drift.empty()) {
        RecallCount rc;
        int n_sel = 0;
        json per_chunk = json::array();
        CT_ASSERT(r.sel.selected.size() == drift.size(), "selection of {} chunks, drift of {}",
                  r.sel.selected.size(), drift.size());
        for (size_t b = 0; b < drift.size(); ++b) {
          rc += recall_at(r.sel.selected[b], drift[b], s->ratio);
          n_sel += (int)r.sel.selected[b].size();
          per_chunk.push_back((int)r.sel.selected[b].size());
        }
        j["selected_per_chunk"] = per_chunk;
        j["recall"] = rc.recall();
        j["recall_hits"] = rc.hits;
        j["recall_ref"] = rc.n_ref;
        j["n_selected"] = n_sel;
      } else {
        j["recall"] = nullptr;
      }
      out_->append(j);
      done_.insert(unit_key(ex.id, s->name, k->name()));
      finish_unit(ex.id, s->name, k);
    }
  }
}

EvalStats Runner::run() {
  CT_THROW_IF_NOT(!o_.out_dir.empty(), "no output directory given (--out DIR)");
  CT_THROW_IF_NOT(!o_.data_files.empty(), "no data files given (--data FILE.jsonl)");
  CT_THROW_IF_NOT(o_.ratio > 0 && o_.ratio <= 1, "ratio {} outside (0, 1]", o_.ratio);
  CT_THROW_IF_NOT(o_.alpha > 0 && o_.alpha <= 1, "alpha {} outside (0, 1]", o_.alpha);
  CT_THROW_IF_NOT(o_.kl_positions >= 1, "KL positions must be >= 1, got {}", o_.kl_positions);
  CT_THROW_IF_NOT(o_.max_tokens_qa >= 1 && o_.max_tokens_summary >= 1,
                  "max new tokens must be >= 1 (got {} for QA, {} for summaries)", o_.max_tokens_qa,
                  o_.max_tokens_summary);
  CT_THROW_IF_NOT(o_.limit >= 0, "limit must be >= 0, got {}", o_.limit);
  CT_THROW_IF_NOT(o_.extra_context_tokens >= 1, "extra context must be >= 1 token, got {}",
                  o_.extra_context_tokens);
  std::vector<std::vector<EvalExample>> files;
  for (const std::string& f : o_.data_files) files.push_back(read_examples(f));

  std::error_code ec;
  fs::create_directories(o_.out_dir, ec);
  CT_THROW_IF_NOT(!ec, "cannot create output directory '{}': {}", o_.out_dir, ec.message());
  fs::create_directories(o_.out_dir + "/refs", ec);
  CT_THROW_IF_NOT(!ec, "cannot create '{}/refs': {}", o_.out_dir, ec.message());
  update_run_json(m_, o_, o_.out_dir);
  stats_.results_path = o_.out_dir + "/" + kResultsFile;
  done_ = load_done_keys(stats_.results_path, o_.log);
  out_ = std::make_unique<ResultsWriter>(stats_.results_path);

  std::vector<std::vector<size_t>> chosen(files.size());
  int planned = 0, skipped = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const size_t n = o_.limit > 0 ? std::min<size_t>(o_.limit, files[f].size()) : files[f].size();
    for (size_t i = 0; i < n; ++i) {
      chosen[f].push_back(i);
      const int pend = (int)pending_units(files[f][i]).size();
      planned += pend;
    }
  }
  // Every unit this configuration asks for, finished or not, to report what was skipped.
  for (size_t f = 0; f < files.size(); ++f) {
    for (size_t i : chosen[f]) {
      const EvalExample& ex = files[f][i];
      for (const Setting& s : settings_) {
        if (s.name == layout_setting_name(s.layout, o_) &&
            done_.count(unit_key(ex.id, s.name, "full"))) {
          ++skipped;
        }
        for (const Policy* k : s.policies)
          skipped += done_.count(unit_key(ex.id, s.name, k->name()));
      }
    }
  }
  stats_.n_skipped = skipped;
  total_units_ = planned;
  if (skipped > 0)
    note(fmt::format("resuming: {} units already in {}, {} to run", skipped, stats_.results_path,
                     planned));
  run_t_.reset();
  unit_t_.reset();
  for (size_t f = 0; f < files.size(); ++f) {
    for (size_t i : chosen[f]) {
      const auto units = pending_units(files[f][i]);
      if (!units.empty()) run_example(files[f], i, units);
    }
  }
  out_.reset();
  summarize_eval(o_.out_dir);
  stats_.summary_path = o_.out_dir + "/" + kSummaryFile;
  stats_.seconds = run_t_.seconds();
  finish_run_json(o_.out_dir, stats_.seconds, stats_.n_run);
  return stats_;
}

}  // namespace

std::vector<std::string> eval_setting_names(const EvalOptions& o) {
  std::vector<std::string> out;
  for (const Setting& s : make_settings(o)) out.push_back(s.name);
  return out;
}

EvalStats run_eval(const Model& m, const EvalOptions& o) { return Runner(m, o).run(); }

}  // namespace ct
