// Assembling a chunk-aware request from text: the chat template's head and an instruction form
// the prefix, each document is tokenised on its own (so its tokens, and so its cache id, do not
// depend on its neighbours), and the question plus the template's assistant header form the
// query. Every policy, full recompute included, sees exactly this token sequence.
#pragma once

#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace ct {

struct RagPromptTokens {
  std::vector<int32_t> prefix;
  std::vector<std::vector<int32_t>> chunks;
  std::vector<int32_t> query;
  int n_tokens() const {  // the composed prompt's length
    size_t n = prefix.size() + query.size();
    for (const auto& c : chunks) n += c.size();
    return static_cast<int>(n);
  }
};

// Default instruction for question answering over the documents.
inline constexpr const char* kQaInstruction =
    "Answer the question using the documents below. Answer with a few words only.";

// Chunk text as stored: the document followed by a blank line separating it from the next.
std::vector<int32_t> tokenize_chunk(const Tokenizer& tok, const std::string& text);

// The conversation `history` (system and earlier user/assistant turns, in order) is rendered
// by the chat template before the final user turn, which holds the instruction, the documents and
// the question: prefix = template head + history + "<instruction>\n\n", query = "Question:
// <question>" + the assistant header. An empty instruction means plain chat: no instruction, no
// "Question: " label, the user's text as it is (documents, if any, still come first).
RagPromptTokens build_rag_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& question,
                                 const std::string& instruction = kQaInstruction,
                                 const std::vector<ChatMessage>& history = {});

// What a conversation with tools adds (Tokenizer::apply_chat_template's tool form): the tool
// definitions (each one JSON text) and the role of the message holding the question: "user", or
// "tool" when the conversation ends with a tool's result (the answer then follows the results;
// the documents, if any, come before that result's content, with no instruction and no
// "Question: " label). history may then hold tool results and assistant tool calls.
struct ToolTurns {
  std::vector<std::string> tools;
  std::string question_role = "user";
};
RagPromptTokens build_rag_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& question, const std::string& instruction,
                                 const std::vector<ChatMessage>& history, const ToolTurns& tools);

// A raw prompt (the /v1/completions route): no chat template. prefix = BOS (where the model's
// tokenizer adds one) + the instruction, then the documents (tokenize_chunk), then query = the
// prompt. The instruction and the prompt text are tokenised with control tokens parsed, as
// llama-server and vLLM do for completions: a raw prompt may spell out a template. Token ids are
// used as given, and with no instruction and no documents before them no BOS is added either.
RagPromptTokens build_raw_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& instruction, const std::string& prompt);
RagPromptTokens build_raw_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& instruction, const std::vector<int32_t>& ids);

}  // namespace ct
