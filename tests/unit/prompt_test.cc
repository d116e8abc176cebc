// Prompt assembly for models whose tokenizer adds BOS and a SentencePiece space prefix (Llama 2,
// Mistral): the prefix opens with BOS, and documents and the query, which continue the prompt,
// get no space before them, so the pieces decode to the text the whole prompt would.
#include "reuse/prompt.h"

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

}  // namespace
}  // namespace ct
