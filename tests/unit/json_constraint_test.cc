// JSON output: the recognizer against nlohmann::json (an independent parser) on fixed and random
// texts, the vocabulary trie against a check of every token, and the sampler and engine with the
// json_object constraint on a tiny random model.
#include "model/json_constraint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "model/sampler.h"
#include "support/json_test_support.h"

namespace ct {
namespace {

bool accepts(const std::string& s, bool object_only = true) {
  JsonRecognizer r(object_only);
  return r.feed(s) && r.complete();
}

// The index of the first byte the recognizer refuses, or -1.
int first_refused(const std::string& s, bool object_only = true) {
  JsonRecognizer r(object_only);
  for (size_t i = 0; i < s.size(); ++i) {
    if (!r.feed((uint8_t)s[i])) return (int)i;
  }
  return -1;
}

TEST(JsonRecognizer, AcceptsWholeObjectsAndEveryPrefixOfThem) {
  const std::vector<std::string> docs = {
      "{}",
      " { } ",
      R"({"a": 1})",
      R"({"a": -0.5e+10, "b": [true, false, null, 0, 12, 1.25E-3], "c": {"d": ""}})",
      R"({"s": "tab\t quote\" slash\/ back\\ \u00e9\uD83D\uDE00 \b\f\n\r"})",
      "{\"utf8\": \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf\"}",
      R"({"nested": [[[{"x": [[]]}]]], "e": [], "o": {}})",
      "{\n  \"pretty\": [\n    1,\n    2\n  ]\n}",
  };
  for (const std::string& d : docs) {
    SCOPED_TRACE(d);
    EXPECT_TRUE(nlohmann::json::parse(d).is_object());  // the reference agrees
    JsonRecognizer r;
    for (size_t i = 0; i < d.size(); ++i) {
      ASSERT_TRUE(r.feed((uint8_t)d[i])) << "byte " << i;
      // Complete exactly once the closing brace is in (then only whitespace may follow).
      const bool closed = d.find_last_of('}') <= i;
      EXPECT_EQ(r.complete(), closed) << "byte " << i;
    }
  }
}

TEST(JsonRecognizer, RefusesTheFirstByteNoJsonCouldContinue) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"[1]", 0},                      // json_object: the top level is an object
      {"\"s\"", 0},
      {"{a:1}", 1},                    // keys are strings
      {R"({"a" 1})", 5},               // a colon first
      {R"({"a": 01})", 7},             // no leading zeros
      {R"({"a": 1.})", 8},             // a digit after the point
      {R"({"a": 1e})", 8},             // a digit in the exponent
      {R"({"a": -})", 7},
      {R"({"a": .5})", 6},
      {R"({"a": +1})", 6},
      {R"({"a": tru})", 9},
      {R"({"a": nul1})", 9},
      {R"({"a": 1,})", 8},             // no trailing comma
      {R"({"a": [1,]})", 9},
      {R"({"a": [1}})", 8},            // brackets match
      {R"({"a": "\x"})", 8},           // unknown escape
      {R"({"a": "\uDC00"})", 10},      // a low surrogate alone
      {R"({"a": "\uD83D"})", 13},      // a high one not followed by a low one's escape
      {R"({"a": "\uD83D\n"})", 14},
      {R"({"a": "\uD83D\u0041"})", 15},
      {R"({"a": "\u12G4"})", 11},
      {"{\"a\": \"\x01\"}", 7},        // raw control character
      {"{\"a\": \"\xc3\x28\"}", 8},    // a continuation byte missing
      {"{\"a\": \"\xc0\xaf\"}", 7},    // overlong
      {"{\"a\": \"\xed\xa0\x80\"}", 8}, // a UTF-16 surrogate in UTF-8
      {"{\"a\": \"\xf4\x90\x80\x80\"}", 8}, // above U+10FFFF
      {"{} x", 3},                     // nothing after the object but whitespace
      {"{}{}", 2},
  };
  for (const auto& [text, at] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(first_refused(text), at);
    EXPECT_FALSE(accepts(text));
    EXPECT_THROW((void)nlohmann::json::parse(text).get<nlohmann::json::object_t>(),
                 nlohmann::json::exception);
  }
  // A refused byte leaves the state as it was.
  JsonRecognizer r;
  ASSERT_TRUE(r.feed(R"({"a": 1)"));
  EXPECT_FALSE(r.feed('x'));
  EXPECT_TRUE(r.feed('}'));
  EXPECT_TRUE(r.complete());
}

TEST(JsonRecognizer, BoundsDepthAndWhitespaceRuns) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonRecognizer::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(first_refused(deep + "["), (int)deep.size());
  for (int i = 1; i < JsonRecognizer::kMaxDepth; ++i) deep += "]";
  EXPECT_TRUE(accepts(deep + "}"));
  const std::string pad(JsonRecognizer::kMaxSpaces, ' ');
  EXPECT_TRUE(accepts("{" + pad + "\"a\":" + pad + "1" + pad + "}"));
  EXPECT_EQ(first_refused("{" + pad + " "), 1 + JsonRecognizer::kMaxSpaces);
  EXPECT_TRUE(accepts("{\"a\": \"" + pad + pad + "\"}"));  // inside a string it is text
}

// Random JSON text, valid by construction (nlohmann serialises it, sometimes indented).
nlohmann::json random_value(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 4 ? 4 : 6);
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return (int64_t)(rng() % 2000) - 1000;
    case 3: return std::ldexp((double)(rng() % 100000) - 50000, (int)(rng() % 40) - 20);
    case 4: {
      static const std::vector<std::string> bits = {"a", "Z", " ", "\"", "\\", "/", "\n", "\t",
                                                    "\x01", "\xc3\xa9", "\xe2\x82\xac",
                                                    "\xf0\x9f\x98\x80", "\x7f", "0"};
      std::string s;
      for (int i = rng() % 6; i > 0; --i) s += bits[rng() % bits.size()];
      return s;
    }
    case 5: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = rng() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = rng() % 4; i > 0; --i)
        o[std::string(1, (char)('a' + rng() % 26))] = random_value(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonRecognizer, AgreesWithAnIndependentParserOnRandomAndDamagedTexts) {
  std::mt19937 rng(7);
  int valid = 0, damaged_ok = 0, damaged_bad = 0;
  for (int it = 0; it < 3000; ++it) {
    nlohmann::json o = nlohmann::json::object();
    for (int i = rng() % 5; i > 0; --i) o[std::string(1, (char)('a' + rng() % 26))] = random_value(rng, 1);
    const std::string text = o.dump(rng() % 3 == 0 ? 2 : -1, ' ', rng() % 2 == 0);
    ASSERT_TRUE(accepts(text)) << text;
    ++valid;
    // One byte changed, dropped or inserted: the recognizer takes the text whole exactly when
    // the reference parses it as an object.
    std::string d = text;
    const size_t at = rng() % d.size();
    static const std::string pool = "{}[]\":,.-+eE0123456789 \\ntfalsu\x80\xc3\xe2";
    const char c = pool[rng() % pool.size()];
    switch (rng() % 3) {
      case 0: d[at] = c; break;
      case 1: d.erase(at, 1); break;
      default: d.insert(at, 1, c); break;
    }
    bool ref = false;
    try {
      ref = nlohmann::json::parse(d).is_object();
    } catch (const nlohmann::json::out_of_range&) {
      // A number beyond a double (1e4375): the reference stops at its range (RFC 8259 section 6
      // leaves it to implementations), before it has read the rest: no verdict on the syntax.
      continue;
    } catch (const nlohmann::json::exception&) {
      ref = false;
    }
    EXPECT_EQ(accepts(d), ref) << d;
    (ref ? damaged_ok : damaged_bad) += 1;
  }
  EXPECT_EQ(valid, 3000);
  EXPECT_GT(damaged_ok, 100);  // both kinds of damaged text occurred
  EXPECT_GT(damaged_bad, 1000);
}

class JsonConstraintTest : public test::TinyJsonModelTest {};

TEST_F(JsonConstraintTest, TheTrieAllowsExactlyTheTokensWhoseBytesContinueTheText) {
  test::expect_trie_allows_exactly_the_continuations(
      model_->tokenizer(), JsonRecognizer(),
      {"", "{", "{\"a", "{\"a\":", "{\"a\": tr", "{\"a\": 1", "{\"a\": \"\\u00",
       "{\"a\": \"\xe2\x82", "{\"a\": [1, {}]"});
}

// The constraint keeps the masks of its last states: a reused one is the walk's for that state.
TEST_F(JsonConstraintTest, AReusedMaskIsTheWalksMaskForItsState) {
  const Tokenizer& tok = model_->tokenizer();
  const auto trie = std::make_shared<const VocabTrie>(tok);
  JsonObjectConstraint c(trie);
  // A text whose states repeat: inside the long string, and after each member of the object.
  const std::string text =
      R"({"a": "the lighthouse keeper kept the light", "b": 1, "c": 2, "d": [true, false]})";
  const std::vector<int32_t> ids = tok.encode(text, /*parse_special=*/false);
  std::vector<uint8_t> got, want(tok.n_vocab());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int n = c.allowed(got);
    std::fill(want.begin(), want.end(), 0);
    EXPECT_EQ(n, trie->allow(c.state(), want)) << "token " << i;  // the count, reused too
    ASSERT_EQ(got, want) << "token " << i;
    ASSERT_EQ(got[ids[i]], 1) << "token " << i;
    c.accept(ids[i]);
  }
  EXPECT_TRUE(c.state().done());
  c.allowed(got);  // then only the end of generation
  for (int32_t id = 0; id < tok.n_vocab(); ++id) EXPECT_EQ(got[id] != 0, tok.is_eog(id)) << id;
  EXPECT_LT(c.mask_walks(), (int)ids.size() - 10);  // most masks were reused
}

// Random logits through the constrained sampler, greedy and sampled: every answer is a prefix of
// JSON text; one that ends with an end-of-generation token is a whole object.
TEST_F(JsonConstraintTest, ASampledAnswerIsJsonAndEndsOnlyWhenTheObjectIsWhole) {
  const Tokenizer& tok = model_->tokenizer();
  const auto trie = std::make_shared<const VocabTrie>(tok);
  const int V = tok.n_vocab();
  std::mt19937 rng(3);
  std::normal_distribution<float> z(0.0f, 3.0f);
  int ended = 0;
  for (int run = 0; run < 60; ++run) {
    SamplingParams p;
    p.temperature = run % 3 == 0 ? 0.0f : 1.0f;
    p.top_k = run % 2 == 0 ? 0 : 40;  // often more than the allowed tokens
    p.top_p = run % 5 == 1 ? 0.9f : 1.0f;
    p.min_p = run % 7 == 2 ? 0.05f : 0.0f;
    p.seed = run;
    Sampler s(p);
    s.set_constraint(std::make_unique<JsonObjectConstraint>(trie));
    std::string text;
    bool eog = false;
    std::vector<float> logits(V);
    for (int t = 0; t < 400 && !eog; ++t) {
      for (float& x : logits) x = z(rng);
      // Favour closing brackets now and then, so that objects end.
      for (int32_t id = 0; id < V; ++id) {
        const std::string piece = tok.token_to_piece(id);
        if (piece == "}" || piece == "]") logits[id] += (float)(t / 20);
      }
      const int32_t id = s.sample(logits.data(), V);
      if (tok.is_eog(id)) {
        eog = true;
      } else {
        text += tok.token_to_piece(id);
      }
    }
    JsonRecognizer r;
    ASSERT_TRUE(r.feed(text)) << text;
    if (eog) {
      ++ended;
      EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
    }
  }
  EXPECT_GT(ended, 30);
}

TEST_F(JsonConstraintTest, TheEngineAnswersAJsonObjectWhenAsked) {
  EngineOptions eo;
  eo.model_path = *path_;
  Engine eng(eo);
  SelectiveOptions sel;
  int whole = 0;
  for (int run = 0; run < 8; ++run) {
    GenerateOptions gen;
    gen.max_tokens = 300;
    gen.json_object = true;
    gen.sampling.temperature = 1.5f;
    gen.sampling.top_k = 0;
    gen.sampling.seed = run;
    const Answer a = eng.answer({}, "Answer in JSON.", sel, gen);
    JsonRecognizer r;
    ASSERT_TRUE(r.feed(a.text)) << a.text;
    if ((int)a.tokens.size() < gen.max_tokens) {  // ended by the end-of-generation token
      ++whole;
      EXPECT_TRUE(nlohmann::json::parse(a.text).is_object()) << a.text;
    }
  }
  // Without the constraint a random model's text is not JSON; with it every answer was a prefix
  // of JSON text, and a whole object when it ended on its own.
  EXPECT_GT(whole, 0);
}

}  // namespace
}  // namespace ct
