// Continuous batching: a batched decode step equals each sequence's step alone bit for bit
// (cpu::decode_batch), and the scheduler (engine/scheduler.h) answers concurrent requests with
// exactly the tokens each gets alone, within its K/V budget and queue bound, letting a
// cancelled request leave without disturbing the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/cpu/qgemm.h"
#include "backend/cpu_forward.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "reuse/pooled_chunk.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

class BatchingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::TinyModelOptions o;
    o.arch = "qwen2";  // QKV biases: the batched projection adds them per row too
    o.n_layer = 2;
    o.context_length = 512;
    o.weight_type = GgmlType::Q8_0;
    path_ = new std::string(test::write_tiny_model(dir_->path() + "/tiny.gguf", o));
  }
  static void TearDownTestSuite() {
    delete path_;
    delete dir_;
  }
  static EngineOptions engine_options() {
    EngineOptions eo;
    eo.model_path = *path_;
    eo.tiers = {parse_tier_spec("host:64M")};
    // Rows alone: the tests below count the steps' rows against the budget. A budget that
    // counts attention too has its own test (TheStepBudgetCountsEachRowsAttention).
    eo.step_attn_keys = 0;
    return eo;
  }
  static inline test::TempDir* dir_ = nullptr;
  static inline std::string* path_ = nullptr;
};

TEST_F(BatchingTest, DecodeBatchEqualsEachSequenceAloneBitForBit) {
  auto m = Model::load(*path_);
  const int V = m->config().n_vocab;
  // Eight sequences with prompts of different lengths, so the batch's rows sit at different
  // positions and attend over caches of different lengths; eight rows take the products' lane
  // form (qgemv_q8.h), whose results must equal the one-row form's.
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {5, 11, 2, 7, 1, 9, 3, 4}) {
    std::vector<int32_t> p(len);
    for (int j = 0; j < len; ++j) p[j] = 1 + (len * 13 + j * 5) % 60;
    prompts.push_back(p);
  }
  const int n = (int)prompts.size();
  std::vector<KVCache> solo(n), batch(n);
  std::vector<int32_t> next(n);
  Workspace ws;
  for (int i = 0; i < n; ++i) {
    solo[i] = m->make_cache(64);
    batch[i] = m->make_cache(64);
    const int len = (int)prompts[i].size();
    cpu::prefill(*m, prompts[i].data(), len, 0, solo[i], ws);
    cpu::prefill(*m, prompts[i].data(), len, 0, batch[i], ws);
    next[i] = 30 + i;
  }
  Workspace bws;
  for (int step = 0; step < 6; ++step) {
    std::vector<KVCache*> kvs;
    for (auto& kv : batch) kvs.push_back(&kv);
    std::vector<float> got;
    cpu::decode_batch(*m, next.data(), kvs.data(), n, bws, got);
    ASSERT_EQ(got.size(), (size_t)n * V);
    for (int i = 0; i < n; ++i) {
      const std::vector<float> want = cpu::prefill(*m, &next[i], 1, solo[i].n_pos, solo[i], ws);
      ASSERT_EQ(solo[i].n_pos, batch[i].n_pos);
      for (int v = 0; v < V; ++v) {
        ASSERT_EQ(got[(size_t)i * V + v], want[v]) << "step " << step << " seq " << i << " v " << v;
      }
      next[i] = (next[i] * 7 + step) % V;
    }
  }
}

struct Req {
  std::vector<std::string> docs;
  std::string question;
  const Policy* policy;
};

std::vector<Req> requests() {
  const std::vector<std::string> a = {"The lighthouse on Gull Point was built in 1871.",
                                      "Marta Olsen kept the lighthouse for forty years."};
  const std::vector<std::string> b = {"The ferry leaves the harbour at seven each morning.",
                                      "Tickets are sold at the kiosk beside the pier."};
  return {{a, "Who kept the lighthouse?", &find_policy("cachetune")},
          {b, "When does the ferry leave?", &find_policy("full")},
          {{b[1], a[0]}, "Where are tickets sold?", &find_policy("cachetune")},
          {a, "When was it built?", &find_policy("reuse")},
          {{}, "Say something.", &find_policy("full")},
          {{a[1], b[0], a[0]}, "Who wrote a diary?", &find_policy("cacheblend")},
          // The only request of the prefix policy: its cache is empty in any order.
          {{b[0], a[1]}, "What did Marta keep?", &find_policy("prefix")},
          {{a[0], b[1]}, "What was built in 1871?", &find_policy("lfonly")}};
}

SelectiveOptions sel_of(const Req& r) {
  SelectiveOptions s;
  s.policy.kind = r.policy;
  s.policy.ratio = 0.3;
  return s;
}

GenerateOptions gen_of(int max_tokens = 12) {
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.stop_at_eog = false;  // every request decodes all its tokens: the batch stays full
  return g;
}

// Each request answered alone, on an engine of its own.
std::vector<std::vector<int32_t>> alone(const EngineOptions& eo, const std::vector<Req>& rs,
                                        int max_tokens) {
  Engine eng(eo);
  std::vector<std::vector<int32_t>> out;
  for (const Req& r : rs) out.push_back(eng.answer(r.docs, r.question, sel_of(r), gen_of(max_tokens)).tokens);
  return out;
}

// Holds the scheduler's thread inside a task until released, so that requests queue up.
struct Gate {
  std::atomic<bool> open{false};
  std::thread t;
  void hold(Scheduler& s) {
    std::atomic<bool> entered{false};
    t = std::thread([&s, this, &entered] {
      s.run([this, &entered] {
        entered = true;
        while (!open) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
    });
    while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void release() {
    open = true;
    t.join();
  }
};

void wait_queued(const Scheduler& s, int n) {
  while (s.stats().queued < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Each request from its own thread through the scheduler, all queued before the first is
// admitted; returns each one's tokens.
std::vector<std::vector<int32_t>> concurrently(Scheduler& sched, const Tokenizer& tok,
                                               const std::vector<Req>& rs, int max_tokens,
                                               std::vector<Answer>* answers = nullptr) {
  std::vector<std::vector<int32_t>> got(rs.size());
  std::vector<Answer> ans(rs.size());
  std::vector<std::thread> threads;
  Gate gate;
  gate.hold(sched);
  for (size_t i = 0; i < rs.size(); ++i) {
    threads.emplace_back([&, i] {
      const RagPromptTokens p = build_rag_prompt(tok, rs[i].docs, rs[i].question);
      ans[i] = sched.answer(p, sel_of(rs[i]), gen_of(max_tokens));
      got[i] = ans[i].tokens;
    });
  }
  wait_queued(sched, (int)rs.size());
  gate.release();
  for (auto& t : threads) t.join();
  if (answers) *answers = std::move(ans);
  return got;
}

TEST_F(BatchingTest, ConcurrentRequestsGetTheTokensTheyGetAlone) {
  const std::vector<Req> rs = requests();
  const auto want = alone(engine_options(), rs, 12);
  Engine eng(engine_options());
  Scheduler sched(eng, SchedulerOptions{});
  const auto got = concurrently(sched, eng.model().tokenizer(), rs, 12);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  const SchedulerStats st = sched.stats();
  // One admission per step and 12 tokens each: all eight decode together at the eighth step.
  EXPECT_EQ(st.max_rows, (int)rs.size());
  EXPECT_EQ(st.completed, rs.size());  // the eight (the gate's task is not a request)
  EXPECT_EQ(st.kv_in_use, 0u);
  EXPECT_EQ(st.running, 0);
}

TEST_F(BatchingTest, KvBudgetBoundsTheBatchAndRefusesWhatCanNeverFit) {
  const std::vector<Req> rs = requests();
  Engine eng(engine_options());
  const Tokenizer& tok = eng.model().tokenizer();
  std::vector<RagPromptTokens> ps;
  size_t largest = 0;
  for (const Req& r : rs) {
    ps.push_back(build_rag_prompt(tok, r.docs, r.question));
    largest = std::max(largest, Generation::kv_bytes_for(eng.model().config(),
                                                         eng.options().kv_type,
                                                         ps.back().n_tokens(), 12));
  }
  SchedulerOptions so;
  so.kv_budget_bytes = 2 * largest;  // two of any of these requests at a time, never three
  Scheduler sched(eng, so);
  const auto want = alone(engine_options(), rs, 12);
  std::vector<std::vector<int32_t>> got(rs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < rs.size(); ++i) {
    threads.emplace_back(
        [&, i] { got[i] = sched.answer(ps[i], sel_of(rs[i]), gen_of(12)).tokens; });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_LE(sched.stats().max_rows, 2);
  EXPECT_EQ(sched.stats().kv_in_use, 0u);
  // A request that needs more than the whole budget is refused at once, naming the numbers.
  GenerateOptions big = gen_of(400);
  try {
    sched.answer(ps[0], sel_of(rs[0]), big);
    FAIL() << "expected AdmissionError";
  } catch (const AdmissionError& e) {
    EXPECT_TRUE(e.too_large());
    EXPECT_NE(std::string(e.what()).find(std::to_string(so.kv_budget_bytes)), std::string::npos)
        << e.what();
  }
}

TEST_F(BatchingTest, FullQueueRefusesWithRetryAfter) {
  Engine eng(engine_options());
  SchedulerOptions so;
  so.max_queue = 2;
  Scheduler sched(eng, so);
  const RagPromptTokens p = build_rag_prompt(eng.model().tokenizer(), {}, "Hello?");
  Gate gate;
  gate.hold(sched);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] { sched.answer(p, SelectiveOptions{}, gen_of(3)); });
  }
  wait_queued(sched, 2);
  try {
    sched.answer(p, SelectiveOptions{}, gen_of(3));
    FAIL() << "expected AdmissionError";
  } catch (const AdmissionError& e) {
    EXPECT_FALSE(e.too_large());
    EXPECT_GE(e.retry_after_s(), 1);
  }
  gate.release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(sched.stats().refused, 1u);
}

TEST_F(BatchingTest, ARequestCancelledWhileQueuedIsNeverPrefilled) {
  Engine eng(engine_options());
  Scheduler sched(eng, SchedulerOptions{});
  const RagPromptTokens p = build_rag_prompt(eng.model().tokenizer(), {}, "Hello?");
  Gate gate;
  gate.hold(sched);
  std::atomic<bool> gone{false};
  std::atomic<int> pieces{0};
  bool threw = false;
  std::thread t([&] {
    AnswerOptions ao;
    ao.on_piece = [&](const std::string&) { ++pieces; };
    ao.cancelled = [&] { return gone.load(); };
    try {
      sched.answer(p, SelectiveOptions{}, gen_of(4), ao);
    } catch (const RequestCancelled&) {
      threw = true;
    }
  });
  wait_queued(sched, 1);
  gone = true;  // the client leaves while the request waits
  gate.release();
  t.join();
  EXPECT_TRUE(threw);
  EXPECT_EQ(pieces.load(), 0);
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.cancelled_queued, 1u);
  EXPECT_EQ(st.steps, 0u);  // never joined a decode step
  EXPECT_EQ(st.kv_in_use, 0u);
}

TEST_F(BatchingTest, ACancelledRequestLeavesAndTheOthersFinish) {
  const std::vector<Req> rs = requests();
  const auto want = alone(engine_options(), rs, 12);
  Engine eng(engine_options());
  Scheduler sched(eng, SchedulerOptions{});
  const Tokenizer& tok = eng.model().tokenizer();
  struct Gone {};
  std::vector<std::vector<int32_t>> got(rs.size());
  std::atomic<int> cancelled_pieces{0};
  std::atomic<bool> cancelled_threw{false};
  std::vector<std::thread> threads;
  Gate gate;
  gate.hold(sched);
  for (size_t i = 0; i < rs.size(); ++i) {
    threads.emplace_back([&, i] {
      const RagPromptTokens p = build_rag_prompt(tok, rs[i].docs, rs[i].question);
      AnswerOptions ao;
      if (i == 2) {  // its client goes away after three tokens
        ao.on_piece = [&](const std::string&) {
          if (++cancelled_pieces == 3) throw Gone{};
        };
      }
      try {
        got[i] = sched.answer(p, sel_of(rs[i]), gen_of(12), ao).tokens;
      } catch (const Gone&) {
        cancelled_threw = true;
      }
    });
  }
  wait_queued(sched, (int)rs.size());
  gate.release();
  for (auto& t : threads) t.join();
  EXPECT_TRUE(cancelled_threw);
  EXPECT_EQ(cancelled_pieces.load(), 3);
  for (size_t i = 0; i < rs.size(); ++i) {
    if (i != 2) {
      EXPECT_EQ(got[i], want[i]) << "request " << i;
    }
  }
  EXPECT_EQ(sched.stats().kv_in_use, 0u);
}

// Chunked prefill: prompts are prefilled over several steps, in slices of at most prefill_chunk
// rows beside the decode rows of running requests, and every request still gets exactly the
// tokens it gets alone on an engine with the same setting.
TEST_F(BatchingTest, ChunkedPrefillStepsBesideDecodeRowsAndKeepsEachRequestsTokens) {
  EngineOptions eo = engine_options();
  eo.prefill_chunk = 8;
  const std::vector<Req> rs = requests();
  const auto want = alone(eo, rs, 12);
  Engine eng(eo);
  Scheduler sched(eng, SchedulerOptions{});
  const Tokenizer& tok = eng.model().tokenizer();
  int longest = 0;
  for (const Req& r : rs)
    longest = std::max(longest, build_rag_prompt(tok, r.docs, r.question).n_tokens());
  ASSERT_GT(longest, 3 * eo.prefill_chunk);  // the prompts really take several slices
  std::vector<Answer> answers;
  const auto got = concurrently(sched, tok, rs, 12, &answers);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  const SchedulerStats st = sched.stats();
  // Every request was prefilled in slices, whatever its policy (CacheBlend, prefix and lfonly
  // included): the steps' prefill rows are all the requests' active rows.
  uint64_t active = 0;
  for (const Answer& a : answers) active += (uint64_t)a.prefill.n_active;
  EXPECT_EQ(st.prefill_rows, active);
  EXPECT_GT(st.mixed_steps, 0u);  // prefill slices ran beside decode rows
  // A step holds one decode row per request and at most prefill_chunk prefill rows.
  EXPECT_LE(st.max_rows, (int)rs.size() + eo.prefill_chunk);
  EXPECT_EQ(st.kv_in_use, 0u);
  EXPECT_EQ(st.running, 0);
}

// GenerateOptions::prompt_logprobs (/v1/completions' echo with logprobs): entry i is prompt token
// i + 1's log-probability after tokens 0..i, each the log-softmax of the last row of a plain
// prefill of those tokens alone (the reference: one prefill per prefix); the same whether the
// prompt's rows ran whole or in steps of prefill_chunk beside another request's decode rows; and
// the tokens generated after it are the plain request's.
TEST_F(BatchingTest, AScoredPromptHasEachTokensLogprobAfterTheTokensBeforeIt) {
  auto m = Model::load(*path_);
  const int V = m->config().n_vocab;
  const Tokenizer& tok = m->tokenizer();
  const RagPromptTokens p = build_raw_prompt(
      tok, {}, "", "Marta Olsen kept the lighthouse on Gull Point for forty years.");
  std::vector<int32_t> toks = p.prefix;
  toks.insert(toks.end(), p.query.begin(), p.query.end());
  const int n = (int)toks.size();
  ASSERT_GT(n, 24);
  SelectiveOptions sel;
  sel.policy.kind = &find_policy("full");
  GenerateOptions gen = gen_of(0);
  gen.prompt_logprobs = 3;

  EngineOptions whole = engine_options();
  whole.prefill_chunk = 0;
  Engine eng(whole);
  const Answer a = eng.answer(p, sel, gen);
  ASSERT_EQ((int)a.prompt_logprobs.size(), n - 1);
  // Within rounding: the rows' grouping into products and tiles differs (a misplaced row would
  // be off by whole units). Where qgemm does not take Q8_0 (AVX2 without VNNI: maddubs would
  // saturate on its quants, cpu::qgemm_prefers), the engine's many-row products, the head's
  // included, run on F32 activations (dequantise + SGEMM) while the reference's last row runs
  // on 8-bit ones (qgemv): that moved log-probabilities by up to 0.012 on a Zen 3 EPYC.
  const double tol = cpu::qgemm_prefers(GgmlType::Q8_0) ? 2e-3 : 3e-2;
  EXPECT_TRUE(a.tokens.empty());
  EXPECT_EQ(a.prefill.n_active, n);
  for (int i = 0; i + 1 < n; ++i) {
    KVCache kv = m->make_cache(n + 1, whole.kv_type);  // the engine's cache type (F16)
    Workspace ws;
    const std::vector<float> last = cpu::prefill(*m, toks.data(), i + 1, 0, kv, ws);
    const TokenLogprob want = token_logprob(last.data(), V, toks[i + 1], 3);
    const TokenLogprob& got = a.prompt_logprobs[i];
    EXPECT_EQ(got.id, toks[i + 1]) << i;
    EXPECT_NEAR(got.logprob, want.logprob, tol) << i;
    ASSERT_EQ(got.top.size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(got.top[k].second, want.top[k].second, tol) << i;
  }

  // In steps of 8 rows beside a request that decodes meanwhile (the same entries within
  // rounding: only the rows' grouping into products changes), then 6 tokens generated after it.
  EngineOptions stepped = engine_options();
  stepped.prefill_chunk = 8;
  Engine eng2(stepped);
  Scheduler sched(eng2, SchedulerOptions{});
  const std::vector<Req> rs = requests();
  GenerateOptions scored = gen_of(6);
  scored.prompt_logprobs = 3;
  Answer other, b;
  Gate gate;
  gate.hold(sched);
  std::thread t1([&] {
    other = sched.answer(build_rag_prompt(tok, rs[4].docs, rs[4].question), sel_of(rs[4]),
                         gen_of(24));
  });
  wait_queued(sched, 1);
  std::thread t2([&] { b = sched.answer(p, sel, scored); });
  wait_queued(sched, 2);
  gate.release();
  t1.join();
  t2.join();
  ASSERT_EQ(b.prompt_logprobs.size(), a.prompt_logprobs.size());
  for (int i = 0; i + 1 < n; ++i) {
    EXPECT_NEAR(b.prompt_logprobs[i].logprob, a.prompt_logprobs[i].logprob, 2e-3) << i;
  }
  // The scored rows were steps' prefill rows, some beside the other request's decode rows.
  EXPECT_EQ(sched.stats().prefill_rows, (uint64_t)(n + other.prefill.n_active));
  EXPECT_GT(sched.stats().mixed_steps, 0u);
  EXPECT_EQ(b.tokens, eng.answer(p, sel, gen_of(6)).tokens);
  EXPECT_EQ((int)other.tokens.size(), 24);
  // A prompt of reused chunks cannot be scored: its chunks' rows are not computed.
  EXPECT_THROW(eng.answer(build_rag_prompt(tok, rs[0].docs, rs[0].question), sel, scored),
               Error);
}

// Scheduler::answer_all (a request's n choices) prefills the prompt once: the first choice's
// prefill, whose rows and logits the others copy (SharedPrefill). Each choice's tokens are what
// it gets alone, whatever the policy, with the choices admitted together or one at a time (the
// leader may have finished before the others start); the steps' prefill rows are one prefill's.
// A leader that ends before its prefill (cancelled while queued) leaves its followers to prefill
// on their own.
TEST_F(BatchingTest, NChoicesPrefillThePromptOnceAndEachGetsItsTokensAlone) {
  const std::vector<Req> rs = requests();
  for (int max_running : {16, 1}) {
    for (size_t r : {size_t(0), size_t(1), size_t(5), size_t(7)}) {  // cachetune, full, cacheblend, lfonly
      SCOPED_TRACE("max_running " + std::to_string(max_running) + ", request " + std::to_string(r));
      EngineOptions eo = engine_options();
      eo.prefill_chunk = 8;
      Engine alone_eng(eo);
      const Tokenizer& tok = alone_eng.model().tokenizer();
      const RagPromptTokens p = build_rag_prompt(tok, rs[r].docs, rs[r].question);
      std::vector<GenerateOptions> gens;
      for (int i = 0; i < 3; ++i) {
        GenerateOptions g = gen_of(8);
        g.sampling.temperature = 1.0f;
        g.sampling.seed = 11 + i;
        gens.push_back(g);
      }
      std::vector<Answer> want;
      for (const GenerateOptions& g : gens) want.push_back(alone_eng.answer(p, sel_of(rs[r]), g));
      Engine eng(eo);
      // Its chunks stored first, so that the prefill rows below are the prefills' alone.
      eng.answer(p, sel_of(rs[r]), gen_of(1));
      SchedulerOptions so;
      so.max_running = max_running;
      Scheduler sched(eng, so);
      const std::vector<Scheduler::Outcome> out =
          sched.answer_all(p, sel_of(rs[r]), gens, std::vector<AnswerOptions>(3));
      ASSERT_EQ(out.size(), 3u);
      for (int i = 0; i < 3; ++i) {
        ASSERT_FALSE(out[i].error) << i;
        EXPECT_EQ(out[i].answer.tokens, want[i].tokens) << "choice " << i;
      }
      EXPECT_GT(out[0].answer.prefill.n_active, 0);
      EXPECT_EQ(out[1].answer.prefill.n_active, 0);  // copied, not computed
      EXPECT_EQ(sched.stats().prefill_rows, (uint64_t)out[0].answer.prefill.n_active);
    }
  }
  // The leader cancelled before its prefill: the others prefill on their own.
  EngineOptions eo = engine_options();
  eo.prefill_chunk = 8;
  Engine eng(eo);
  const Tokenizer& tok = eng.model().tokenizer();
  const RagPromptTokens p = build_rag_prompt(tok, rs[1].docs, rs[1].question);
  const Answer want = eng.answer(p, sel_of(rs[1]), gen_of(6));
  Scheduler sched(eng, SchedulerOptions{});
  std::vector<AnswerOptions> opts(3);
  opts[0].cancelled = [] { return true; };
  const std::vector<Scheduler::Outcome> out =
      sched.answer_all(p, sel_of(rs[1]), {gen_of(6), gen_of(6), gen_of(6)}, opts);
  ASSERT_TRUE(out[0].error);
  EXPECT_THROW(std::rethrow_exception(out[0].error), RequestCancelled);
  for (int i = 1; i < 3; ++i) {
    ASSERT_FALSE(out[i].error) << i;
    EXPECT_EQ(out[i].answer.tokens, want.tokens) << i;
    EXPECT_GT(out[i].answer.prefill.n_active, 0) << i;
  }
}

// With chunked prefill a request's missing chunks are encoded over several steps, within the
// same per-step budget as the slices, so the requests already decoding get a token at every
// step instead of waiting for all of them; the tokens are still each request's own.
TEST_F(BatchingTest, ChunkEncodingsAreSpreadOverStepsBesideDecodeRows) {
  EngineOptions eo = engine_options();
  eo.prefill_chunk = 4;
  const std::vector<Req> rs = requests();
  const Req& a = rs[1];
  const Req b{{"The museum opens at nine on weekdays and at ten on Sundays.",
               "Its west wing holds a collection of old ship models.",
               "Guided tours start every hour from the main hall."},
              "When do the tours start?", &find_policy("cachetune")};
  Engine eng(eo);
  const Tokenizer& tok = eng.model().tokenizer();
  const RagPromptTokens pa = build_rag_prompt(tok, a.docs, a.question);
  const RagPromptTokens pb = build_rag_prompt(tok, b.docs, b.question);
  for (const auto& c : pb.chunks) ASSERT_GT((int)c.size(), eo.prefill_chunk);
  std::unique_ptr<Generation> ga = eng.begin(pa, sel_of(a), gen_of(64));
  Generation* one = ga.get();
  while (ga->prefilling()) eng.advance(&one, 1);
  // a decodes; b arrives with three chunks the pool has never seen: admission does no work, and
  // their encodings run in slices of the step's budget, each chunk over several steps, with a's
  // row in every one.
  std::unique_ptr<Generation> gb = eng.begin(pb, sel_of(b), gen_of(8));
  EXPECT_TRUE(gb->prefilling());
  EXPECT_TRUE(gb->answer().chunks.empty());
  // Every chunk's work (its rows, the sink and its probe pass) is done once, within the budget.
  int want_rows = 0;
  for (const auto& c : pb.chunks) {
    want_rows += ChunkEncoding(eng.model(), c, eng.options().encode).work_left();
  }
  Generation* both[2] = {ga.get(), gb.get()};
  int steps = 0, encoded = 0;
  while (gb->answer().chunks.size() < 3 && steps < 200) {
    const size_t before = ga->answer().tokens.size(), chunks = gb->answer().chunks.size();
    const StepRows st = eng.advance(both, 2);
    EXPECT_EQ(st.decode, 1);   // a's row
    EXPECT_EQ(st.prefill, 0);  // the encoding took the step's budget
    EXPECT_GT(st.encode, 0);
    EXPECT_LE(st.encode, eo.prefill_chunk);
    EXPECT_LE(gb->answer().chunks.size(), chunks + 1);
    EXPECT_EQ(ga->answer().tokens.size(), before + 1) << "a waited for b's encodings";
    encoded += st.encode;
    ++steps;
  }
  EXPECT_EQ(encoded, want_rows);
  EXPECT_GE(steps, 6);  // two or more steps a chunk
  while (!ga->done() || !gb->done()) eng.advance(both, 2);
  ASSERT_FALSE(ga->error());
  ASSERT_FALSE(gb->error());
  for (const ChunkInfo& c : gb->answer().chunks) {
    EXPECT_FALSE(c.hit);
    EXPECT_GT(c.encode_ms, 0.0);
    EXPECT_EQ(c.tier, "host");
  }
  EXPECT_EQ(gb->answer().tokens, alone(eo, {b}, 8)[0]);
  EXPECT_EQ(ga->answer().tokens, alone(eo, {a}, 64)[0]);
  // The same documents again: every chunk is found, so the first step looks them up, makes the
  // selection and runs the first slice.
  std::unique_ptr<Generation> gc = eng.begin(pb, sel_of(b), gen_of(8));
  Generation* third = gc.get();
  EXPECT_EQ(eng.advance(&third, 1).prefill, eo.prefill_chunk);
  ASSERT_EQ(gc->answer().chunks.size(), 3u);
  for (const ChunkInfo& c : gc->answer().chunks) EXPECT_TRUE(c.hit);
  while (!gc->done()) eng.advance(&third, 1);
  EXPECT_EQ(gc->answer().tokens, gb->answer().tokens);

  // A request whose client goes while its chunk is being encoded stops there, RequestCancelled;
  // another request waiting for the same chunk goes on with the encoding where it was, so each
  // row is encoded once; the tokens are its own.
  const Req d{{"The bakery on Quay Street sells rye bread from six in the morning.",
               "Its owner learned the trade in a village near the northern border."},
              "Who owns the bakery?", &find_policy("cachetune")};
  const RagPromptTokens pd = build_rag_prompt(tok, d.docs, d.question);
  const std::string first_id = chunk_id(eng.model().fingerprint(), pd.chunks[0], eng.options().encode);
  int want_d = 0;
  for (const auto& c : pd.chunks) {
    want_d += ChunkEncoding(eng.model(), c, eng.options().encode).work_left();
  }
  bool gone = false;
  AnswerOptions ao;
  ao.cancelled = [&] { return gone; };
  std::unique_ptr<Generation> gd = eng.begin(pd, sel_of(d), gen_of(4), ao);
  std::unique_ptr<Generation> ge = eng.begin(pd, sel_of(d), gen_of(4));
  Generation* de[2] = {gd.get(), ge.get()};
  int d_encoded = eng.advance(de, 2).encode;  // d's first slice of its first chunk
  EXPECT_EQ(d_encoded, eo.prefill_chunk);
  EXPECT_TRUE(gd->answer().chunks.empty());
  gone = true;
  StepRows st = eng.advance(de, 2);  // d leaves; e goes on with the same encoding
  ASSERT_TRUE(gd->done());
  ASSERT_TRUE(gd->error());
  EXPECT_THROW(std::rethrow_exception(gd->error()), RequestCancelled);
  EXPECT_TRUE(gd->answer().chunks.empty());
  EXPECT_FALSE(eng.pool().contains(first_id));
  d_encoded += st.encode;
  while (ge->prefilling()) d_encoded += eng.advance(de, 2).encode;
  EXPECT_EQ(d_encoded, want_d) << "rows encoded twice, or not at all";
  while (!ge->done()) eng.advance(de, 2);
  ASSERT_FALSE(ge->error());
  EXPECT_TRUE(eng.pool().contains(first_id));
  EXPECT_EQ(ge->answer().tokens, alone(eo, {d}, 4)[0]);
}

// The selection passes run in blocks of the step budget beside the decode rows of running
// requests, and no slice runs before they end: CacheBlend's (layer 0 over every row of the
// request, layer 1's K/V projected; a row costs 1/n_layer of a row) and ProphetKV's reuse pass
// (every layer over the prefix and query rows, every chunk row reused). Each request gets the
// tokens it gets alone.
TEST_F(BatchingTest, SelectionPassesAreSpreadOverStepsBesideDecodeRows) {
  EngineOptions eo = engine_options();
  eo.prefill_chunk = 4;
  const std::vector<Req> rs = requests();
  const Req& a = rs[1];
  for (const char* name : {"cacheblend", "prophetkv"}) {
    SCOPED_TRACE(name);
    const Req b{rs[0].docs, "Who kept the lighthouse on Gull Point for forty years?",
                &find_policy(name)};
    Engine eng(eo);
    const Tokenizer& tok = eng.model().tokenizer();
    const RagPromptTokens pa = build_rag_prompt(tok, a.docs, a.question);
    const RagPromptTokens pb = build_rag_prompt(tok, b.docs, b.question);
    eng.answer(pb, sel_of(b), gen_of(1));  // stores b's chunks: its steps below look them up
    std::unique_ptr<Generation> ga = eng.begin(pa, sel_of(a), gen_of(64));
    Generation* one = ga.get();
    while (ga->prefilling()) eng.advance(&one, 1);
    std::unique_ptr<Generation> gb = eng.begin(pb, sel_of(b), gen_of(8));
    Generation* both[2] = {ga.get(), gb.get()};
    const int n_total = pb.n_tokens(), n_layer = eng.model().config().n_layer;
    const bool layer0 = std::string(name) == "cacheblend";
    // The pass's rows, and how many fit in one budget.
    const int rows = layer0 ? n_total : (int)(pb.prefix.size() + pb.query.size());
    const int block = layer0 ? eo.prefill_chunk * n_layer : eo.prefill_chunk;
    ASSERT_GT(rows, 2 * block);
    int selection_steps = 0;
    for (;;) {
      const size_t before = ga->answer().tokens.size();
      const StepRows st = eng.advance(both, 2);
      EXPECT_EQ(st.decode, 1);  // a's row in every step
      EXPECT_EQ(ga->answer().tokens.size(), before + 1) << "a waited for b's selection";
      EXPECT_LE(st.work, eo.prefill_chunk + 1e-9);
      if (st.prefill > 0) break;  // b's first slice
      EXPECT_GT(st.work, 0.0);
      ++selection_steps;
      ASSERT_LT(selection_steps, 1000);
    }
    EXPECT_EQ(selection_steps, (rows + block - 1) / block);
    while (!ga->done() || !gb->done()) eng.advance(both, 2);
    ASSERT_FALSE(ga->error());
    ASSERT_FALSE(gb->error());
    for (const ChunkInfo& c : gb->answer().chunks) EXPECT_TRUE(c.hit);
    EXPECT_GT(gb->answer().prefill.n_loaded, 0);
    EXPECT_LT(gb->answer().prefill.n_active, n_total);
    EXPECT_EQ(gb->answer().tokens, alone(eo, {b}, 8)[0]);
    EXPECT_EQ(ga->answer().tokens, alone(eo, {a}, 64)[0]);
  }
}

// An encoding's slices are blocks of the budget whoever steps it and whatever shares the step:
// a request whose new chunks are encoded in steps beside another request's encodings and slices
// stores the same records, bit for bit, and gets the same tokens as alone. Two requests that
// need the same new chunks at once encode them once: the first stores them, the other (holding
// the running encoding meanwhile) finds them stored.
TEST_F(BatchingTest, AnEncodingDoesNotDependOnWhatSharesItsSteps) {
  for (double keys : {0.0, 40.0}) {  // rows alone, and rows with their attention
  SCOPED_TRACE("step_attn_keys " + std::to_string(keys));
  EngineOptions eo = engine_options();
  eo.prefill_chunk = 4;
  eo.step_attn_keys = keys;
  const Req x = requests()[1];  // full recompute: its new chunks, then every row in slices
  const Req b{{"The museum opens at nine on weekdays and at ten on Sundays.",
               "Its west wing holds a collection of old ship models."},
              "When does the museum open?", &find_policy("cachetune")};
  const auto records = [](Engine& e, const RagPromptTokens& p) {
    std::vector<ChunkKV> out;
    for (const auto& c : p.chunks) {
      const auto meta = e.pool().lookup(chunk_id(e.model().fingerprint(), c, e.options().encode));
      EXPECT_TRUE(meta.has_value());
      if (meta) out.push_back(read_whole_chunk(PooledChunk(e.pool(), *meta)));
    }
    return out;
  };
  Engine solo(eo);
  const Tokenizer& tok = solo.model().tokenizer();
  const RagPromptTokens pb = build_rag_prompt(tok, b.docs, b.question);
  const RagPromptTokens px = build_rag_prompt(tok, x.docs, x.question);
  const std::vector<int32_t> want_tokens = solo.answer(pb, sel_of(b), gen_of(8)).tokens;
  const std::vector<ChunkKV> want = records(solo, pb);
  int want_rows = 0;  // x's chunks and b's, each once
  for (const RagPromptTokens* p : {&px, &pb}) {
    for (const auto& c : p->chunks) {
      ChunkEncoding e(solo.model(), c, eo.encode);
      e.step(e.work_left());
      want_rows += e.rows_done();
    }
  }

  Engine eng(eo);
  std::unique_ptr<Generation> gx = eng.begin(px, sel_of(x), gen_of(8));
  std::unique_ptr<Generation> gb = eng.begin(pb, sel_of(b), gen_of(8));
  std::unique_ptr<Generation> gb2 = eng.begin(pb, sel_of(b), gen_of(8));
  Generation* all[3] = {gx.get(), gb.get(), gb2.get()};
  int rows = 0;
  for (int step = 0; step < 2000 && (!gx->done() || !gb->done() || !gb2->done()); ++step) {
    const StepRows st = eng.advance(all, 3);
    if (st.encode + st.prefill > 1) {
      EXPECT_LE(st.work, eo.prefill_chunk + 1e-9);
    }
    if (keys == 0) {
      EXPECT_EQ(st.work, st.encode + st.prefill);
    }
    rows += st.encode;
  }
  ASSERT_TRUE(gx->done() && gb->done() && gb2->done());
  ASSERT_FALSE(gx->error());
  ASSERT_FALSE(gb->error());
  ASSERT_FALSE(gb2->error());
  EXPECT_EQ(rows, want_rows) << "a chunk encoded twice, or not whole";
  for (size_t i = 0; i < pb.chunks.size(); ++i) {
    EXPECT_FALSE(gb->answer().chunks[i].hit) << i;
    EXPECT_TRUE(gb2->answer().chunks[i].hit) << i;
  }
  EXPECT_EQ(gb->answer().tokens, want_tokens);
  EXPECT_EQ(gb2->answer().tokens, want_tokens);
  const std::vector<ChunkKV> got = records(eng, pb);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].meta.order, want[i].meta.order) << i;
    EXPECT_EQ(got[i].k, want[i].k) << "chunk " << i << ": K differs from the encoding alone";
    EXPECT_EQ(got[i].v, want[i].v) << "chunk " << i << ": V differs from the encoding alone";
  }
  }
}

// With EngineOptions::step_attn_keys the budget counts a row at position p as 1 + (p + 1) /
// step_attn_keys: a prompt's slices get shorter as its rows get later, each the most rows that
// fit (the last one what is left), and a step's work (StepRows::work) is what its rows count.
// A chunk's encoding blocks count the same way (every row costs more than 1 here, so no block
// has as many rows as the budget). Where one row costs more than the whole budget, each step
// still runs one, and the request finishes.
TEST_F(BatchingTest, TheStepBudgetCountsEachRowsAttention) {
  for (const auto& [budget, keys] : std::vector<std::pair<int, double>>{{8, 10}, {2, 1}}) {
    SCOPED_TRACE("budget " + std::to_string(budget) + ", keys " + std::to_string(keys));
    EngineOptions eo = engine_options();
    eo.prefill_chunk = budget;
    eo.step_attn_keys = keys;
    const RowWork w{keys};
    const Req r = requests()[1];  // full recompute: the prompt's rows in order, all slice rows
    Engine eng(eo);
    const RagPromptTokens p = build_rag_prompt(eng.model().tokenizer(), r.docs, r.question);
    std::unique_ptr<Generation> g = eng.begin(p, sel_of(r), gen_of(4));
    Generation* gp = g.get();
    std::vector<int> blocks, slices;
    int pos = 0;
    for (int step = 0; step < 5000 && g->prefilling(); ++step) {
      const StepRows st = eng.advance(&gp, 1);
      if (st.encode + st.prefill > 1) {
        EXPECT_LE(st.work, budget + 1e-9) << "step " << step;
      }
      if (st.encode > 0) blocks.push_back(st.encode);
      if (st.prefill == 0) continue;
      // A slice (with the last encoding block, when the first slice joins its step).
      if (st.encode == 0) {
        EXPECT_NEAR(st.work, w.rows(pos, st.prefill), 1e-9) << "slice at " << pos;
      }
      // The most rows that fit, but for the prompt's last slice.
      if (pos + st.prefill < p.n_tokens()) {
        EXPECT_GT(w.rows(pos, st.prefill + 1), budget) << "slice at " << pos;
      }
      slices.push_back(st.prefill);
      pos += st.prefill;
    }
    ASSERT_FALSE(g->prefilling());
    EXPECT_EQ(pos, p.n_tokens());
    ASSERT_GE(slices.size(), 3u);
    for (size_t i = 1; i + 1 < slices.size(); ++i) EXPECT_LE(slices[i], slices[i - 1]) << i;
    if (budget > 2) {
      EXPECT_LT(slices[slices.size() - 2], slices[0]);  // later rows, fewer of them
    }
    ASSERT_FALSE(blocks.empty());
    EXPECT_LT(*std::max_element(blocks.begin(), blocks.end()), budget);
    while (!g->done()) eng.advance(&gp, 1);
    ASSERT_FALSE(g->error());
    EXPECT_EQ(g->answer().tokens, alone(eo, {r}, 4)[0]);
  }
}

// A prefilling request whose client has gone stops between two slices: no token, its error is
// RequestCancelled, and its cache goes back.
TEST_F(BatchingTest, ARequestCancelledDuringAChunkedPrefillStopsBetweenSlices) {
  EngineOptions eo = engine_options();
  eo.prefill_chunk = 2;
  Engine eng(eo);
  const Req r = requests()[1];  // full recompute: every prompt row is a prefill row
  const RagPromptTokens p = build_rag_prompt(eng.model().tokenizer(), r.docs, r.question);
  bool gone = false;
  int pieces = 0;
  AnswerOptions ao;
  ao.cancelled = [&] { return gone; };
  ao.on_piece = [&](const std::string&) { ++pieces; };
  std::unique_ptr<Generation> g = eng.begin(p, sel_of(r), gen_of(4), ao);
  Generation* gp = g.get();
  ASSERT_TRUE(g->prefilling());
  // Its two new chunks are encoded first, in blocks of the budget of 2 rows of work; its slices
  // start once both are stored (the first may join the step that stores the second).
  for (int step = 0; step < 200 && g->answer().chunks.size() < 2; ++step) {
    const StepRows st = eng.advance(&gp, 1);
    EXPECT_GT(st.encode + st.prefill, 0);
    EXPECT_LE(st.encode + st.prefill, 2);
    if (g->answer().chunks.size() < 2) {
      EXPECT_EQ(st.prefill, 0);
    }
  }
  ASSERT_EQ(g->answer().chunks.size(), 2u);
  EXPECT_EQ(eng.advance(&gp, 1).prefill, 2);
  EXPECT_TRUE(g->prefilling());
  gone = true;
  const StepRows st = eng.advance(&gp, 1);
  EXPECT_EQ(st.prefill + st.decode, 0);
  EXPECT_TRUE(g->done());
  EXPECT_FALSE(g->prefilling());
  ASSERT_TRUE(g->error());
  EXPECT_THROW(std::rethrow_exception(g->error()), RequestCancelled);
  EXPECT_EQ(pieces, 0);
  EXPECT_TRUE(g->answer().tokens.empty());
  EXPECT_EQ(g->kv_bytes(), 0u);

  // A cancelled() that throws ends its own request only; the one stepped beside it finishes
  // with the tokens it gets alone.
  struct Broken {};
  AnswerOptions bad;
  bad.cancelled = []() -> bool { throw Broken{}; };
  const Req r2 = requests()[0];
  const RagPromptTokens p2 = build_rag_prompt(eng.model().tokenizer(), r2.docs, r2.question);
  std::unique_ptr<Generation> g1 = eng.begin(p, sel_of(r), gen_of(4), bad);
  std::unique_ptr<Generation> g2 = eng.begin(p2, sel_of(r2), gen_of(4));
  Generation* both[2] = {g1.get(), g2.get()};
  while (!g2->done()) eng.advance(both, 2);
  ASSERT_TRUE(g1->done());
  EXPECT_THROW(std::rethrow_exception(g1->error()), Broken);
  EXPECT_FALSE(g2->error());
  EXPECT_EQ(g2->answer().tokens, alone(eo, {r2}, 4)[0]);
}

}  // namespace
}  // namespace ct
