// The tokenizer on the real GGUFs against llama.cpp's ids in the committed fixtures
// (tools/make_tokenizer_fixture.py): SmolLM2 (tokenizer_smollm2.json) and both Qwen2.5 files
// (tokenizer_qwen2.5.json, one fixture for their shared vocabulary), plus round trips and the
// models' chat templates. Each case skips when its model file is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model_registry.h"
#include "core/paths.h"
#include "model/gguf.h"
#include "model/json_constraint.h"
#include "model/tokenizer.h"
#include "reuse/prompt.h"
#include "server/api.h"

namespace ct {
namespace {

std::string model_path() {
  if (const char* env = std::getenv("CACHETUNE_MODEL")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/cachetune/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// A case's input: "text", or "hex" for byte strings that are not valid UTF-8.
std::string case_text(const nlohmann::json& c) {
  if (!c.contains("hex")) return c.at("text").get<std::string>();
  const std::string hex = c.at("hex").get<std::string>();
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back((char)std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return bytes;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

nlohmann::json load_fixture(const std::string& name) {
  const std::string path = std::string(CT_FIXTURE_DIR) + "/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("version").get<int>(), 1) << path;
  return j;
}

struct TokenizerCase {
  const char* model;    // registry name
  const char* fixture;  // under tests/fixtures
};

void PrintTo(const TokenizerCase& c, std::ostream* os) { *os << c.model << " " << c.fixture; }

// llama.cpp's ids for >= 1,200 strings (slices of ../shared/data with non-ASCII text, digits and
// apostrophes, hand-written edge cases, special-token cases, invalid UTF-8), on each model.
class TokenizerVsLlamaCpp : public ::testing::TestWithParam<TokenizerCase> {
 protected:
  void SetUp() override {
    const std::string name = GetParam().model;
    const Installed in = model_install_state(require_model(model_registry(), name), models_dir());
    if (in.state == InstallState::kAbsent || in.state == InstallState::kWrongSize) {
      GTEST_SKIP() << name << " is not installed at " << in.path << " (cachetune pull " << name
                   << ")";
    }
    gguf_ = GgufFile::open(in.path);
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*gguf_));
    fixture_ = load_fixture(GetParam().fixture);
    bool listed = !fixture_.contains("models");
    if (!listed) {
      for (const auto& m : fixture_.at("models")) listed |= m.at("name") == name;
    }
    EXPECT_TRUE(listed) << GetParam().fixture << " was not made from " << name;
  }
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tok_;
  nlohmann::json fixture_;
};

TEST_P(TokenizerVsLlamaCpp, IdsMatchLlamaCpp) {
  const auto& cases = fixture_.at("cases");
  ASSERT_GE(cases.size(), 1200u);
  int n_bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = case_text(cases[i]);
    const bool special = cases[i].at("special").get<bool>();
    const auto expected = cases[i].at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok_->encode(text, special);
    if (got == expected) continue;
    if (++n_bad <= 20) {
      ADD_FAILURE() << "case " << i << " (special=" << special
                    << ") text: " << nlohmann::json(text).dump() << "\n  expected "
                    << ids_str(expected) << "\n  got      " << ids_str(got);
    }
  }
  EXPECT_EQ(n_bad, 0) << "of " << cases.size() << " cases differ from llama.cpp";
}

TEST_P(TokenizerVsLlamaCpp, DecodeInvertsEncode) {
  int n_bad = 0;
  for (const auto& c : fixture_.at("cases")) {
    // Byte cases are left out: llama.cpp replaces or drops some of their bytes.
    if (c.at("special").get<bool>() || c.contains("hex")) continue;
    const std::string text = c.at("text").get<std::string>();
    const std::string back = tok_->decode(tok_->encode(text, false));
    if (back != text && ++n_bad <= 20) {
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << "\n decoded to "
                    << nlohmann::json(back).dump();
    }
  }
  EXPECT_EQ(n_bad, 0);
}

// Conversations with tools, tool calls and tool results as Qwen2.5's own template renders them
// (jinja2 over each GGUF's template, which differ: tools/make_chat_fixture.py), against
// apply_chat_template and the prompt builder; and the template's tojson against
// server::template_json.
TEST_P(TokenizerVsLlamaCpp, ToolTurnsMatchTheModelsTemplate) {
  if (std::string(GetParam().model).rfind("qwen2.5", 0) != 0) GTEST_SKIP() << "no tool form";
  ASSERT_TRUE(tok_->supports_tools());
  // Read with the keys in the file's order: that order is what the template shows.
  std::ifstream in(std::string(CT_FIXTURE_DIR) + "/chat_tools_" + GetParam().model + ".json");
  ASSERT_TRUE(in.good());
  const nlohmann::ordered_json fx = nlohmann::ordered_json::parse(in);
  ASSERT_GE(fx.at("cases").size(), 5u);
  for (const auto& c : fx.at("cases")) {
    std::vector<ChatMessage> msgs;
    for (const auto& m : c.at("messages")) {
      ChatMessage cm(m.at("role").get<std::string>(), m.at("content").get<std::string>());
      if (m.contains("tool_calls")) {
        for (const auto& t : m.at("tool_calls"))
          cm.tool_calls.push_back(
              {t.at("name").get<std::string>(), t.at("arguments").get<std::string>()});
      }
      msgs.push_back(std::move(cm));
    }
    const auto tools = c.at("tools").get<std::vector<std::string>>();
    const std::string want = c.at("rendered").get<std::string>();
    EXPECT_EQ(tok_->apply_chat_template(msgs, true, tools), want);
    // The prompt builder splices the same text (the last message as the question).
    ToolTurns tt{tools, msgs.back().role};
    const std::string question = msgs.back().content;
    msgs.pop_back();
    const RagPromptTokens p = build_rag_prompt(*tok_, {}, question, "", msgs, tt);
    std::vector<int32_t> ids = p.prefix;
    ids.insert(ids.end(), p.query.begin(), p.query.end());
    EXPECT_EQ(tok_->decode(ids, true), want);
    // Tool definitions in the client's key order, as the template's tojson writes them.
    for (size_t i = 0; i < tools.size(); ++i)
      EXPECT_EQ(server::template_json(c.at("tool_objects")[i]), tools[i]);
  }
  ASSERT_GE(fx.at("json").size(), 3u);
  for (const auto& v : fx.at("json")) {
    EXPECT_EQ(server::template_json(v.at("value")), v.at("text").get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, TokenizerVsLlamaCpp,
    ::testing::Values(TokenizerCase{"smollm2-135m", "tokenizer_smollm2.json"},
                      TokenizerCase{"qwen2.5-coder-0.5b", "tokenizer_qwen2.5.json"},
                      TokenizerCase{"qwen2.5-coder-1.5b", "tokenizer_qwen2.5.json"}),
    [](const ::testing::TestParamInfo<TokenizerCase>& i) {
      std::string s = i.param.model;
      for (char& ch : s) {
        if (!isalnum((unsigned char)ch)) ch = '_';
      }
      return s;
    });

class TokenizerRefTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = model_path();
    if (!std::filesystem::exists(path)) return;
    gguf_ = GgufFile::open(path).release();
    tok_ = new Tokenizer(Tokenizer::from_gguf(*gguf_));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete gguf_;
    tok_ = nullptr;
    gguf_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << "model file not found: " << model_path();
  }

  static GgufFile* gguf_;
  static Tokenizer* tok_;
};

GgufFile* TokenizerRefTest::gguf_ = nullptr;
Tokenizer* TokenizerRefTest::tok_ = nullptr;

TEST_F(TokenizerRefTest, VocabularyMatchesSmolLM2) {
  EXPECT_EQ(tok_->n_vocab(), 49152);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->find_token("<|im_start|>"), 1);
  EXPECT_EQ(tok_->find_token("<|im_end|>"), 2);
  EXPECT_TRUE(tok_->is_eog(tok_->eos()));
  EXPECT_TRUE(tok_->is_eog(2));
  EXPECT_TRUE(tok_->is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_eog(1));
}

// JSON output's vocabulary trie on a real vocabulary (49,152 tokens, multi-byte pieces): after
// each prefix it allows exactly the tokens whose bytes continue the text, checked token by token.
TEST_F(TokenizerRefTest, JsonTrieAllowsExactlyTheTokensThatContinueTheText) {
  const VocabTrie trie(*tok_);
  for (const std::string prefix : {"", " {", "{\n  \"na", "{\"a\": ", "{\"a\": -1", "{\"a\": [tr",
                                   "{\"a\": \"caf\xc3", "{\"a\": \"\\u00", "{\"a\": {}, "}) {
    SCOPED_TRACE(prefix);
    JsonRecognizer r;
    ASSERT_TRUE(r.feed(prefix));
    std::vector<uint8_t> got(tok_->n_vocab(), 0);
    const int n = trie.allow(r, got);
    int want_n = 0, wrong = 0;
    for (int32_t id = 0; id < tok_->n_vocab(); ++id) {
      const std::string piece = tok_->token_to_piece(id);
      JsonRecognizer c = r;
      const bool want = !tok_->is_eog(id) && !piece.empty() && c.feed(piece);
      want_n += want;
      wrong += (got[id] != 0) != want;
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(n, want_n);
    EXPECT_GT(n, 0);
  }
}

TEST_F(TokenizerRefTest, ChatTemplateMatchesTheGgufTemplate) {
  EXPECT_EQ(
      tok_->apply_chat_template(
          {{"system", "You are terse."}, {"user", "What is 2+2?"}, {"assistant", "4"}}, false),
      "<|im_start|>system\nYou are terse.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      "<|im_start|>assistant\n4<|im_end|>\n");
  const std::string user_only = tok_->apply_chat_template({{"user", "Hello!"}}, true);
  EXPECT_EQ(user_only,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n"
            "<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\n");

  const std::vector<int32_t> ids = tok_->encode(user_only, true);
  const int32_t im_start = tok_->find_token("<|im_start|>"),
                im_end = tok_->find_token("<|im_end|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 2);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(tok_->decode(ids, true), user_only);
  // Without parse_special the markers are plain text.
  const std::vector<int32_t> plain = tok_->encode(user_only, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
}

}  // namespace
}  // namespace ct
