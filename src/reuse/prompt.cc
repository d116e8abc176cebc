// Splits the chat-templated prompt around the documents so that the pieces concatenate to the
// same text the template renders for the whole conversation.
#include "reuse/prompt.h"

#include "core/error.h"

namespace ct {

std::vector<int32_t> tokenize_chunk(const Tokenizer& tok, const std::string& text) {
  return tok.encode(text + "\n\n", /*parse_special=*/false);
}

RagPromptTokens build_rag_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& question, const std::string& instruction,
                                 const std::vector<ChatMessage>& history) {
  // Render the template once with a marker as the user message, then split at the marker.
  const std::string marker =
      "\x01\x02"
      "cachetune-user"
      "\x02\x01";
  std::vector<ChatMessage> msgs = history;
  msgs.push_back({"user", marker});
  const std::string rendered = tok.apply_chat_template(msgs, true);
  const size_t at = rendered.find(marker);
  CT_ASSERT(at != std::string::npos, "chat template dropped the user message");
  const bool plain = instruction.empty();
  const std::string head = rendered.substr(0, at) + (plain ? "" : instruction + "\n\n");
  const std::string tail =
      (plain ? "" : "Question: ") + question + rendered.substr(at + marker.size());
  RagPromptTokens out;
  out.prefix = tok.encode(head, /*parse_special=*/true);
  for (const auto& c : chunks) out.chunks.push_back(tokenize_chunk(tok, c));
  out.query = tok.encode(tail, /*parse_special=*/true);
  return out;
}

}  // namespace ct
