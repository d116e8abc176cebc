// Splits the chat-templated prompt around the documents so that the pieces concatenate to the
// same text the template renders for the whole conversation.
#include "reuse/prompt.h"

#include "core/error.h"

namespace ct {

std::vector<int32_t> tokenize_chunk(const Tokenizer& tok, const std::string& text) {
  // A document always follows the prefix, so it does not start the text (SentencePiece would
  // otherwise put a space before it).
  return tok.encode(text + "\n\n", /*parse_special=*/false, /*starts_text=*/false);
}

namespace {

// Text assembled from trusted template pieces and user pieces, remembering where the user's are.
struct SplicedText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> user;  // byte ranges [begin, end) of user text
  void add(const std::string& piece, bool from_user) {
    if (from_user && !piece.empty()) user.push_back({text.size(), text.size() + piece.size()});
    text += piece;
  }
};

std::string content_marker(size_t i) {
  return std::string("\x01\x02") + "cachetune-" + std::to_string(i) + "\x02\x01";
}

}  // namespace

RagPromptTokens build_rag_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& question, const std::string& instruction,
                                 const std::vector<ChatMessage>& history) {
  // Render the template once with a marker in place of every message's content, splice the
  // contents back in, and split at the final user message's marker. Text that came from the user
  // (message contents, instruction, question) is tokenised without control-token parsing, so it
  // cannot forge <|im_start|> and the like; the template's own special tokens are parsed.
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < history.size(); ++i) msgs.push_back({history[i].role, content_marker(i)});
  const std::string user_marker = content_marker(history.size());
  msgs.push_back({"user", user_marker});
  const std::string rendered = tok.apply_chat_template(msgs, true);
  const size_t at = rendered.find(user_marker);
  CT_ASSERT(at != std::string::npos, "chat template dropped the user message");
  SplicedText head, tail;
  size_t pos = 0;
  for (size_t i = 0; i < history.size(); ++i) {
    const std::string m = content_marker(i);
    const size_t where = rendered.find(m, pos);
    CT_ASSERT(where != std::string::npos && where < at,
              "chat template dropped or reordered message {}", i);
    head.add(rendered.substr(pos, where - pos), false);
    head.add(history[i].content, true);
    pos = where + m.size();
  }
  head.add(rendered.substr(pos, at - pos), false);
  const bool plain = instruction.empty();
  if (!plain) {
    head.add(instruction, true);
    head.add("\n\n", false);
    tail.add("Question: ", false);
  }
  tail.add(question, true);
  tail.add(rendered.substr(at + user_marker.size()), false);
  RagPromptTokens out;
  // The prompt opens with BOS where the model's tokenizer adds one (Llama 2/3, Mistral); the
  // rendered template does not contain it.
  if (tok.add_bos() && tok.bos() >= 0) out.prefix.push_back(tok.bos());
  const std::vector<int32_t> head_ids = tok.encode(head.text, head.user);
  out.prefix.insert(out.prefix.end(), head_ids.begin(), head_ids.end());
  for (const auto& c : chunks) out.chunks.push_back(tokenize_chunk(tok, c));
  out.query = tok.encode(tail.text, tail.user, /*starts_text=*/false);
  return out;
}

namespace {

// The raw prompt's prefix and documents; the query is the caller's.
RagPromptTokens raw_head(const Tokenizer& tok, const std::vector<std::string>& chunks,
                         const std::string& instruction, bool bos) {
  RagPromptTokens out;
  if (bos && tok.add_bos() && tok.bos() >= 0) out.prefix.push_back(tok.bos());
  const std::vector<int32_t> ins = tok.encode(instruction, /*parse_special=*/true);
  out.prefix.insert(out.prefix.end(), ins.begin(), ins.end());
  for (const auto& c : chunks) out.chunks.push_back(tokenize_chunk(tok, c));
  return out;
}

}  // namespace

RagPromptTokens build_raw_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& instruction, const std::string& prompt) {
  RagPromptTokens out = raw_head(tok, chunks, instruction, true);
  // The prompt starts the text when nothing precedes it (SPM then prefixes its space).
  out.query = tok.encode(prompt, /*parse_special=*/true,
                         /*starts_text=*/instruction.empty() && chunks.empty());
  return out;
}

RagPromptTokens build_raw_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& instruction, const std::vector<int32_t>& ids) {
  RagPromptTokens out = raw_head(tok, chunks, instruction, !instruction.empty() || !chunks.empty());
  out.query = ids;
  return out;
}

}  // namespace ct
