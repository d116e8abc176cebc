// Architectures as data (model/arch.h): every row of the table loads a tiny model written under
// its name with its RoPE style and bias rule; the bias rule is enforced (required biases missing
// is refused, optional ones are used when present); an unknown architecture names every known one.
#include "model/arch.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cpu_forward.h"
#include "core/error.h"
#include "model/model.h"
#include "support/random_data.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

std::string tiny(const std::string& name, const test::TinyModelOptions& o) {
  const std::string path = (fs::temp_directory_path() / ("ct_arch_" + name + ".gguf")).string();
  test::write_tiny_model(path, o);
  return path;
}

std::vector<float> logits_of(const Model& m) {
  const auto toks = test::random_byte_tokens(9, 5);
  KVCache kv = m.make_cache((int)toks.size());
  Workspace ws;
  return cpu::prefill(m, toks.data(), (int)toks.size(), 0, kv, ws);
}

TEST(ArchTable, EveryRowLoadsWithItsTraits) {
  ASSERT_GE(all_archs().size(), 3u);
  for (const ArchTraits* a : all_archs()) {
    SCOPED_TRACE(a->name);
    test::TinyModelOptions o;
    o.arch = a->name;
    o.qkv_bias = a->qkv_bias == BiasRule::kRequired;
    auto m = Model::load(tiny(a->name, o));
    EXPECT_EQ(m->config().traits, a);
    EXPECT_EQ(m->config().arch, a->name);
    EXPECT_EQ(m->config().rope_style, a->rope_style);
    EXPECT_EQ(m->config().has_qkv_bias, a->qkv_bias == BiasRule::kRequired);
    EXPECT_EQ(&find_arch(a->name, "x"), a);
  }
}

TEST(ArchTable, RequiredBiasesMissingAreRefusedNamingTheTensor) {
  test::TinyModelOptions o;
  o.arch = "qwen2";
  o.qkv_bias = false;
  const std::string path = tiny("qwen2_nobias", o);
  try {
    Model::load(path);
    FAIL() << "a qwen2 file without biases loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.bias"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(ArchTable, OptionalBiasesAreUsedWhenPresent) {
  test::TinyModelOptions o;
  o.arch = "llama";
  o.qkv_bias = true;
  auto with = Model::load(tiny("llama_bias", o));
  o.qkv_bias = false;
  auto without = Model::load(tiny("llama_nobias", o));
  EXPECT_TRUE(with->config().has_qkv_bias);
  EXPECT_FALSE(without->config().has_qkv_bias);
  const ModelConfig& c = with->config();
  EXPECT_EQ(with->layer_weights(0).bqkv.size(), (size_t)(c.q_dim() + 2 * c.kv_dim()));
  EXPECT_TRUE(without->layer_weights(0).bqkv.empty());
  // Both run (the bias path of the projections is the one the Qwen2 reference tests check).
  EXPECT_EQ(logits_of(*with).size(), (size_t)c.n_vocab);
}

TEST(ArchTable, AnUnknownArchitectureNamesTheKnownOnes) {
  try {
    find_arch("gptj", "model.gguf");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'gptj'"), std::string::npos) << msg;
    for (const ArchTraits* a : all_archs()) EXPECT_NE(msg.find(a->name), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ct
