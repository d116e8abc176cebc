// Prompt assembly for models whose tokenizer adds BOS and a SentencePiece space prefix (Llama 2,
// Mistral): the prefix opens with BOS, and documents and the query, which continue the prompt,
// get no space before them, so the pieces decode to the text the whole prompt would.
#include "reuse/prompt.h"

#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace ct {
namespace {

Tokenizer spm_with_template(const std::string& tmpl) {
  VocabSpec s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81"};
  s.token_types = {2, 3, 3, 1};
  for (int b = 0; b < 256; ++b) {
    s.tokens.push_back(fmt::format("<0x{:02X}>", b));
    s.token_types.push_back(6);
  }
  s.bos = 1;
  s.eos = 2;
  s.chat_template = tmpl;
  return Tokenizer::from_vocab(s);
}

TEST(PromptTest, SpmPromptOpensWithBosAndContinuesWithoutSpacePrefix) {
  const Tokenizer tok = spm_with_template("{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  ASSERT_TRUE(tok.add_bos());
  const RagPromptTokens p = build_rag_prompt(tok, {"doc one", "doc two"}, "why?", "Answer.");
  ASSERT_FALSE(p.prefix.empty());
  EXPECT_EQ(p.prefix[0], tok.bos());
  EXPECT_EQ(tok.decode(p.prefix), " [INST] Answer.\n\n");
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(tok.decode(p.chunks[0]), "doc one\n\n");
  EXPECT_EQ(tok.decode(p.chunks[1]), "doc two\n\n");
  EXPECT_EQ(p.chunks[0], tokenize_chunk(tok, "doc one"));
  EXPECT_EQ(tok.decode(p.query), "Question: why? [/INST]");
}

// The raw prompt of /v1/completions: no template; BOS where the tokenizer adds one, control tokens
// written in the prompt or the instruction parsed, documents as tokenize_chunk makes them, the
// prompt after them without a space prefix; token ids as given, with no BOS of their own.
TEST(PromptTest, RawPromptKeepsTheTextAndParsesControlTokens) {
  const Tokenizer tok = spm_with_template("{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  const RagPromptTokens alone = build_raw_prompt(tok, {}, "", std::string("hi</s>there"));
  ASSERT_EQ(alone.prefix, std::vector<int32_t>{tok.bos()});
  EXPECT_TRUE(alone.chunks.empty());
  EXPECT_EQ(alone.query, tok.encode("hi</s>there", /*parse_special=*/true));
  EXPECT_EQ(std::count(alone.query.begin(), alone.query.end(), tok.eos()), 1);
  // Space prefixes where llama.cpp puts them: the prompt starts the text, and "there" follows a
  // special token.
  EXPECT_EQ(tok.decode(alone.query), " hi there");

  const RagPromptTokens docs =
      build_raw_prompt(tok, {"doc one", "doc two"}, "Read.\n\n", std::string("Q: why?"));
  ASSERT_FALSE(docs.prefix.empty());
  EXPECT_EQ(docs.prefix[0], tok.bos());
  EXPECT_EQ(tok.decode(docs.prefix), " Read.\n\n");
  ASSERT_EQ(docs.chunks.size(), 2u);
  EXPECT_EQ(docs.chunks[1], tokenize_chunk(tok, "doc two"));
  EXPECT_EQ(tok.decode(docs.query), "Q: why?");  // continues the prompt: no space prefix

  const std::vector<int32_t> ids = {7, 8, 9};
  const RagPromptTokens given = build_raw_prompt(tok, {}, "", ids);
  EXPECT_TRUE(given.prefix.empty());
  EXPECT_EQ(given.query, ids);
  const RagPromptTokens given_docs = build_raw_prompt(tok, {"doc one"}, "", ids);
  EXPECT_EQ(given_docs.prefix, std::vector<int32_t>{tok.bos()});
  EXPECT_EQ(given_docs.query, ids);
  EXPECT_EQ(given_docs.n_tokens(), 1 + (int)tokenize_chunk(tok, "doc one").size() + 3);
}

}  // namespace
}  // namespace ct
