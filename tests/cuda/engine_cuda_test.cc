// The engine with --device cuda (EngineOptions::cuda) on a tiny random model: a cachetune answer
// computed and decoded on the GPU equals the CPU engine's (greedy, same chunks), and so do the
// token-stage policies' (lfonly; prefix caching, its second request reusing the first's prefix);
// the layer-loop policies that need taps (CacheBlend, ProphetKV) run on the GPU with the same
// budget; and several requests decode on the GPU together, one sequence slot each. Skipped
// without a device.
#include <gtest/gtest.h>

#include "engine/calibration.h"
#include "engine/engine.h"
#include "reuse/freq_rank.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

const std::vector<std::string> kDocs = {
    "The lighthouse on Gull Point was built in 1871 and painted red and white in 1903.",
    "Marta Olsen kept the lighthouse for forty years and wrote a diary of every storm."};

// A tiny random model with a 512-token context over one host tier.
EngineOptions tiny_engine_options(const test::TempDir& dir) {
  test::TinyModelOptions o;
  o.context_length = 512;
  EngineOptions eo;
  eo.model_path = test::write_tiny_model(dir.path() + "/m.gguf", o);
  eo.tiers = {parse_tier_spec("host:64M")};
  // The device keeps F32 K/V; the CPU side of each comparison does too (an F16 host cache's
  // rounding could flip a near-tie of the random model's greedy choice).
  eo.kv_type = KvDtype::F32;
  return eo;
}

TEST(CudaEngine, GpuAnswersEqualCpuAnswers) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  EngineOptions eo = tiny_engine_options(dir);
  Engine cpu(eo);
  eo.cuda = true;
  Engine gpu(eo);
  EXPECT_EQ(gpu.gpu_ctx(), 512);
  GenerateOptions gen;
  gen.max_tokens = 10;
  gen.stop_at_eog = false;
  // CacheBlend's and ProphetKV's selection can differ from the CPU's at the cut
  // (taps_cuda_test.cc), so for them only the device and the budget are compared.
  // prefix twice, lfonly between: the second prefix answer reuses the first's cached prefix,
  // whose rows must go up to the device (lfonly left other rows there). The token-stage
  // policies' logits match the CPU's like kChunk ones.
  int prefix_answers = 0;
  for (const char* name :
       {"cachetune", "full", "reuse", "cacheblend", "prophetkv", "prefix", "lfonly", "prefix"}) {
    SCOPED_TRACE(name);
    const PolicyStage stage = find_policy(name).stage();
    const bool exact = stage == PolicyStage::kChunk || stage == PolicyStage::kTokens;
    const bool prefix_hit = find_policy(name).uses_prefix_cache() && ++prefix_answers == 2;
    SelectiveOptions sel;
    sel.policy.kind = &find_policy(name);
    const Answer a = cpu.answer(kDocs, "Who kept it?", sel, gen);
    const Answer b = gpu.answer(kDocs, "Who kept it?", sel, gen);
    EXPECT_EQ(a.device, "cpu");
    EXPECT_EQ(b.device, "cuda");
    EXPECT_EQ(b.prefill.n_active, a.prefill.n_active);
    EXPECT_EQ(b.prefill.n_loaded, a.prefill.n_loaded);
    if (prefix_hit) {
      EXPECT_GT(b.prefill.n_loaded, 0);
    }
    EXPECT_EQ(b.tokens.size(), a.tokens.size());
    if (exact) {
      EXPECT_EQ(b.tokens, a.tokens);
      EXPECT_EQ(b.text, a.text);
    }
  }
}

// Several requests on the GPU at once (EngineOptions::gpu_seqs): each prefills into a sequence
// slot of its own, and their decode rows run as one batched step (decode_batch). Greedy answers
// equal the CPU engine's for each request alone; a request arriving while every slot is taken
// runs on the CPU, and a finished request's slot goes to the next one.
TEST(CudaEngine, ConcurrentGpuRequestsDecodeTogetherAndMatchTheCpu) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  EngineOptions eo = tiny_engine_options(dir);
  Engine cpu(eo);
  eo.cuda = true;
  eo.gpu_seqs = 2;
  Engine gpu(eo);
  ASSERT_EQ(gpu.device()->n_seq(), 2);
  const Tokenizer& tok = gpu.model().tokenizer();
  const std::vector<std::string> questions = {"Who kept it?", "When was it built?",
                                              "What colour is it?"};
  const std::vector<int> lengths = {7, 11, 5};
  SelectiveOptions sel;
  sel.policy.kind = &find_policy("cachetune");
  auto gen_of = [](int n) {
    GenerateOptions g;
    g.max_tokens = n;
    g.stop_at_eog = false;
    return g;
  };
  std::vector<std::unique_ptr<Generation>> gs;
  std::vector<Generation*> ptrs;
  for (size_t i = 0; i < questions.size(); ++i) {
    gs.push_back(gpu.begin(build_rag_prompt(tok, kDocs, questions[i]), sel, gen_of(lengths[i])));
    ptrs.push_back(gs.back().get());
  }
  EXPECT_EQ(gs[0]->answer().device, "cuda");
  EXPECT_EQ(gs[1]->answer().device, "cuda");
  EXPECT_EQ(gs[2]->answer().device, "cpu");  // both slots taken
  const StepRows first = gpu.advance(ptrs.data(), 3);
  EXPECT_EQ(first.decode, 3);  // two GPU rows in one batch, one CPU row
  while (!gs[0]->done() || !gs[1]->done() || !gs[2]->done()) gpu.advance(ptrs.data(), 3);
  for (size_t i = 0; i < questions.size(); ++i) {
    SCOPED_TRACE(questions[i]);
    ASSERT_FALSE(gs[i]->error());
    const Answer want = cpu.answer(kDocs, questions[i], sel, gen_of(lengths[i]));
    EXPECT_EQ(gs[i]->answer().tokens, want.tokens);
  }
  // The finished requests gave their slots back.
  std::unique_ptr<Generation> again =
      gpu.begin(build_rag_prompt(tok, kDocs, questions[2]), sel, gen_of(lengths[2]));
  EXPECT_EQ(again->answer().device, "cuda");
  Generation* one = again.get();
  while (!again->done()) gpu.advance(&one, 1);
  EXPECT_EQ(again->answer().tokens, gs[2]->answer().tokens);
}

// A GPU engine's options with a calibration store in dir.
EngineOptions gpu_options_with_store(const test::TempDir& dir) {
  EngineOptions eo = tiny_engine_options(dir);
  eo.calibration_path = dir.path() + "/calibration.json";
  eo.cuda = true;
  return eo;
}

// One token of a cachetune answer over kDocs.
Answer first_token(Engine& eng) {
  GenerateOptions gen;
  gen.max_tokens = 1;
  SelectiveOptions sel;
  sel.policy.kind = &find_policy("cachetune");
  return eng.answer(kDocs, "Who kept it?", sel, gen);
}

// --ratio auto on the GPU looks up the GPU's calibration: a stored CPU entry for the same tier
// must not be used (engine.cc wrote "cpu" into every key before).
TEST(CudaEngine, AutoRatioOnTheGpuUsesTheCudaCalibration) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  EngineOptions eo = gpu_options_with_store(dir);
  eo.auto_ratio = true;
  Engine gpu(eo);
  sched::CalibrationStore store;
  sched::CalibrationEntry cpu_entry;
  cpu_entry.key = gpu.calibration_key(0, "cpu");
  cpu_entry.chosen_r = 0.5;
  store.store(cpu_entry);
  store.save(eo.calibration_path);
  const Answer a = first_token(gpu);
  EXPECT_EQ(a.device, "cuda");
  EXPECT_EQ(a.ratio, eo.r_min) << a.ratio_note;
  EXPECT_NE(a.ratio_note.find("cuda backend"), std::string::npos) << a.ratio_note;
}

// `cachetune calibrate --device cuda`: the profile and the TTFT search run on the GPU, the entry
// is stored under the "cuda" key (not "cpu"), and --ratio auto on the GPU then uses it.
TEST(CudaEngine, CalibrationOnTheGpuStoresTheCudaKeyAndAutoRatioUsesIt) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  EngineOptions eo = gpu_options_with_store(dir);
  Engine gpu(eo);
  EXPECT_EQ(gpu.backend_name(), "cuda");
  const std::vector<CalibrationRequest> reqs = {{kDocs, "Who kept it?"},
                                                {{kDocs[1], kDocs[0]}, "When was it built?"}};
  CalibrateOptions co;
  co.r_min = 0.15;
  co.r_max = 0.5;
  co.eps = 0.05;
  co.noise = 0;
  co.profile.repeats = 1;
  const CalibrationRun run = calibrate_top_tier(gpu, reqs, co);
  EXPECT_FALSE(run.reused);
  EXPECT_EQ(run.entry.key.backend, "cuda");
  EXPECT_GT(run.search.n_eval, 0);
  for (const sched::CostSample& x : CalibrationWorkload(gpu, reqs).profile().compute)
    EXPECT_GT(x.seconds, 0);
  const sched::CalibrationStore store = sched::CalibrationStore::load_or_empty(eo.calibration_path);
  EXPECT_NE(store.find(gpu.calibration_key(0, "cuda")), nullptr);
  EXPECT_EQ(store.find(gpu.calibration_key(0, "cpu")), nullptr);

  eo.auto_ratio = true;
  Engine again(eo);
  const Answer a = first_token(again);
  EXPECT_EQ(a.device, "cuda");
  EXPECT_DOUBLE_EQ(a.ratio, run.entry.chosen_r) << a.ratio_note;
}

}  // namespace
}  // namespace ct
