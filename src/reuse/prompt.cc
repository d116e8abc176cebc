// Splits the chat-templated prompt around the documents so that the pieces concatenate to the
// same text the template renders for the whole conversation.
#include "reuse/prompt.h"

#include <algorithm>

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

// A piece of user text's stand-in while the template renders: kMarkerOpen, its index, kMarkerClose.
const std::string kMarkerOpen = std::string("\x01\x02") + "cachetune-", kMarkerClose = "\x02\x01";

std::string content_marker(size_t i) { return kMarkerOpen + std::to_string(i) + kMarkerClose; }

}  // namespace

RagPromptTokens build_rag_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& question, const std::string& instruction,
                                 const std::vector<ChatMessage>& history) {
  return build_rag_prompt(tok, chunks, question, instruction, history, ToolTurns{});
}

RagPromptTokens build_rag_prompt(const Tokenizer& tok, const std::vector<std::string>& chunks,
                                 const std::string& question, const std::string& instruction,
                                 const std::vector<ChatMessage>& history, const ToolTurns& tools) {
  // Render the template once with a marker in place of every piece of user text (message
  // contents, tool calls' names and arguments, tool definitions, the question), splice the pieces
  // back in, and split at the question's marker. Text that came from the user (those pieces and
  // the instruction) is tokenised without control-token parsing, so it cannot forge
  // <|im_start|> and the like; the template's own special tokens are parsed.
  std::vector<std::string> pieces;
  auto mark = [&pieces](const std::string& text) {
    if (text.empty()) return std::string();  // the template tests contents for emptiness
    pieces.push_back(text);
    return content_marker(pieces.size() - 1);
  };
  std::vector<ChatMessage> msgs;
  for (const ChatMessage& h : history) {
    ChatMessage m(h.role, mark(h.content));
    for (const ChatToolCall& c : h.tool_calls)
      m.tool_calls.push_back({mark(c.name), mark(c.arguments)});
    msgs.push_back(std::move(m));
  }
  std::vector<std::string> defs;
  for (const std::string& t : tools.tools) defs.push_back(mark(t));
  const size_t q = pieces.size();
  pieces.push_back(question);
  msgs.push_back({tools.question_role, content_marker(q)});
  const std::string rendered = tok.apply_chat_template(msgs, true, defs);
  SplicedText head, tail;
  SplicedText* cur = &head;
  std::vector<bool> seen(pieces.size(), false);
  size_t pos = 0;
  for (size_t at = rendered.find(kMarkerOpen); at != std::string::npos;
       at = rendered.find(kMarkerOpen, pos)) {
    const size_t end = rendered.find(kMarkerClose, at);
    CT_ASSERT(end != std::string::npos, "chat template cut a content marker");
    const size_t k =
        std::stoul(rendered.substr(at + kMarkerOpen.size(), end - at - kMarkerOpen.size()));
    CT_ASSERT(k < pieces.size() && !seen[k], "chat template repeated content {}", k);
    seen[k] = true;
    cur->add(rendered.substr(pos, at - pos), false);
    pos = end + kMarkerClose.size();
    if (k != q) {
      cur->add(pieces[k], true);
      continue;
    }
    if (!instruction.empty() && tools.question_role != "tool") {  // a result is no question
      head.add(instruction, true);
      head.add("\n\n", false);
      tail.add("Question: ", false);
    }
    cur = &tail;
    tail.add(question, true);
  }
  cur->add(rendered.substr(pos), false);
  CT_ASSERT(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }),
            "chat template dropped a message");
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
