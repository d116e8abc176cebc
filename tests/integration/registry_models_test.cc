// The registry's real models, when installed (label "model"; each case skips without its file):
// their hyper-parameters read as expected, including no RoPE scaling for Qwen2.5 (rope base 1e6,
// NEOX rotation, Q/K/V biases). Only the GGUF header and config are read, so this holds before
// the engine can load every tensor type the files use.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/model_registry.h"
#include "core/paths.h"
#include "model/config.h"
#include "model/gguf.h"

namespace ct {
namespace {

struct Expect {
  const char* name;
  const char* arch;
  int n_layer, n_embd, n_head, n_head_kv;
  float rope_theta;
  bool qkv_bias;
};

class RegistryModelTest : public ::testing::TestWithParam<Expect> {};

TEST_P(RegistryModelTest, InstalledFileHasTheExpectedConfig) {
  const Expect& x = GetParam();
  const auto reg = model_registry();
  const Installed in = model_install_state(require_model(reg, x.name), models_dir());
  if (in.state == InstallState::kAbsent) {
    GTEST_SKIP() << x.name << " is not installed (cachetune pull " << x.name << ")";
  }
  ASSERT_NE(in.state, InstallState::kWrongSize) << in.path;
  auto f = GgufFile::open(in.path);
  const ModelConfig c = ModelConfig::from_gguf(*f);
  EXPECT_EQ(c.arch, x.arch);
  EXPECT_EQ(c.n_layer, x.n_layer);
  EXPECT_EQ(c.n_embd, x.n_embd);
  EXPECT_EQ(c.n_head, x.n_head);
  EXPECT_EQ(c.n_head_kv, x.n_head_kv);
  EXPECT_FLOAT_EQ(c.rope_theta, x.rope_theta);
  EXPECT_EQ(c.has_qkv_bias, x.qkv_bias);
  EXPECT_EQ(c.rope_style == cpu::RopeStyle::kNeox, std::string(x.arch) == "qwen2");
  EXPECT_FLOAT_EQ(c.rope_freq_scale, 1.0f);
  EXPECT_TRUE(c.rope_freq_factors.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Registry, RegistryModelTest,
    ::testing::Values(Expect{"smollm2-135m", "llama", 30, 576, 9, 3, 100000.0f, false},
                      Expect{"qwen2.5-coder-0.5b", "qwen2", 24, 896, 14, 2, 1e6f, true},
                      Expect{"qwen2.5-coder-1.5b", "qwen2", 28, 1536, 12, 2, 1e6f, true}),
    [](const ::testing::TestParamInfo<Expect>& i) {
      std::string s = i.param.name;
      for (auto& ch : s) {
        if (!isalnum((unsigned char)ch)) ch = '_';
      }
      return s;
    });

}  // namespace
}  // namespace ct
