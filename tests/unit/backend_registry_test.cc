// The backend registry: "cpu" is always built; without CUDA every GPU entry point (the decoder
// from a model, the ranking's band norms, an engine with --device cuda) fails with the one
// "no CUDA backend" message, and with CUDA the registry says so. No build flag is tested here.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"
#include "backend/cuda/band_norms.h"
#include "backend/gpu_decoder.h"
#include "backend/registry.h"
#include "core/error.h"
#include "engine/engine.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

TEST(BackendRegistry, CpuIsAlwaysBuiltAndAvailable) {
  EXPECT_TRUE(backend::backend_built("cpu"));
  EXPECT_TRUE(backend::backend_available("cpu"));
  EXPECT_FALSE(backend::backend_built("tpu"));
  EXPECT_FALSE(backend::backend_available("tpu"));
  EXPECT_EQ(backend::built_backends().front(), "cpu");
  // Available implies built.
  EXPECT_TRUE(!backend::backend_available("cuda") || backend::backend_built("cuda"));
}

TEST(BackendRegistry, WithoutCudaEveryGpuEntryPointNamesTheMissingBackend) {
  if (backend::backend_built("cuda")) GTEST_SKIP() << "a CUDA build: tests/cuda covers the GPU";
  EXPECT_EQ(backend::built_backends(), (std::vector<std::string>{"cpu"}));
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const float x = 1;
  EXPECT_NE(message_of([&] {
              backend::cuda_band_norms({&x}, 1, 1, true, 0, 1);
            }).find(backend::kNoCudaMessage),
            std::string::npos);
  EXPECT_NE(message_of([&] { cuda::BandNorms bn(2, 8, 4); }).find(backend::kNoCudaMessage),
            std::string::npos);
  EXPECT_EQ(cuda::device_count(), 0);
  test::TempDir dir;
  const std::string model = test::write_tiny_model(dir.path() + "/m.gguf", {});
  const auto m = Model::load(model);
  EXPECT_NE(message_of([&] { make_cuda_decoder(*m, 16); }).find(backend::kNoCudaMessage),
            std::string::npos);
  EXPECT_NE(message_of([&] { make_device("cuda", *m, 16); }).find(backend::kNoCudaMessage),
            std::string::npos);
  EngineOptions eo;
  eo.model_path = model;
  eo.tiers = {parse_tier_spec("host:16M")};
  eo.cuda = true;
  const std::string e = message_of([&] { Engine eng(eo); });
  EXPECT_NE(e.find("--device cuda: this build has no CUDA backend"), std::string::npos) << e;
}

// The device seam names what it takes: "cuda" is the one device sequence; any other name is
// refused in every build, naming the value.
TEST(BackendRegistry, AnUnknownDeviceIsRefusedByName) {
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", {}));
  for (const char* name : {"cpu", "tpu", ""}) {
    try {
      make_device(name, *m, 16);
      ADD_FAILURE() << "made device '" << name << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("device '") + name + "': expected cuda"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace ct
