// The decoder on tiny random models: the fast path against the plain-loop reference forward for
// several weight types and both architectures, batched prefill against token-by-token decode,
// sampling, and load errors that name the file, tensor and expectation.
#include "model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "model/generate.h"
#include "model/gguf.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ct_model_test_" + name)).string();
}

std::vector<float> prefill_all(const Model& m, const std::vector<int32_t>& t, bool ref) {
  KVCache kv = m.make_cache((int)t.size());
  Workspace ws;
  ws.use_reference = ref;
  return m.prefill(t.data(), (int)t.size(), 0, kv, ws, /*all_rows=*/true);
}

struct ModelCase {
  std::string arch;
  GgmlType type;
  bool tied;
};

class ModelForwardTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelForwardTest, FastPathMatchesReference) {
  const ModelCase c = GetParam();
  test::TinyModelOptions o;
  o.arch = c.arch;
  o.weight_type = c.type;
  o.tied_output = c.tied;
  const std::string path = tmp_path(c.arch + ggml_type_name(c.type) + (c.tied ? "t" : "u"));
  test::write_tiny_model(path, o);
  auto m = Model::load(path);
  EXPECT_EQ(m->config().has_qkv_bias, c.arch == "qwen2");
  EXPECT_EQ(m->config().tied_output, c.tied);
  const auto t = test::random_byte_tokens(70, 1);
  const auto fast = prefill_all(*m, t, false), ref = prefill_all(*m, t, true);
  float worst = 0, scale = 0;
  for (size_t i = 0; i < fast.size(); ++i) {
    worst = std::max(worst, std::fabs(fast[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  EXPECT_LT(worst, 1e-4f * std::max(1.0f, scale)) << "scale " << scale;
}

INSTANTIATE_TEST_SUITE_P(Types, ModelForwardTest,
                         ::testing::Values(ModelCase{"llama", GgmlType::F32, true},
                                           ModelCase{"llama", GgmlType::F16, false},
                                           ModelCase{"llama", GgmlType::Q8_0, true},
                                           ModelCase{"llama", GgmlType::Q4_1, true},
                                           ModelCase{"llama", GgmlType::Q4_0, false},
                                           ModelCase{"qwen2", GgmlType::F32, true},
                                           ModelCase{"qwen2", GgmlType::BF16, false}));

TEST(ModelTest, IncrementalDecodeMatchesBatchedPrefill) {
  const std::string path = tmp_path("incr.gguf");
  test::write_tiny_model(path, {});
  auto m = Model::load(path);
  const auto t = test::random_byte_tokens(40, 2);
  const auto batch = prefill_all(*m, t, false);
  KVCache kv = m->make_cache((int)t.size());
  Workspace ws;
  const int V = m->config().n_vocab;
  for (int i = 0; i < (int)t.size(); ++i) {
    const auto step = m->prefill(&t[i], 1, i, kv, ws);
    for (int j = 0; j < V; ++j) {
      ASSERT_NEAR(step[j], batch[(size_t)i * V + j], 1e-4f) << "position " << i;
    }
  }
  // Odd split: 17 tokens then 23.
  KVCache kv2 = m->make_cache((int)t.size());
  m->prefill(t.data(), 17, 0, kv2, ws);
  const auto tail = m->prefill(t.data() + 17, 23, 17, kv2, ws);
  for (int j = 0; j < V; ++j) ASSERT_NEAR(tail[j], batch[(size_t)39 * V + j], 1e-4f);
}

TEST(ModelTest, PackedDecodePathMatchesBatchedPrefill) {
  // Single-row steps of a quantised model read the packed GGUF blocks (cpu::qgemv); they must
  // agree with the batched F32 path on the same dequantised weights.
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0}) {
    test::TinyModelOptions o;
    o.weight_type = t;
    o.token_embd_type = GgmlType::Q8_0;
    const std::string path = tmp_path(std::string("packed_") + ggml_type_name(t) + ".gguf");
    test::write_tiny_model(path, o);
    auto m = Model::load(path);
    const auto tk = test::random_byte_tokens(24, 5);
    const auto batch = prefill_all(*m, tk, false);
    KVCache kv = m->make_cache((int)tk.size());
    Workspace ws;
    const int V = m->config().n_vocab;
    float worst = 0;
    for (int i = 0; i < (int)tk.size(); ++i) {
      const auto step = m->prefill(&tk[i], 1, i, kv, ws);
      for (int j = 0; j < V; ++j)
        worst = std::max(worst, std::fabs(step[j] - batch[(size_t)i * V + j]));
    }
    EXPECT_LT(worst, 1e-3f) << ggml_type_name(t);
  }
}

TEST(ModelTest, GreedyDecodeIsDeterministicAndSamplingIsSeeded) {
  const std::string path = tmp_path("dec.gguf");
  test::write_tiny_model(path, {});
  auto m = Model::load(path);
  const auto t = test::random_byte_tokens(12, 3);
  auto gen = [&](SamplingParams sp) {
    KVCache kv = m->make_cache(64);
    Workspace ws;
    auto logits = m->prefill(t.data(), (int)t.size(), 0, kv, ws);
    GenerateOptions o;
    o.max_tokens = 20;
    o.stop_at_eog = false;
    o.sampling = sp;
    return decode(*m, kv, ws, logits, o).tokens;
  };
  EXPECT_EQ(gen({}), gen({}));
  EXPECT_EQ(gen({}).size(), 20u);
  SamplingParams s1{1.0f, 0, 1.0f, 42}, s2{1.0f, 0, 1.0f, 43};
  EXPECT_EQ(gen(s1), gen(s1));
  EXPECT_NE(gen(s1), gen(s2));
}

TEST(SamplerTest, TopKOneIsGreedyAndTopPKeepsTheNucleus) {
  std::vector<float> logits = {0.0f, 5.0f, 4.9f, -3.0f};
  Sampler greedy({0.0f, 0, 1.0f, 1});
  EXPECT_EQ(greedy.sample(logits.data(), 4), 1);
  Sampler k1({1.0f, 1, 1.0f, 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(logits.data(), 4), 1);
  Sampler p({1.0f, 0, 0.9f, 7});
  for (int i = 0; i < 200; ++i) {
    const int id = p.sample(logits.data(), 4);
    EXPECT_TRUE(id == 1 || id == 2) << id;
  }
}

TEST(ModelLoadErrors, NameTheFileTensorAndExpectation) {
  // A tensor of a type the engine cannot convert.
  {
    test::TinyModelOptions o;
    const std::string path = tmp_path("badtype.gguf");
    test::write_tiny_model(path, o);
    // Rewrite one matrix with an unsupported type code by building a fresh file.
    auto f = GgufFile::open(path);
    GgufWriter w;
    for (const auto& [k, v] : f->metadata()) w.set_value(k, v);
    for (const auto& t : f->tensors()) {
      if (t.name == "blk.1.ffn_up.weight") {
        std::vector<uint8_t> junk(t.nbytes / 2, 0);
        w.add_tensor_raw(t.name, (uint32_t)GgmlType::Q5_0, t.ne, junk.data(),
                         (size_t)t.n_rows() * (t.ne[0] / 32) * 22);
      } else {
        w.add_tensor_raw(t.name, (uint32_t)t.type, t.ne, t.data, t.nbytes);
      }
    }
    const std::string bad = tmp_path("badtype2.gguf");
    w.write(bad);
    try {
      Model::load(bad);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(bad), std::string::npos) << msg;
      EXPECT_NE(msg.find("blk.1.ffn_up.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("q5_0"), std::string::npos) << msg;
    }
  }
  // A missing tensor.
  {
    const std::string path = tmp_path("missing.gguf");
    test::write_tiny_model(path, {});
    auto f = GgufFile::open(path);
    GgufWriter w;
    for (const auto& [k, v] : f->metadata()) w.set_value(k, v);
    for (const auto& t : f->tensors()) {
      if (t.name != "blk.2.attn_v.weight") {
        w.add_tensor_raw(t.name, (uint32_t)t.type, t.ne, t.data, t.nbytes);
      }
    }
    const std::string bad = tmp_path("missing2.gguf");
    w.write(bad);
    try {
      Model::load(bad);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("blk.2.attn_v.weight"), std::string::npos) << e.what();
    }
  }
  // A missing required key.
  {
    const std::string path = tmp_path("nokey.gguf");
    test::write_tiny_model(path, {});
    auto f = GgufFile::open(path);
    GgufWriter w;
    for (const auto& [k, v] : f->metadata()) {
      if (k != "llama.embedding_length") w.set_value(k, v);
    }
    for (const auto& t : f->tensors()) {
      w.add_tensor_raw(t.name, (uint32_t)t.type, t.ne, t.data, t.nbytes);
    }
    const std::string bad = tmp_path("nokey2.gguf");
    w.write(bad);
    try {
      Model::load(bad);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("llama.embedding_length"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace ct
