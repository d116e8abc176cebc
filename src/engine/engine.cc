// Engine: the cache pool from tier specs (store/tier_registry.h), chunk lookup-or-encode, and request answering with
// recovery from unreadable chunks.
#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "backend/backend.h"
#include "backend/cpu_forward.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/timer.h"
#include "model/json_constraint.h"
#include "reuse/pooled_chunk.h"
#include "store/record_format.h"

namespace ct {

double default_step_attn_keys(const ModelConfig& c) {
  // Attention's two products (QK and PV) over one key against a row's weights, in multiply-adds,
  // and the two kernels' rates: `cachetune bench --step-block 512` on the Xeon of
  // docs/PERFORMANCE.md measured attention's products at about 0.4 of the weights' rate.
  constexpr double kAttnRate = 0.4;
  const double E = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff;
  const double weights = E * (Q + 2 * KV) + Q * E + 3 * E * F;
  return kAttnRate * weights / (2 * Q);
}

Engine::Engine(EngineOptions opt) : opt_(std::move(opt)), prefix_cache_(2) {
  if (opt_.model_path.empty()) opt_.model_path = default_model_path();
  if (opt_.calibration_path.empty()) opt_.calibration_path = default_calibration_path();
  CT_THROW_IF_NOT(opt_.r_min >= 0 && opt_.r_min <= 1, "engine r_min={}: expected [0, 1]",
                  opt_.r_min);
  CT_THROW_IF_NOT(kv_cache_type(opt_.kv_type),
                  "engine KV cache type '{}': expected f16, f32 or q8_0",
                  kv_dtype_name(opt_.kv_type));
  CT_THROW_IF_NOT(kv_record_type(opt_.encode.dtype),
                  "engine chunk record type '{}': expected f16, bf16 or f32",
                  kv_dtype_name(opt_.encode.dtype));
  if (opt_.tiers.empty()) {
    opt_.tiers = {parse_tier_spec("device:2G"), parse_tier_spec("host:8G"),
                  parse_tier_spec("disk:" + default_cache_dir())};
  }
  model_ = Model::load(opt_.model_path);
  model_->check_cache_type(opt_.kv_type);
  CT_THROW_IF_NOT(std::isfinite(opt_.step_attn_keys) &&
                      (opt_.step_attn_keys <= 0 || opt_.step_attn_keys >= 1),
                  "engine step_attn_keys = {}: expected a finite number, 0 (rows alone), at "
                  "least 1 (keys), or negative (the model's estimate)",
                  opt_.step_attn_keys);
  if (opt_.step_attn_keys < 0) opt_.step_attn_keys = default_step_attn_keys(model_->config());
  row_work_ = RowWork{opt_.step_attn_keys};
  std::vector<std::unique_ptr<store::Tier>> tiers;
  for (const TierSpec& t : opt_.tiers) tiers.push_back(store::make_tier(t));
  pool_ = std::make_unique<store::CachePool>(std::move(tiers));
  if (opt_.cuda) {
    // The GPU's caches are F32; the host caches it fills for prefix reuse hand their rows back
    // to it in their type, which the device reads for f32 and f16 only.
    CT_THROW_IF_NOT(opt_.kv_type != KvDtype::Q8_0,
                    "--device cuda with --cache-type q8_0: the GPU keeps F32 caches and reads "
                    "host rows of f32 or f16; use --cache-type f16 or f32");
    CT_THROW_IF_NOT(backend::backend_built("cuda"), "--device cuda: {}", backend::kNoCudaMessage);
    CT_THROW_IF_NOT(opt_.gpu_ctx >= 1, "engine gpu_ctx = {}; expected >= 1", opt_.gpu_ctx);
    CT_THROW_IF_NOT(opt_.gpu_seqs >= 1, "engine gpu_seqs = {}; expected >= 1", opt_.gpu_seqs);
    gpu_ = make_device("cuda", *model_, std::min(opt_.gpu_ctx, model_->config().n_ctx_train),
                       opt_.gpu_seqs);
    gpu_slots_->busy.assign(opt_.gpu_seqs, 0);
  }
}

Engine::~Engine() = default;

int Engine::gpu_ctx() const { return gpu_ ? gpu_->n_ctx() : 0; }

std::string Engine::backend_name() const { return gpu_ ? gpu_->name() : "cpu"; }

int Engine::find_tier(const std::string& name) const {
  for (size_t i = 0; i < opt_.tiers.size(); ++i) {
    if (opt_.tiers[i].kind == name) return (int)i;
  }
  return -1;
}

std::string Engine::tier_names() const {
  std::string have;
  for (const auto& t : opt_.tiers) have += (have.empty() ? "" : ", ") + t.kind;
  return have;
}

int Engine::tier_index(const std::string& name) const {
  const int i = find_tier(name);
  CT_THROW_IF_NOT(i >= 0, "tier '{}' is not configured (tiers: {})", name, tier_names());
  return i;
}

sched::CalibrationKey Engine::calibration_key(size_t tier, const std::string& backend) const {
  CT_THROW_IF_NOT(tier < opt_.tiers.size(), "tier index {}: the engine has {} tiers", tier,
                  opt_.tiers.size());
  // Read once per process: it parses /proc/cpuinfo, and auto mode asks on every request.
  static const std::string machine = sched::machine_identity();
  return {model_->fingerprint(), backend, calibration_tier_key(opt_.tiers[tier]), machine,
          kv_dtype_name(opt_.encode.dtype), kv_dtype_name(opt_.kv_type)};
}

RatioChoice Engine::auto_ratio(size_t tier, const std::string& backend) const {
  if (!calibrations_) {
    std::string error;
    calibrations_ = std::make_unique<sched::CalibrationStore>(
        sched::CalibrationStore::load_or_empty(opt_.calibration_path, &error));
    if (!error.empty()) {
      std::fprintf(stderr, "cachetune: warning: %s; using r_min\n", error.c_str());
    }
  }
  const sched::CalibrationKey key = calibration_key(tier, backend);
  RatioChoice c;
  c.tier_key = key.tier;
  if (const sched::CalibrationEntry* e = calibrations_->find(key)) {
    // A calibration made under a lower floor (before the model's r_min was measured, or with
    // another --rmin) is raised to this floor.
    c.r = std::max(e->chosen_r, opt_.r_min);
    c.calibrated = true;
    c.note = c.r > e->chosen_r
                 ? fmt::format("r={:.3f}: tier {} ({} backend) calibrated to {:.3f}, below r_min",
                               c.r, key.tier, key.backend, e->chosen_r)
                 : fmt::format("r={:.3f} calibrated for tier {} ({} backend)", c.r, key.tier,
                               key.backend);
  } else {
    c.r = opt_.r_min;
    c.note = fmt::format(
        "no calibration for tier {} ({} backend) of this model on this machine in {}; using "
        "r_min={:.2f} (run `cachetune calibrate --tier ...`)",
        key.tier, key.backend, opt_.calibration_path, c.r);
  }
  return c;
}

namespace {

// Why a stored record cannot stand for `tokens` encoded by `m` with `opt`, or "" when it can. The
// id is a content hash, but the record behind it comes from a disk directory or a Redis server
// that someone else may write: everything the prefill indexes with is checked against the request.
std::string stored_mismatch(const ChunkMeta& meta, const std::vector<int32_t>& tokens,
                            const Model& m, const EncodeOptions& opt) {
  std::string err;
  if (!store::check_meta(meta, &err)) return err;
  const ModelConfig& c = m.config();
  if (meta.model_fingerprint != m.fingerprint())
    return fmt::format("model fingerprint {}, expected {}", meta.model_fingerprint.substr(0, 16),
                       m.fingerprint().substr(0, 16));
  if (meta.n_layer != c.n_layer || meta.kv_dim != c.kv_dim())
    return fmt::format("n_layer={} kv_dim={}, expected the model's {} and {}", meta.n_layer,
                       meta.kv_dim, c.n_layer, c.kv_dim());
  if (meta.dtype != opt.dtype || meta.sink != opt.sink)
    return fmt::format("dtype {} sink {}, expected {} and {}", kv_dtype_name(meta.dtype), meta.sink,
                       kv_dtype_name(opt.dtype), opt.sink);
  if (meta.tokens != tokens) return "its tokens differ from the request's chunk";
  return "";
}

}  // namespace

bool Engine::find_stored(const std::string& id, const std::vector<int32_t>& tokens,
                         ChunkInfo& info, ChunkMeta* meta_out) {
  info.id = id;
  info.n_tok = (int)tokens.size();
  if (auto meta = pool_->lookup(info.id)) {
    const std::string why = stored_mismatch(*meta, tokens, *model_, opt_.encode);
    if (why.empty()) {
      info.hit = true;
      const int t = pool_->tier_of(info.id);
      info.tier = t >= 0 ? opt_.tiers[t].kind : "";
      if (meta_out) *meta_out = std::move(*meta);
      return true;
    }
    std::fprintf(stderr,
                 "cachetune: stored chunk %s is not usable (%s); dropping it and "
                 "re-encoding\n",
                 info.id.substr(0, 12).c_str(), why.c_str());
    pool_->evict(info.id);
    ++info.replaced;
  }
  return false;
}

void Engine::store_encoded(ChunkKV rec, int want, ChunkInfo& info, ChunkMeta* meta_out,
                           std::optional<ChunkKV>* unplaced) {
  info.rank_ms = rec.meta.rank_ms;
  std::string why;
  if (!pool_->put(rec, want, &why)) {
    const std::string msg = fmt::format("chunk {} ({} bytes of K/V) fits in no cache tier ({})",
                                        info.id.substr(0, 12), rec.meta.kv_bytes(), why);
    CT_THROW_IF_NOT(unplaced != nullptr, "{}", msg);
    // Serving goes on without the pool (e.g. its only tier is a Redis that is down, or a disk
    // that is full): this request uses the record from memory and the next one tries the tiers
    // again. The log line repeats at most once a minute; every response carries the note.
    store::store_log_limited("engine unplaced", msg + "; using it from memory for this request");
    info.tier = "request";
    info.note = msg + "; used from memory for this request only";
    if (meta_out) *meta_out = rec.meta;
    *unplaced = std::move(rec);
    return;
  }
  if (meta_out) *meta_out = std::move(rec.meta);
  const int t = pool_->tier_of(info.id);
  info.tier = t >= 0 ? opt_.tiers[t].kind : "";
}

ChunkInfo Engine::ensure_chunk(const std::vector<int32_t>& tokens, const std::string& tier,
                               ChunkMeta* meta_out, std::optional<ChunkKV>* unplaced) {
  ChunkInfo info;
  const int want = tier.empty() ? 0 : tier_index(tier);
  if (find_stored(chunk_id(model_->fingerprint(), tokens, opt_.encode), tokens, info, meta_out))
    return info;
  Timer t;
  ChunkKV rec = encode_chunk(*model_, tokens, opt_.encode);
  info.encode_ms = t.ms();
  store_encoded(std::move(rec), want, info, meta_out, unplaced);
  return info;
}

Answer Engine::answer(const std::vector<std::string>& docs, const std::string& question,
                      const SelectiveOptions& sel_in, const GenerateOptions& gen,
                      const AnswerOptions& opt) {
  const Timer ttft;  // the prompt's tokenisation counts towards TTFT
  return answer_from(
      build_rag_prompt(model_->tokenizer(), docs, question, opt.instruction, opt.history), sel_in,
      gen, opt, ttft);
}

Answer Engine::answer(const RagPromptTokens& prompt, const SelectiveOptions& sel,
                      const GenerateOptions& gen, const AnswerOptions& opt) {
  return answer_from(prompt, sel, gen, opt, Timer());
}

Answer Engine::answer_from(const RagPromptTokens& p, const SelectiveOptions& sel,
                           const GenerateOptions& gen, const AnswerOptions& opt,
                           const Timer& ttft) {
  std::unique_ptr<Generation> g = begin(p, sel, gen, opt, ttft);
  Generation* gp = g.get();
  while (!g->done()) advance(&gp, 1);
  if (g->error()) std::rethrow_exception(g->error());
  return g->take_answer();
}

size_t Generation::kv_bytes_for(const ModelConfig& c, KvDtype t, int n_prompt, int max_tokens) {
  return KVCache::bytes_for(c.n_layer, n_prompt + max_tokens + 1, c.kv_dim(), t);
}

std::unique_ptr<Generation> Engine::begin(const RagPromptTokens& p,
                                          const SelectiveOptions& sel_in,
                                          const GenerateOptions& gen, const AnswerOptions& opt,
                                          const Timer& ttft) {
  const int n_total = p.n_tokens();
  CT_THROW_IF_NOT(n_total + gen.max_tokens <= model_->config().n_ctx_train,
                  "prompt of {} tokens plus {} new tokens exceeds the model context of {}", n_total,
                  gen.max_tokens, model_->config().n_ctx_train);
  CT_THROW_IF_NOT(gen.logprobs >= -1 && gen.logprobs <= kMaxTopLogprobs,
                  "logprobs = {}; expected -1 (none) or 0 to {} alternatives per token",
                  gen.logprobs, kMaxTopLogprobs);
  auto g = std::make_unique<Generation>();
  g->ttft_ = ttft;
  g->gen_ = gen;
  g->opt_ = opt;
  g->prompt_ = p;
  g->sel_ = sel_in;
  if (g->sel_.policy.kind->uses_prefix_cache() && !g->sel_.prefix_cache)
    g->sel_.prefix_cache = &prefix_cache_;
  g->answer_.n_prompt = n_total;
  g->next_pos_ = n_total;
  g->sampler_ = std::make_unique<Sampler>(gen.sampling);
  if (gen.sampling.repetition_penalty != 1.0f) {
    CT_THROW_IF_NOT(gen.sampling.repetition_penalty > 0.0f,
                    "repetition_penalty = {}; expected a number > 0 (1: off)",
                    gen.sampling.repetition_penalty);
    std::vector<int32_t> all = p.prefix;  // the whole prompt, documents included
    for (const auto& c : p.chunks) all.insert(all.end(), c.begin(), c.end());
    all.insert(all.end(), p.query.begin(), p.query.end());
    g->sampler_->set_context(all);
  }
  if (gen.json_object || gen.json_schema) {
    CT_THROW_IF_NOT(gen.stop_at_eog,
                    "JSON output ends with the value: it cannot be combined with generating past "
                    "end-of-generation (ignore_eos)");
    g->sampler_->set_constraint(
        make_json_constraint(json_vocab(), gen.json_object, gen.json_schema));
  }
  if (!gen.stop.empty()) g->stops_ = std::make_unique<StopMatcher>(gen.stop);
  // A follower that scores its prompt computes it itself (the leader's rows have no scores); one
  // with no tokens to generate needs no prefill.
  if (opt.shared_prefill && (opt.leads_prefill || (gen.prompt_logprobs < 0 && gen.max_tokens > 0))) {
    g->share_ = opt.shared_prefill;
    g->leads_ = opt.leads_prefill;
  }
  g->opt_.shared_prefill.reset();  // share_ holds it, and lets it go when done with it
  if (gen.max_tokens <= 0 && gen.prompt_logprobs < 0) {
    // Nothing to generate or score (an echo of the prompt alone): no prefill.
  } else if (g->share_ && !g->leads_) {
    // A follower: nothing now; advance() copies its leader's rows once they are there.
  } else if (gen.prompt_logprobs >= 0) {
    CT_THROW_IF_NOT(gen.prompt_logprobs <= kMaxTopLogprobs,
                    "prompt_logprobs = {}; expected -1 (none) or 0 to {} alternatives per token",
                    gen.prompt_logprobs, kMaxTopLogprobs);
    CT_THROW_IF_NOT(p.chunks.empty(),
                    "prompt log-probabilities need every prompt row computed, but this prompt "
                    "has {} reused chunks",
                    p.chunks.size());
    g->kv_ = model_->make_cache(n_total + gen.max_tokens + 1, opt_.kv_type);
    g->answer_.ratio = 1.0;
    g->scored_ = 0;  // computed and scored in advance(), within the steps' budget
    if (opt_.prefill_chunk <= 0) {
      StepRows whole;
      score_rows(*g, 0, whole);
      while (g->scored_ > 0) score_rows(*g, 0, whole);  // more than 64 MiB of logits
    }
  } else if (stages_chunks(*g)) {
    g->staging_ = true;  // every lookup and encoding in advance(), within the steps' budget
  } else {
    start_prefill(*g);
  }
  g->decode_.reset();
  if (gen.max_tokens <= 0 && !g->prefilling() && !g->done()) finish(*g);  // nothing to decode
  return g;
}

void Engine::score_rows(Generation& g, double work, StepRows& step) {
  const RagPromptTokens& p = g.prompt_;
  std::vector<int32_t> toks = p.prefix;  // no chunks (begin)
  toks.insert(toks.end(), p.query.begin(), p.query.end());
  const int n = (int)toks.size();
  const int V = model_->config().n_vocab;
  const int first = g.scored_;
  int rows = n - first;
  if (work > 0) rows = std::max(1, row_work_.fit(first, rows, work));
  rows = std::min(rows, std::max(1, (int)((size_t(64) << 20) / (sizeof(float) * V))));
  Timer t;
  Workspace ws;
  const std::vector<float> logits =
      cpu::prefill(*model_, toks.data() + first, rows, first, g.kv_, ws, /*all_rows=*/true);
  for (int i = 0; i < rows && first + i + 1 < n; ++i) {
    g.answer_.prompt_logprobs.push_back(token_logprob(logits.data() + (size_t)i * V, V,
                                                      toks[first + i + 1], g.gen_.prompt_logprobs));
  }
  g.answer_.prefill.compute_ms += t.ms();
  g.answer_.prefill.n_active += rows;
  step.prefill += rows;
  step.work += row_work_.rows(first, rows);
  g.scored_ = first + rows;
  if (g.scored_ < n) return;
  g.scored_ = -1;
  g.logits_.assign(logits.end() - V, logits.end());
  g.next_pos_ = n;
  prefill_ended(g);
  if (g.gen_.max_tokens <= 0) finish(g);
}

std::shared_ptr<const VocabTrie> Engine::json_vocab() {
  std::call_once(json_vocab_once_,
                 [this] { json_vocab_ = std::make_shared<VocabTrie>(model_->tokenizer()); });
  return json_vocab_;
}

bool Engine::selection_step(Generation& g, StepRows& step) {
  const double budget = opt_.prefill_chunk;
  try {
    SlicedPrefill& sp = *g.sliced_;
    while (sp.select_rows_left() > 0) {
      const int rows = sp.select_rows_within(row_work_, budget);
      const double work = sp.select_work_of(row_work_, rows);
      if (step.work > 0 && step.work + work > budget) return false;
      sp.select_step(rows, decode_ws_);  // (its pass ends before this step's batch begins)
      step.work += work;
      step.select += rows;
    }
    return true;
  } catch (const ChunkReadError& e) {
    // As a first slice's failed read (mixed_step): its chunks staged again, this one re-encoded.
    g.sliced_.reset();
    drop_unreadable(e);
    try {
      count_read_failure(g, e.chunk_id());
      restage(g);
    } catch (...) {
      fail(g, std::current_exception());
    }
  } catch (...) {
    fail(g, std::current_exception());
  }
  return false;
}

Generation::~Generation() {
  if (share_ && leads_ && share_->state == SharedPrefill::State::kPending)
    share_->state = SharedPrefill::State::kFailed;
}

void Engine::prefill_ended(Generation& g) const {
  if (!g.share_ || !g.leads_) return;
  SharedPrefill& s = *g.share_;
  s.state = SharedPrefill::State::kFailed;  // unless the copy below is made
  if (!g.gpu_slot_ && g.kv_.n_pos > 0) {  // (on the GPU the rows are on the device)
    try {
      s.kv = model_->make_cache(g.kv_.n_pos, opt_.kv_type);
      s.kv.copy_rows(g.kv_, g.kv_.n_pos);
      s.kv.n_pos = g.kv_.n_pos;
      s.logits = g.logits_;
      s.ratio = g.answer_.ratio;
      s.ratio_note = g.answer_.ratio_note;
      s.state = SharedPrefill::State::kReady;
    } catch (...) {  // out of memory: the followers prefill on their own
      s.kv = KVCache();
      s.logits = std::vector<float>();
    }
  }
  g.share_.reset();
}

bool Engine::follow(Generation& g) {
  const SharedPrefill& s = *g.share_;
  if (s.state == SharedPrefill::State::kPending) return false;  // the leader's prefill runs
  if (s.state == SharedPrefill::State::kReady) {
    g.kv_ = model_->make_cache(g.answer_.n_prompt + g.gen_.max_tokens + 1, opt_.kv_type);
    g.kv_.copy_rows(s.kv, s.kv.n_pos);
    g.kv_.n_pos = s.kv.n_pos;
    g.next_pos_ = s.kv.n_pos;  // a token-stage list can be shorter than the prompt (lfonly)
    g.logits_ = s.logits;
    g.answer_.ratio = s.ratio;
    g.answer_.ratio_note = s.ratio_note;
    g.share_.reset();
    return true;
  }
  g.share_.reset();  // on its own, from the lookups
  if (stages_chunks(g)) {
    g.staging_ = true;
  } else {
    start_prefill(g);
  }
  return false;
}

// A chunk encoding run in slices by the requests that need it (whichever stages first steps it).
struct PendingChunk {
  PendingChunk(const Model& m, const std::vector<int32_t>& tokens, const EncodeOptions& opt,
               RowWork work, ChunkInfo found)
      : enc(m, tokens, opt, work), info(std::move(found)) {}
  ChunkEncoding enc;
  ChunkInfo info;     // find_stored's, then encode_ms added up over the steps
  bool done = false;  // stored (or handed to the request that finished it)
  bool broken = false;  // a step threw: the requests waiting for it start their own
};

std::shared_ptr<PendingChunk> Engine::running_encoding(const std::string& id) {
  auto it = encodings_.find(id);
  if (it == encodings_.end()) return nullptr;
  std::shared_ptr<PendingChunk> pc = it->second.lock();
  if (!pc) encodings_.erase(it);
  return pc;
}

std::shared_ptr<PendingChunk> Engine::find_or_start(const std::vector<int32_t>& tokens,
                                                    ChunkInfo& info, ChunkMeta* meta_out) {
  const std::string id = chunk_id(model_->fingerprint(), tokens, opt_.encode);
  if (std::shared_ptr<PendingChunk> pc = running_encoding(id)) return pc;
  if (find_stored(id, tokens, info, meta_out)) return nullptr;
  auto pc = std::make_shared<PendingChunk>(*model_, tokens, opt_.encode, row_work_, info);
  encodings_[id] = pc;
  return pc;
}

std::optional<ChunkKV> Engine::encoding_step(const std::shared_ptr<PendingChunk>& hold,
                                             double block) {
  PendingChunk& pc = *hold;
  Timer t;
  try {
    if (pc.enc.work_left() > 0) {
      pc.enc.step(block);  // (on a device each pass runs whole: ChunkEncoding::step)
      pc.info.encode_ms += t.ms();
      return std::nullopt;
    }
    ChunkKV rec = pc.enc.finish();
    pc.done = true;
    encodings_.erase(pc.info.id);
    pc.info.encode_ms += t.ms();
    return rec;
  } catch (...) {
    pc.broken = true;
    if (auto it = encodings_.find(pc.info.id); it != encodings_.end() &&
                                                 it->second.lock() == hold)
      encodings_.erase(it);
    throw;
  }
}

void Engine::stage_chunks(Generation& g, StepRows& step) {
  const RagPromptTokens& p = g.prompt_;
  Answer& ans = g.answer_;
  const double budget = opt_.prefill_chunk;
  while (g.staged_ < p.chunks.size() && step.work < budget) {
    const Timer t;
    const std::vector<int32_t>& toks = p.chunks[g.staged_];
    if (!g.pending_) {
      ChunkInfo info;
      ChunkMeta meta;
      g.pending_ = find_or_start(toks, info, &meta);
      if (!g.pending_) {  // stored
        add_chunk(g, std::move(info), std::move(meta), std::nullopt);
        ++g.staged_;
        ans.lookup_ms += t.ms();
        continue;
      }
    }
    const std::shared_ptr<PendingChunk> hold = g.pending_;  // alive through the calls below
    PendingChunk& pc = *hold;
    if (pc.done || pc.broken) {  // finished, or failed, in another request's step: look again
      g.pending_.reset();
      ans.lookup_ms += t.ms();
      continue;
    }
    // Blocks of prefill_chunk rows of work (the last one shorter), so that the encoding's
    // slices are its own whoever steps it and whatever shares the step: a block joins a step
    // that has other work only when it fits.
    const double left = pc.enc.work_left();
    if (left > 0 && step.work > 0 && step.work + pc.enc.block_work(budget) > budget) {
      ans.lookup_ms += t.ms();
      break;
    }
    // (A step that throws fails g, which drops its pending_: Engine::fail.)
    const int rows_before = pc.enc.rows_done();
    std::optional<ChunkKV> rec = encoding_step(hold, budget);
    step.work += left - pc.enc.work_left();
    step.encode += pc.enc.rows_done() - rows_before;
    if (rec) {
      ChunkInfo info = pc.info;
      ChunkMeta meta;
      std::optional<ChunkKV> unplaced;
      g.pending_.reset();
      store_encoded(std::move(*rec), 0, info, &meta, &unplaced);
      add_chunk(g, std::move(info), std::move(meta), std::move(unplaced));
      ++g.staged_;
    }
    ans.lookup_ms += t.ms();
  }
  if (g.staged_ == p.chunks.size()) {
    g.staging_ = false;
    start_prefill(g);
  }
}

bool Engine::ingest_step(ChunkIngest& in) {
  const int want = in.tier.empty() ? 0 : tier_index(in.tier);
  for (;;) {
    if (!in.pending) {
      in.pending = find_or_start(in.tokens, in.info, nullptr);
      if (!in.pending) return true;  // stored
    }
    const std::shared_ptr<PendingChunk> hold = in.pending;
    if (hold->done || hold->broken) {  // finished, or failed, by a request: look again
      in.pending.reset();
      in.info = ChunkInfo();
      continue;
    }
    std::optional<ChunkKV> rec =
        encoding_step(hold, opt_.prefill_chunk > 0 ? opt_.prefill_chunk : hold->enc.work_left());
    if (!rec) return false;
    in.info = hold->info;
    in.pending.reset();
    store_encoded(std::move(*rec), want, in.info, nullptr, nullptr);
    return true;
  }
}

void Engine::add_chunk(Generation& g, ChunkInfo info, ChunkMeta meta,
                       std::optional<ChunkKV> unplaced) {
  g.answer_.chunks.push_back(std::move(info));
  if (unplaced)
    g.srcs_.push_back(std::make_unique<OwnedChunk>(std::move(*unplaced)));
  else
    g.srcs_.push_back(std::make_unique<PooledChunk>(*pool_, std::move(meta)));
}

void Engine::look_up_chunk(Generation& g, size_t i) {
  ChunkMeta meta;
  std::optional<ChunkKV> unplaced;
  ChunkInfo info = ensure_chunk(g.prompt_.chunks[i], "", &meta, &unplaced);
  add_chunk(g, std::move(info), std::move(meta), std::move(unplaced));
}

bool Engine::stages_chunks(const Generation& g) const {
  return opt_.prefill_chunk > 0 && g.gen_.max_tokens > 0;
}

void Engine::restage(Generation& g) {
  g.sliced_.reset();
  g.answer_.chunks.clear();
  g.srcs_.clear();
  g.staged_ = 0;
  g.pending_.reset();
  g.staging_ = true;
}

void Engine::start_prefill(Generation& g) {
  const RagPromptTokens& p = g.prompt_;
  const GenerateOptions& gen = g.gen_;
  const int n_total = p.n_tokens();
  Answer& ans = g.answer_;
  g.sliced_.reset();
  // Staged: the chunks were looked up (and encoded) step by step; answer_.chunks and srcs_ are
  // set. Else they are looked up here, and again after a chunk could not be read.
  const bool staged = stages_chunks(g);
  for (;;) {
    if (!staged) {
      Timer lookup;
      ans.chunks.clear();
      g.srcs_.clear();
      for (size_t i = 0; i < p.chunks.size(); ++i) look_up_chunk(g, i);
      ans.lookup_ms += lookup.ms();
    }
    ComposedRequest req{p.prefix, {}, p.query};
    for (const auto& src : g.srcs_) req.chunks.push_back(src.get());
    SelectiveOptions sel = g.sel_;
    // The GPU runs every policy, a request in a sequence slot of its own; prompts longer than
    // its sequences, and requests finding every slot taken, stay on the CPU.
    if (gpu_ && n_total + gen.max_tokens <= gpu_ctx() && !g.gpu_slot_) {
      g.gpu_slot_ = acquire_gpu_slot();
    }
    const bool on_gpu = g.gpu_slot_ != nullptr;
    if (on_gpu) gpu_->select(*g.gpu_slot_);
    if (g.opt_.auto_ratio.value_or(opt_.auto_ratio)) {
      // The tiers the chunks were in when looked up (staged: possibly some steps ago; the
      // prefill reads them from there, pinned).
      int slowest = 0;
      for (const ChunkInfo& c : ans.chunks) slowest = std::max(slowest, find_tier(c.tier));
      // The calibration of the backend that runs this prefill: a CPU calibration says nothing
      // about the GPU's recompute/load balance.
      const RatioChoice choice = auto_ratio((size_t)slowest, on_gpu ? "cuda" : "cpu");
      sel.policy.ratio = choice.r;
      ans.ratio_note = choice.note;
    }
    ans.ratio = sel.policy.ratio;
    sel.device = on_gpu ? gpu_.get() : nullptr;
    sel.device_kv_to_host = false;  // decoding continues on the GPU, from its own cache
    ans.device = on_gpu ? "cuda" : "cpu";
    // On the GPU the cache lives on the device; the host one is only needed on the CPU, and for
    // a policy that works on it (uses_host_cache: prefix caching's rows, remembered after).
    KVCache& kv = g.kv_;
    kv = on_gpu && !sel.policy.kind->uses_host_cache()
             ? KVCache()
             : model_->make_cache(n_total + gen.max_tokens + 1, opt_.kv_type);
    const bool sliced =
        opt_.prefill_chunk > 0 && gen.max_tokens > 0 && SlicedPrefill::supports(sel);
    Workspace ws;
    try {
      if (sliced) {
        // The selection now (CacheBlend's and ProphetKV's after a selection pass, stepped in
        // advance()); the rows step by step in advance() (at least the query's).
        g.sliced_ = std::make_unique<SlicedPrefill>(*model_, req, sel, kv);
      } else {
        g.logits_ = selective_prefill(*model_, req, sel, kv, ws, &ans.prefill);
        g.next_pos_ = kv.n_pos;  // a token-stage list can be shorter than the prompt (lfonly)
        prefill_ended(g);
        if (on_gpu) kv = KVCache();  // decoding goes on from the device's cache
        g.srcs_.clear();  // releases the chunks' pins (PooledChunk) once their rows are read
      }
    } catch (const ChunkReadError& e) {
      g.sliced_.reset();
      drop_unreadable(e);
      count_read_failure(g, e.chunk_id());
      if (staged) {  // looked up and re-encoded again in the next steps, within their budget
        restage(g);
        return;
      }
      continue;  // re-encoded on the next attempt
    }
    return;
  }
}

void Engine::finish(Generation& g) const {
  g.done_ = true;
  if (g.share_ && g.leads_) g.share_->state = SharedPrefill::State::kFailed;  // ended before it
  g.share_.reset();
  Answer& a = g.answer_;
  if (g.stops_ && !a.stopped_at_sequence && !g.error_) {
    // A partial match that never completed is answer text after all.
    const std::string rest = g.stops_->flush();
    if (g.opt_.on_piece && !rest.empty()) {
      try {
        g.opt_.on_piece(rest);
      } catch (...) {
        g.error_ = std::current_exception();
      }
    }
  }
  if (g.first_) a.ttft_ms = g.ttft_.ms();  // no token came out
  a.decode_ms = g.first_ ? 0 : g.decode_.ms();
  // Cut at a stop sequence the text is what the pieces spelled up to it; otherwise the
  // tokenizer's decoding of the tokens.
  a.text = a.stopped_at_sequence ? g.stops_->emitted() : model_->tokenizer().decode(a.tokens);
  g.kv_ = KVCache();  // the memory goes back now, not when the caller drops the generation
  g.pending_.reset();  // a chunk encoding it was running goes on only for others waiting
  g.logits_ = std::vector<float>();
  g.gpu_slot_.reset();  // and so does its GPU sequence slot
}

StepRows Engine::advance(Generation* const* gens, int n) {
  const Tokenizer& tok = model_->tokenizer();
  const int V = model_->config().n_vocab;
  std::vector<Generation*> feed, pre, gfeed;  // gfeed: the GPU sequences' decode rows
  std::vector<int32_t> ids, gids;
  std::vector<int> slices;  // rows of each of pre's slices in this step
  StepRows rows;
  // Encodings no request holds any more (theirs finished or left) are forgotten.
  std::erase_if(encodings_, [](const auto& e) { return e.second.expired(); });
  for (int i = 0; i < n; ++i) {
    Generation& g = *gens[i];
    if (g.done_) continue;
    if (g.staging_) {
      // Its missing chunks are encoded while the step's budget lasts (the oldest request
      // first); its prefill starts once every chunk is there, and may join this step.
      if (stop_if_cancelled(g)) continue;
      try {
        if (rows.work < opt_.prefill_chunk) {
          stage_chunks(g, rows);
        } else if (!g.pending_ && g.staged_ < g.prompt_.chunks.size()) {
          // No budget left: it holds the running encoding of its next chunk, if another request
          // runs one, so that the encoding goes on should that request leave.
          g.pending_ = running_encoding(
              chunk_id(model_->fingerprint(), g.prompt_.chunks[g.staged_], opt_.encode));
        }
      } catch (...) {
        fail(g, std::current_exception());
        continue;
      }
      if (g.staging_) continue;
    }
    if (g.share_ && !g.leads_) {
      // A follower: no rows until its leader's prefill has ended.
      if (stop_if_cancelled(g)) continue;
      bool ready = false;
      try {
        ready = follow(g);
      } catch (...) {
        fail(g, std::current_exception());
        continue;
      }
      if (!ready) continue;
    }
    if (g.scored_ >= 0) {
      // A scored prompt's next rows, while the step's budget lasts (their own pass, as an
      // encoding's).
      if (stop_if_cancelled(g)) continue;
      if (rows.work == 0 || rows.work < opt_.prefill_chunk) {
        try {
          score_rows(g, opt_.prefill_chunk - rows.work, rows);
        } catch (...) {
          fail(g, std::current_exception());
        }
      }
      continue;
    }
    if (g.sliced_) {
      if (stop_if_cancelled(g)) continue;
      if (g.sliced_->select_rows_left() > 0 && !selection_step(g, rows)) continue;
      // Its next slice joins this step while the step's prefill work stays within the budget
      // (the oldest first; a slice's size depends only on its own request).
      const int want = g.sliced_->rows_within(row_work_, opt_.prefill_chunk);
      const double want_work = g.sliced_->work_of(row_work_, want);
      if (rows.work == 0 || rows.work + want_work <= opt_.prefill_chunk) {
        pre.push_back(&g);
        slices.push_back(want);
        rows.prefill += want;
        rows.work += want_work;
      }
      continue;
    }
    int32_t id = -1;
    try {
      id = g.sampler_->sample(g.logits_.data(), V);  // (a constraint may find no token)
    } catch (...) {
      fail(g, std::current_exception());
      continue;
    }
    if (g.first_) {
      g.first_ = false;
      g.answer_.ttft_ms = g.ttft_.ms();
      g.decode_.reset();
    }
    if (g.gen_.stop_at_eog && tok.is_eog(id)) {
      finish(g);
      continue;
    }
    g.answer_.tokens.push_back(id);
    if (g.gen_.logprobs >= 0) {
      g.answer_.logprobs.push_back(token_logprob(g.logits_.data(), V, id, g.gen_.logprobs));
    }
    // With stop sequences, on_piece gets only text decided not to be part of one.
    std::string piece = tok.token_to_piece(id);
    bool stopped = false;
    if (g.stops_) {
      StopMatcher::Step st = g.stops_->feed(piece);
      piece = std::move(st.text);
      stopped = st.stopped;
    }
    if (g.opt_.on_piece || g.opt_.on_logprob) {
      try {
        if (g.opt_.on_logprob && g.gen_.logprobs >= 0) g.opt_.on_logprob(g.answer_.logprobs.back());
        if (g.opt_.on_piece) g.opt_.on_piece(piece);
      } catch (...) {
        g.error_ = std::current_exception();
        finish(g);
        continue;
      }
    }
    if (stopped) {
      g.answer_.stopped_at_sequence = true;
      finish(g);
      continue;
    }
    if ((int)g.answer_.tokens.size() >= g.gen_.max_tokens) {
      finish(g);
      continue;
    }
    if (g.gpu_slot_) {  // one batched step over every GPU sequence, below
      gfeed.push_back(&g);
      gids.push_back(id);
      continue;
    }
    CT_THROW_IF_NOT(g.kv_.n_pos < g.kv_.n_ctx(), "KV cache full at {} positions while decoding",
                    g.kv_.n_ctx());
    feed.push_back(&g);
    ids.push_back(id);
  }
  rows.decode = (int)(feed.size() + gfeed.size());
  if (!gfeed.empty()) gpu_decode_step(gfeed, gids);
  if (!pre.empty()) {
    // The slices' rows as they ran (a slice whose chunk could not be read leaves), beside the
    // scored prompts' rows already counted.
    int planned = 0;
    for (int s : slices) planned += s;
    rows.prefill += mixed_step(feed, ids, pre, slices) - planned;
  } else if (!feed.empty()) {
    decode_step(feed, ids);
  }
  return rows;
}

void Engine::gpu_decode_step(const std::vector<Generation*>& feed,
                             const std::vector<int32_t>& ids) {
  const int V = model_->config().n_vocab;
  std::vector<int32_t> pos, slots;
  for (Generation* g : feed) {
    pos.push_back(g->next_pos_);
    slots.push_back(*g->gpu_slot_);
  }
  const std::vector<float> logits =
      gpu_->decode_batch(ids.data(), pos.data(), slots.data(), (int)feed.size());
  for (size_t i = 0; i < feed.size(); ++i) {
    feed[i]->logits_.assign(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    ++feed[i]->next_pos_;
  }
}

std::shared_ptr<const int> Engine::acquire_gpu_slot() {
  std::lock_guard<std::mutex> lk(gpu_slots_->mu);
  std::vector<char>& busy = gpu_slots_->busy;
  for (size_t i = 0; i < busy.size(); ++i) {
    if (busy[i]) continue;
    busy[i] = 1;
    // Released when the last holder drops it (Generation, finish), also after the engine.
    std::shared_ptr<GpuSlots> pool = gpu_slots_;
    return std::shared_ptr<const int>(new int((int)i), [pool](const int* s) {
      std::lock_guard<std::mutex> lk2(pool->mu);
      pool->busy[*s] = 0;
      delete s;
    });
  }
  return nullptr;
}

void Engine::decode_step(const std::vector<Generation*>& feed, const std::vector<int32_t>& ids) {
  const int V = model_->config().n_vocab;
  std::vector<KVCache*> kvs;
  for (Generation* g : feed) kvs.push_back(&g->kv_);
  cpu::decode_batch(*model_, ids.data(), kvs.data(), (int)feed.size(), decode_ws_, decode_logits_);
  for (size_t i = 0; i < feed.size(); ++i) {
    feed[i]->logits_.assign(decode_logits_.begin() + i * V, decode_logits_.begin() + (i + 1) * V);
    ++feed[i]->next_pos_;
  }
}

void Engine::drop_unreadable(const ChunkReadError& e) {
  std::fprintf(stderr, "cachetune: %s; re-encoding\n", e.what());
  pool_->evict(e.chunk_id());
}

void Engine::count_read_failure(Generation& g, const std::string& chunk_id) {
  // The bound is per chunk: when a tier holding several of the request's chunks goes away
  // (Redis killed), each of them fails once, one per attempt.
  CT_THROW_IF_NOT(++g.read_failures_[chunk_id] <= 2, "chunk {} could not be read after re-encoding",
                  chunk_id);
  ++g.answer_.retries;
}

bool Engine::stop_if_cancelled(Generation& g) const {
  std::exception_ptr stop;
  try {
    if (g.opt_.cancelled && g.opt_.cancelled())
      stop = std::make_exception_ptr(RequestCancelled("during"));
  } catch (...) {
    stop = std::current_exception();  // the callback's failure ends this request only
  }
  if (stop) fail(g, stop);
  return stop != nullptr;
}

void Engine::fail(Generation& g, std::exception_ptr error) const {
  g.error_ = std::move(error);
  g.staging_ = false;
  g.scored_ = -1;
  g.sliced_.reset();
  g.srcs_.clear();
  finish(g);
}

int Engine::mixed_step(const std::vector<Generation*>& feed, const std::vector<int32_t>& ids,
                       std::vector<Generation*>& pre, std::vector<int>& slice) {
  const int V = model_->config().n_vocab;
  const int nd = (int)feed.size();
  std::vector<float> logits;
  LayerTimes times;
  while (!pre.empty()) {
    std::vector<int32_t> tokens(ids), pos;
    std::vector<BatchSeq> seqs;
    for (Generation* g : feed) {
      pos.push_back(g->kv_.n_pos);
      seqs.push_back(BatchSeq{&g->kv_, 1, true});
    }
    std::vector<const ReusedRows*> reused;
    for (size_t i = 0; i < pre.size(); ++i) {
      // A restarted prefill may have fewer rows than the step counted, never more.
      slice[i] = std::min(slice[i], pre[i]->sliced_->rows_left());
      reused.push_back(pre[i]->sliced_->add_slice(slice[i], tokens, pos, seqs));
    }
    try {
      const auto be = make_cpu_layers(*model_, *seqs[0].kv, decode_ws_, pre[0]->sel_.pipeline);
      be->begin_batch(tokens.data(), pos.data(), (int)tokens.size(), seqs);
      // A first slice places its request's reused rows, every layer's (from the first its
      // policy reuses) before that layer runs.
      for (size_t i = 0; i < pre.size(); ++i) {
        if (reused[i])
          be->set_reused_for(nd + (int)i, *reused[i], pre[i]->sliced_->reused_from_layer());
      }
      for (int l = 0; l < model_->config().n_layer; ++l) be->layer(l, nullptr);
      logits = be->finish_batch();
      times = be->times();
      break;
    } catch (const ChunkReadError& e) {
      // Only a first slice reads chunks: the requests that read this one leave the step and
      // stage their chunks again (re-encoding this one in a later step, within its budget), and
      // the step runs again without them; the decode rows it had written are written again at
      // the same positions. A request past its second failed read of a chunk ends with that
      // error; the others go on.
      drop_unreadable(e);
      bool restarted = false;
      std::vector<Generation*> still;
      std::vector<int> still_slice;
      for (size_t i = 0; i < pre.size(); ++i) {
        Generation& g = *pre[i];
        bool reads = false;
        for (const ChunkInfo& c : g.answer_.chunks) reads |= reused[i] && c.id == e.chunk_id();
        if (reads) {
          restarted = true;
          try {
            count_read_failure(g, e.chunk_id());
            restage(g);
          } catch (...) {
            fail(g, std::current_exception());
          }
          continue;
        }
        still.push_back(&g);
        still_slice.push_back(slice[i]);
      }
      if (!restarted) throw;
      pre.swap(still);
      slice.swap(still_slice);
    }
  }
  if (pre.empty()) {  // every prefill of the step failed: the decode rows alone
    if (nd > 0) decode_step(feed, ids);
    return 0;
  }
  for (int i = 0; i < nd; ++i) {
    feed[i]->logits_.assign(logits.begin() + (size_t)i * V, logits.begin() + (size_t)(i + 1) * V);
    ++feed[i]->kv_.n_pos;
    ++feed[i]->next_pos_;
  }
  int prefill_rows = 0;
  for (size_t i = 0; i < pre.size(); ++i) {
    Generation& g = *pre[i];
    prefill_rows += slice[i];
    g.sliced_->slice_done(slice[i], logits.data() + (size_t)(nd + i) * V, times);
    if (!g.sliced_->done()) continue;
    g.answer_.prefill = g.sliced_->breakdown();
    g.logits_ = g.sliced_->take_logits();
    g.next_pos_ = g.kv_.n_pos;  // as after a whole prefill (a token-stage list may be shorter)
    prefill_ended(g);
    g.sliced_.reset();
    g.srcs_.clear();  // releases the chunks' pins
  }
  return prefill_rows;
}

}  // namespace ct
