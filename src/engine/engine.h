// The engine facade used by the CLI, the evaluation tools and the server: a loaded model, a
// cache pool of tiers, and request handling that finds (or encodes) each chunk, runs the
// selective prefill with the chosen policy, and decodes the answer. A chunk that turns out to be
// missing or corrupt in its tier is re-encoded and the request retried, so it still answers.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu_forward.h"
#include "core/paths.h"
#include "core/timer.h"
#include "engine/generate.h"
#include "model/sampler.h"
#include "model/stop_matcher.h"
#include "reuse/encoder.h"
#include "reuse/prompt.h"
#include "reuse/selective.h"
#include "sched/calibration_store.h"
#include "store/pool.h"
#include "store/tier_registry.h"

namespace ct {

class VocabTrie;  // model/json_constraint.h

// Tier specs are parsed, checked and built by store/tier_registry.h; the engine only holds them.
using store::calibration_tier_key;
using store::parse_bytes;
using store::parse_tier_spec;
using store::TierSpec;

struct EngineOptions {
  std::string model_path;       // default: default_model_path()
  std::vector<TierSpec> tiers;  // default: device 2 GiB, host 8 GiB, disk in default_cache_dir()
  EncodeOptions encode;
  // Recompute ratio chosen per request from the persisted calibration of the tier holding the
  // request's chunks (`--ratio auto`) instead of SelectiveOptions::policy.ratio. Without a
  // calibration for that tier the request runs at r_min and Answer::ratio_note says so.
  bool auto_ratio = false;
  double r_min = 0.15;           // quality floor (paper App. E.4); also the fallback ratio
  std::string calibration_path;  // default: default_calibration_path()
  // Compute prefill and decoding on the GPU (CT_CUDA builds): the weights are uploaded once and
  // gpu_seqs sequences of gpu_ctx positions each (at most the model's context) are kept. Every
  // policy runs there; a prompt longer than a GPU sequence, or a request finding every sequence
  // slot taken, runs on the CPU (Answer::device says which).
  bool cuda = false;
  int gpu_ctx = 8192;
  // GPU sequence slots (gpu_ctx positions each): requests that prefill and decode on the GPU at
  // once, their decode rows one batched step (cuda::Decoder::decode_batch). The scheduler
  // admits at most this many running requests on a CUDA engine.
  int gpu_seqs = 1;
  // Chunked prefill: at most this much prefill work per engine step (advance; rows counted as
  // step_attn_keys says, below), so that a long prompt is prefilled over several steps, each
  // shared with the decode rows of running requests.
  // 0: each prefill runs whole in begin(). A prefill on the GPU always runs whole
  // (SlicedPrefill::supports). The same budget spreads a request's chunk lookups and encodings
  // over steps: a step runs slices of the missing chunks' encodings (ChunkEncoding: the
  // isolated pass, then the probe ranking's pass) until prefill_chunk rows of work are done, and
  // its prefill slices take what is left (Engine::advance). The
  // selection (CacheBlend's layer-0 pass over every row, ProphetKV's reuse pass) runs whole in
  // the step where a request's last chunk is there.
  int prefill_chunk = 0;
  // How the step budget (prefill_chunk) counts a row (RowWork, backend/row_work.h): a row at
  // position p is 1 + (p + 1) / step_attn_keys rows of work, its attention over the keys before
  // it counted beside its weights, so that a step late in a long prompt or document takes
  // fewer rows and the steps stay even. 0 counts rows alone; else at least 1. Negative (the
  // default): the model's estimate, default_step_attn_keys; `cachetune bench --step-block`
  // measures it. Like prefill_chunk it sets where an encoding's blocks end, and so the rounding
  // of the records it stores, which chunk ids do not include.
  double step_attn_keys = -1;
  // Element type of the live host KV caches (`--cache-type`: requests on the CPU, and a GPU
  // request's host copy for prefix caching): F16 (llama.cpp's default cache type) halves the
  // bytes a request holds against --kv-budget and that each decode step's attention reads; F32
  // keeps every computed key and value unrounded. The GPU's own caches are F32. Chunk records
  // have their own type (EncodeOptions::dtype).
  KvDtype kv_type = KvDtype::F16;
};


// The recompute ratio auto mode picked for one tier, and why.
struct RatioChoice {
  double r = 0;
  bool calibrated = false;  // false: no stored calibration for this key, r is r_min
  std::string tier_key;     // calibration_tier_key() of the tier
  std::string note;         // one line for logs, e.g. "calibrated for host" or the fallback
};

struct PendingChunk;  // engine.cc: a chunk encoding in progress

struct ChunkInfo {
  std::string id;
  int n_tok = 0;
  bool hit = false;      // found in the pool (no encoding needed)
  std::string tier;      // tier holding it after the call
  double encode_ms = 0;  // isolated prefill + ranking, when encoded
  double rank_ms = 0;
  int replaced = 0;  // stored records dropped because they did not match the request
  std::string note;  // why the chunk is not in the pool ("" when it is)
};

struct Answer {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<ChunkInfo> chunks;
  PrefillBreakdown prefill;
  double lookup_ms = 0;  // chunk lookups (and encodings of missing chunks)
  double ttft_ms = 0;    // lookup + prefill + first token
  double decode_ms = 0;
  int n_prompt = 0;
  int retries = 0;             // re-encodings after a failed chunk read
  bool stopped_at_sequence = false;  // a GenerateOptions::stop sequence ended generation
  double ratio = 0;            // recompute ratio the prefill ran with (auto mode: the chosen one)
  std::string ratio_note;      // auto mode: RatioChoice::note; empty otherwise
  std::string device = "cpu";  // where prefill and decoding ran: "cpu" or "cuda"
  // GenerateOptions::logprobs >= 0: one entry per token of `tokens`, in order.
  std::vector<TokenLogprob> logprobs;
  // GenerateOptions::prompt_logprobs >= 0: one entry per prompt token but the first (which has
  // nothing before it), in order: entry i is token i + 1's.
  std::vector<TokenLogprob> prompt_logprobs;
};

// A request whose AnswerOptions::cancelled said so before (Scheduler::answer) or during
// (Engine::advance, between slices) its prefill.
class RequestCancelled : public std::runtime_error {
 public:
  explicit RequestCancelled(const char* when = "before")
      : std::runtime_error(std::string("request cancelled ") + when + " its prefill") {}
};

// What one engine step (Engine::advance) computed.
struct StepRows {
  int decode = 0;   // decode rows (one per generating request)
  int prefill = 0;  // prefill rows (slices of chunked prefills)
  int encode = 0;   // rows of chunk encodings' passes (ChunkEncoding::rows_done)
  int select = 0;   // rows of selection passes (SlicedPrefill::select_step: CacheBlend, ProphetKV)
  double work = 0;  // the budgeted work of the prefill and encoding rows (RowWork)
};

// The keys of attention that cost as much as a row's weights (EngineOptions::step_attn_keys),
// estimated from the model's shapes: its weights' multiply-adds per row over its attention's
// per key, times the ratio of the two kernels' rates measured on the Xeon of
// docs/PERFORMANCE.md ("A step budget in work"; attention's products reach about 0.4 of the
// weights' rate there).
double default_step_attn_keys(const ModelConfig& c);

// The prompt's prefill shared by the generations of one prompt (a request's n choices,
// Scheduler::answer_all): the leader (AnswerOptions::leads_prefill) prefills as any request and,
// when its prefill ends on the CPU, leaves here a copy of its cache's prompt rows and the next
// token's logits; the others (followers) wait without rows meanwhile, then copy them and decode
// from there, as they would after a prefill of their own (the same computation, so the same
// bits). When the leader cannot leave them (its prefill ran on the GPU, or it ended first:
// failed, cancelled, refused), the followers prefill on their own. All of it runs on the thread
// that steps the engine. The copy lives while a follower may still need it.
struct SharedPrefill {
  enum class State { kPending, kReady, kFailed };
  State state = State::kPending;
  KVCache kv;                 // kReady: the prompt's rows [0, kv.n_pos) as the leader's cache held them
  std::vector<float> logits;  // kReady: the next token's
  double ratio = 0;           // the leader's Answer::ratio and ratio_note
  std::string ratio_note;
};

struct AnswerOptions {
  std::string instruction = kQaInstruction;          // empty: plain chat (see build_rag_prompt)
  std::vector<ChatMessage> history;                  // system and earlier turns before the question
  std::optional<bool> auto_ratio;                    // unset: EngineOptions::auto_ratio
  std::function<void(const std::string&)> on_piece;  // each generated piece, as produced
  // With GenerateOptions::logprobs >= 0: each token's entry as it is recorded, just before that
  // token's on_piece (whose text a stop matcher may still hold back).
  std::function<void(const TokenLogprob&)> on_logprob;
  // Set: this generation shares its prompt's prefill with others (SharedPrefill), as its leader
  // or (leads_prefill false) as a follower.
  std::shared_ptr<SharedPrefill> shared_prefill;
  bool leads_prefill = false;
  // Polled by the batching scheduler before the request's prefill: true when its client has gone,
  // so a request that waited in the queue is dropped without being prefilled (RequestCancelled).
  std::function<bool()> cancelled;
};

// One request between its admission and its last token. Engine::begin makes it (chunk lookups
// and the prefill, or with chunked prefill nothing yet); Engine::advance moves any number of them forward by one token each, in one
// batched forward pass, so requests decode together (continuous batching, engine/scheduler.h).
class Generation {
 public:
  Generation() = default;
  // A leader destroyed before its prefill ended (its step failed) leaves its followers to
  // prefill on their own (SharedPrefill).
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;
  bool done() const { return done_; }
  // Still encoding its chunks or prefilling in slices (EngineOptions::prefill_chunk): no token
  // yet.
  bool prefilling() const {
    return staging_ || sliced_ != nullptr || scored_ >= 0 || (share_ && !leads_);
  }
  // Complete once done(); answer().tokens grows while decoding.
  const Answer& answer() const { return answer_; }
  Answer take_answer() { return std::move(answer_); }
  // What on_piece threw (e.g. its client went away): the generation stopped at that token.
  std::exception_ptr error() const { return error_; }
  // Host bytes of this request's K/V cache (0 when it lives on the GPU, or once done).
  size_t kv_bytes() const { return kv_.bytes(); }
  // Host bytes of the K/V cache (elements of t) a request of n_prompt tokens and max_tokens new
  // tokens holds.
  static size_t kv_bytes_for(const ModelConfig& c, KvDtype t, int n_prompt, int max_tokens);

 private:
  friend class Engine;
  Answer answer_;
  RagPromptTokens prompt_;
  SelectiveOptions sel_;                            // as asked (auto ratio and device per attempt)
  // The chunks the prefill reads, pinned in their tiers from the lookup until the prefill is
  // done (PooledChunk), then released.
  std::vector<std::unique_ptr<ChunkSource>> srcs_;
  std::unique_ptr<SlicedPrefill> sliced_;           // while prefilling in slices
  // With EngineOptions::prefill_chunk the chunks are looked up (and missing ones encoded) step
  // by step before the prefill starts: staged_ of them are done, their ChunkInfo in
  // answer_.chunks and their sources in srcs_.
  bool staging_ = false;
  size_t staged_ = 0;
  // Chunk staged_'s encoding while it runs in slices (Engine::stage_chunks), shared with the
  // other requests that wait for the same chunk.
  std::shared_ptr<PendingChunk> pending_;
  std::map<std::string, int> read_failures_;        // per chunk id (re-encodes after damage)
  GenerateOptions gen_;
  AnswerOptions opt_;
  KVCache kv_;
  std::vector<float> logits_;  // next-token logits
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<StopMatcher> stops_;  // GenerateOptions::stop, when given
  Timer ttft_;    // since the request arrived
  Timer decode_;  // since the first token was sampled
  bool first_ = true;
  // The GPU sequence slot it holds, from its prefill to its end; null when it runs on the CPU.
  std::shared_ptr<const int> gpu_slot_;
  int next_pos_ = 0;  // position of the next token fed
  // GenerateOptions::prompt_logprobs: the prompt's rows computed (and scored) so far, while its
  // prefill runs in Engine::score_rows; -1 otherwise.
  int scored_ = -1;
  // AnswerOptions::shared_prefill: a follower's until it copied the leader's rows (or prefills on
  // its own), the leader's until its prefill ended.
  std::shared_ptr<SharedPrefill> share_;
  bool leads_ = false;
  bool done_ = false;
  std::exception_ptr error_;
};

class Engine {
 public:
  explicit Engine(EngineOptions opt);
  ~Engine();
  const Model& model() const { return *model_; }
  store::CachePool& pool() { return *pool_; }
  const EngineOptions& options() const { return opt_; }
  // Index of the configured tier of kind `name` (options().tiers), -1 when there is none;
  // tier_names() lists the configured kinds for messages ("device, host, disk").
  int find_tier(const std::string& name) const;
  std::string tier_names() const;
  // Positions of the GPU sequence (0 without EngineOptions::cuda).
  int gpu_ctx() const;
  // The device prefills run on (EngineOptions::cuda), null on a CPU engine; backend_name() is
  // its name ("cuda") or "cpu": the backend of the calibrations that apply to its prefills.
  DeviceSequence* device() const { return gpu_.get(); }
  std::string backend_name() const;

  // Makes sure the chunk (tokens as produced by tokenize_chunk) is stored; encodes it when
  // absent. `tier` names the tier to store a new encoding in (empty: the top tier).
  // meta_out, when given, receives the chunk's metadata. A stored record that does not match the
  // request (tokens, model, shape, encoding; see store::check_meta) is dropped and re-encoded.
  // When no tier takes a new encoding: with `unplaced` given, the record is handed back there
  // (the caller serves this request from memory, info.note says so); without, ct::Error.
  ChunkInfo ensure_chunk(const std::vector<int32_t>& tokens, const std::string& tier = "",
                         ChunkMeta* meta_out = nullptr, std::optional<ChunkKV>* unplaced = nullptr);

  // ensure_chunk in blocks, for the ingest route (POST /v1/chunks): each call looks the chunk up
  // or runs one block of its encoding (prefill_chunk rows of work; all of it when 0), joining
  // an encoding of the same chunk that a request runs, and returns true once the chunk is
  // stored (in.info as ensure_chunk's). Called between engine steps on the thread that drives
  // the engine, so that running requests decode between two blocks. Throws what ensure_chunk
  // throws (no tier takes the record: ct::Error).
  struct ChunkIngest {
    std::vector<int32_t> tokens;
    std::string tier;  // as ensure_chunk's (empty: the top tier)
    ChunkInfo info;
    std::shared_ptr<PendingChunk> pending;
  };
  bool ingest_step(ChunkIngest& in);

  // Key of the calibration that applies to tier `tier` (index into options().tiers) for the
  // loaded model on this machine and compute backend `backend` ("cpu" or "cuda": where the
  // prefill runs, Answer::device). `cachetune calibrate` measures backend_name()'s.
  sched::CalibrationKey calibration_key(size_t tier, const std::string& backend = "cpu") const;
  // The calibrated ratio for tier `tier` on `backend`, or r_min when none is stored. The
  // calibration file is read on the first call and kept: calibrate in one process, then start a
  // new engine.
  RatioChoice auto_ratio(size_t tier, const std::string& backend = "cpu") const;

  // Answers a question over documents with the given policy (prompt layout: build_rag_prompt).
  // With auto ratio (AnswerOptions::auto_ratio, default options().auto_ratio) the ratio comes
  // from auto_ratio() for the lowest tier holding any of the chunks after lookup, replacing
  // sel.policy.ratio: the loader reads every chunk each layer, so the slowest medium sets the
  // load path. Not thread-safe: one thread drives an Engine (engine/scheduler.h serves many
  // requests from one thread).
  // A prompt longer than the model's context (with gen.max_tokens) is refused before any chunk
  // is looked up or encoded.
  Answer answer(const std::vector<std::string>& docs, const std::string& question,
                const SelectiveOptions& sel, const GenerateOptions& gen,
                const AnswerOptions& opt = {});
  // The same for a prompt tokenised already (build_rag_prompt; opt.instruction and opt.history
  // are not used), e.g. by a server that checked its length first.
  Answer answer(const RagPromptTokens& prompt, const SelectiveOptions& sel,
                const GenerateOptions& gen, const AnswerOptions& opt = {});

  // The two halves of answer(), for a scheduler that decodes many requests together. begin()
  // looks up (or encodes) the chunks and runs the prefill; with EngineOptions::prefill_chunk it
  // only makes the generation, whose chunks the next steps look up and encode. `arrival` starts
  // the request's TTFT. advance() is one engine step: it samples the next token of every
  // generation that has its logits, hands it to its on_piece, looks up and encodes chunks of
  // generations still staging (prepares the prefill in slices once a request's are all there)
  // and runs one batched pass (CPU) over those that go on (a decode row each) and the next
  // slices of prefilling generations, oldest first: encoded rows and slice rows together
  // within prefill_chunk (a chunk's encoding runs in slices too, shared by the requests that
  // wait for the same chunk; a request's selection runs whole); on the GPU one step each. A request's tokens are the same whatever it is batched with
  // (cpu::forward_batch): the same as alone with the same prefill_chunk. A chunk that cannot be
  // read during a slice is re-encoded and that request's prefill starts again. A prefilling
  // request whose AnswerOptions::cancelled says so stops with RequestCancelled as its error().
  // On a CUDA engine each generation on the GPU holds one of its gpu_seqs sequence slots until it
  // finishes (or is dropped); while every slot is held, new requests run on the CPU.
  std::unique_ptr<Generation> begin(const RagPromptTokens& prompt, const SelectiveOptions& sel,
                                    const GenerateOptions& gen, const AnswerOptions& opt = {},
                                    const Timer& arrival = Timer());
  StepRows advance(Generation* const* gens, int n);

 private:
  int tier_index(const std::string& name) const;
  // answer() from the tokenised prompt; `ttft` started when the request arrived.
  Answer answer_from(const RagPromptTokens& p, const SelectiveOptions& sel,
                     const GenerateOptions& gen, const AnswerOptions& opt, const Timer& ttft);
  EngineOptions opt_;
  std::unique_ptr<Model> model_;
  RowWork row_work_;  // the step budget's count (EngineOptions::step_attn_keys)
  std::unique_ptr<store::CachePool> pool_;
  PrefixCache prefix_cache_;
  void finish(Generation& g) const;
  // The prefill (or its slices) of g: with its chunks looked up here (again after a chunk could
  // not be read), or when they are staged (stages_chunks) from answer_.chunks and srcs_ (a
  // chunk that cannot be read then sends g back to staging: restage).
  void start_prefill(Generation& g);
  // Whether g's chunks are looked up and encoded step by step (EngineOptions::prefill_chunk,
  // and tokens to generate).
  bool stages_chunks(const Generation& g) const;
  // g's next chunks looked up, and missing ones encoded in slices (ChunkEncoding, one shared
  // PendingChunk per chunk id in encodings_), while the step's work is below prefill_chunk (an
  // encoding runs in blocks of prefill_chunk of work, ChunkEncoding::step, one joining a step
  // that has other work only when it fits; the record is ranked, packed and stored by the first
  // call that finds its work done); once the last chunk is there, the prefill starts
  // (start_prefill). Adds the work and the rows done to `step`.
  void stage_chunks(Generation& g, StepRows& step);
  // The next rows of a scored prompt (GenerateOptions::prompt_logprobs; scored_ >= 0): the plain
  // forward pass over them with every row's logits, at most the rows whose work fits within
  // `work` (at least one; work <= 0: all that are left), and at most as many as 64 MiB of
  // logits hold at once; each row's logits score the prompt's next token
  // (answer_.prompt_logprobs). After the last row its logits are the next token's, and g
  // decodes (or ends, with max_tokens 0). Adds the rows and their work to `step`.
  void score_rows(Generation& g, double work, StepRows& step);
  // The next blocks of a selection pass (CacheBlend's, ProphetKV's: SlicedPrefill::select_step),
  // each of the rows whose work fits within the step budget (so that its blocks are its own
  // whatever shares the steps), while they fit beside the step's work so far (the first at
  // least). A chunk that cannot be read restages g; other failures fail it. Adds the work to
  // `step`; returns whether the pass is done (the first slice may then join this step).
  bool selection_step(Generation& g, StepRows& step);
  // g's prefill has ended (its cache holds the prompt's rows, logits_ the next token's): a leader
  // leaves them for its followers (SharedPrefill), or on the GPU says it cannot.
  void prefill_ended(Generation& g) const;
  // A follower whose leader's rows are there: copies them and goes on as after its own prefill.
  // Whose leader could not leave them: prefills on its own. Returns whether g samples its first
  // token in this step.
  bool follow(Generation& g);
  // Chunk i of g's prompt looked up (encoded when missing; ensure_chunk): its ChunkInfo appended
  // to answer_.chunks, its source (pinned, or the record no tier took) to srcs_.
  void look_up_chunk(Generation& g, size_t i);
  // ensure_chunk's halves. find_stored: info's id and size, and whether the pool holds a usable
  // record (info.hit, its metadata in meta_out; a mismatching one is dropped, info.replaced).
  // store_encoded: a new record into the pool (tier index `want`), or handed back in `unplaced`
  // when no tier takes it (without `unplaced`, ct::Error); info's tier and note set.
  bool find_stored(const std::string& id, const std::vector<int32_t>& tokens, ChunkInfo& info,
                   ChunkMeta* meta_out);
  void store_encoded(ChunkKV rec, int want, ChunkInfo& info, ChunkMeta* meta_out,
                     std::optional<ChunkKV>* unplaced);
  // The running encoding of chunk `id`, or null.
  std::shared_ptr<PendingChunk> running_encoding(const std::string& id);
  // The running encoding of `tokens` (joined); else null when the pool holds the chunk (info
  // and meta_out set by find_stored); else a new running encoding (info: the lookup's).
  std::shared_ptr<PendingChunk> find_or_start(const std::vector<int32_t>& tokens, ChunkInfo& info,
                                              ChunkMeta* meta_out);
  // One block of `hold`'s encoding (at most `block` rows of work; with a device all of it), or
  // when none is left its record (hold done and forgotten by encodings_). A step that throws
  // marks it broken and forgets it, and the error goes on.
  std::optional<ChunkKV> encoding_step(const std::shared_ptr<PendingChunk>& hold, double block);
  // g's chunk i, found or encoded: appended to answer_.chunks and srcs_.
  void add_chunk(Generation& g, ChunkInfo info, ChunkMeta meta, std::optional<ChunkKV> unplaced);
  // The encodings running in slices, by chunk id; an entry expires when no request holds it.
  std::map<std::string, std::weak_ptr<PendingChunk>> encodings_;
  // Back to staging from the first chunk (its sources and ChunkInfo dropped).
  static void restage(Generation& g);
  // Whether g's AnswerOptions::cancelled says its client has gone (or throws); then g ends
  // with that error (fail).
  bool stop_if_cancelled(Generation& g) const;
  // One batched decode step (cpu::decode_batch) of the token ids fed to feed.
  void decode_step(const std::vector<Generation*>& feed, const std::vector<int32_t>& ids);
  // A chunk that could not be read (detected corruption, a lost entry, an unreachable tier):
  // logged and dropped from the pool, so that the next lookup encodes it again.
  void drop_unreadable(const ChunkReadError& e);
  // Counts a failed read of chunk_id for g (Answer::retries); throws after the second.
  static void count_read_failure(Generation& g, const std::string& chunk_id);
  // Ends g with `error` (it leaves the batch at this step).
  void fail(Generation& g, std::exception_ptr error) const;
  // One pass over decode rows (token ids fed to feed) and the next slices of pre (slice[i]
  // rows each); returns the prefill rows it ran. A prefill that fails to restart after a chunk
  // read error leaves pre (and the step) with its error.
  int mixed_step(const std::vector<Generation*>& feed, const std::vector<int32_t>& ids,
                 std::vector<Generation*>& pre, std::vector<int>& slice);
  std::unique_ptr<DeviceSequence> gpu_;                            // EngineOptions::cuda
  // Which of gpu_'s sequence slots generations hold (shared with their slot handles).
  struct GpuSlots {
    std::mutex mu;
    std::vector<char> busy;
  };
  std::shared_ptr<GpuSlots> gpu_slots_ = std::make_shared<GpuSlots>();
  // A free slot, released when the returned handle is dropped; null when all are taken.
  std::shared_ptr<const int> acquire_gpu_slot();
  void gpu_decode_step(const std::vector<Generation*>& feed, const std::vector<int32_t>& ids);
  Workspace decode_ws_;                                            // advance()'s batch
  std::vector<float> decode_logits_;                               // its logits, kept between steps
  mutable std::unique_ptr<sched::CalibrationStore> calibrations_;  // loaded by auto_ratio()
  // The vocabulary's trie for JSON output, built by the first request that asks for it.
  std::shared_ptr<const VocabTrie> json_vocab();
  std::once_flag json_vocab_once_;
  std::shared_ptr<const VocabTrie> json_vocab_;
};

}  // namespace ct
