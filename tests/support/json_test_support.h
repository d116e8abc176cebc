// Shared by the JSON output tests (json_constraint_test.cc, json_schema_test.cc): a tiny random
// model for a suite, and the check of the vocabulary trie's mask against every token.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/json_constraint.h"
#include "model/model.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct::test {

// A suite with a 2-layer tiny random model (path_, model_), loaded once.
class TinyJsonModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyModelOptions o;
    o.n_layer = 2;
    path_ = new std::string(write_tiny_model(temp_path("ct_json_tiny.gguf"), o));
    model_ = Model::load(*path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete path_;
    model_ = nullptr;
    path_ = nullptr;
  }
  static inline std::string* path_ = nullptr;
  static inline Model* model_ = nullptr;
};

// After each prefix fed to start, the trie allows exactly the tokens whose bytes the recognizer
// takes whole (end-of-generation and empty pieces never), and counts them.
template <class R>
void expect_trie_allows_exactly_the_continuations(const Tokenizer& tok, const R& start,
                                                  const std::vector<std::string>& prefixes) {
  const VocabTrie trie(tok);
  for (const std::string& prefix : prefixes) {
    SCOPED_TRACE(prefix);
    R r = start;
    ASSERT_TRUE(r.feed(prefix));
    std::vector<uint8_t> got(tok.n_vocab(), 0);
    const int n = trie.allow(r, got);
    int want_n = 0;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
      const std::string piece = tok.token_to_piece(id);
      R c = r;
      const bool want = !tok.is_eog(id) && !piece.empty() && c.feed(piece);
      want_n += want;
      EXPECT_EQ(got[id] != 0, want) << "token " << id;
    }
    EXPECT_EQ(n, want_n);
    EXPECT_GT(n, 0);
  }
}

}  // namespace ct::test
