// Byte-level BPE tokenizer (GPT-2 family, as used by SmolLM2, Llama-3, Qwen2) built from GGUF
// metadata (tokenizer.ggml.*), plus the model's chat template.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ct {

class GgufFile;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// Immutable after construction; encode and decode are safe to call from several threads.
class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,...}.
  // Throws ct::Error naming the file and key for a missing key, an unsupported model or pre type,
  // or a chat template other than ChatML and Llama-3.
  static Tokenizer from_gguf(const GgufFile& f);
  // Builds a tokenizer from the same data GGUF holds: token texts in byte-level form, their types,
  // merges as "left right", the pre-tokenizer name and the chat template (may be empty: ChatML).
  // from_gguf uses it; tests use it to build small vocabularies. Throws ct::Error for an
  // unsupported pre type or template, inconsistent sizes, or a merge naming an unknown token.
  static Tokenizer from_vocab(std::vector<std::string> tokens, std::vector<int32_t> token_types,
                              std::vector<std::string> merges, std::string pre,
                              std::string chat_template, int32_t bos, int32_t eos, bool add_bos);

  // Tokenises UTF-8 text. With parse_special, control/user-defined tokens written literally in the
  // text (e.g. "<|im_start|>") become their ids, as llama.cpp does with parse_special=true.
  // Any bytes are accepted, never throws. As in llama.cpp, undecodable UTF-8 becomes U+FFFD and a
  // byte with no token in the vocabulary is dropped (SmolLM2 has none for 21 bytes, e.g. 0x04), so
  // decode(encode(text)) == text for valid UTF-8 free of such bytes. Never adds BOS; callers check
  // add_bos().
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  // encode(text, true), except that control tokens are not recognised where they overlap the
  // byte ranges `plain` ([begin, end) pairs): user text spliced into a chat template cannot forge
  // <|im_start|> and the like, while the template's own special tokens still count. Inside those
  // ranges the text tokenises as with parse_special = false (user-defined tokens still count).
  std::vector<int32_t> encode(std::string_view text,
                              const std::vector<std::pair<size_t, size_t>>& plain) const;
  // Concatenates token texts back to bytes (UTF-8). Special tokens are rendered as their text
  // when render_special, else skipped. User-defined tokens are always rendered (as in llama.cpp).
  // Throws ct::Error for an id outside [0, n_vocab).
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  int32_t n_vocab() const { return (int32_t)tokens_.size(); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  // End-of-generation: eos, "<|im_end|>", "<|endoftext|>", "<|eot_id|>" when present.
  bool is_eog(int32_t id) const;
  // Looks a token up by its vocabulary text (byte-level form, e.g. "\u0120the" for " the";
  // special tokens as written). -1 if absent.
  int32_t find_token(const std::string& text) const;

  // Renders messages with the model's chat template (ChatML for SmolLM2/Qwen2; Llama-3 style when
  // the template uses <|start_header_id|>). Reproduces the GGUF template's default system prompt.
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt) const;

 private:
  enum class ChatFormat { kChatMl, kLlama3 };
  struct Merge {
    int32_t rank;    // position in tokenizer.ggml.merges; lower merges first
    int32_t result;  // id of the merged token
  };
  struct PairHash {
    size_t operator()(const std::pair<int32_t, int32_t>& p) const {
      return std::hash<uint64_t>()(((uint64_t)(uint32_t)p.first << 32) | (uint32_t)p.second);
    }
  };
  std::vector<std::string> tokens_;  // token text in byte-level (GPT-2 unicode) form
  std::vector<int32_t> token_type_;  // 1 normal, 3 control, 4 user-defined, 6 byte
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<std::pair<int32_t, int32_t>, Merge, PairHash> merges_;
  std::vector<int32_t> byte_ids_;     // [256] id of each single byte's token, -1 if none
  std::vector<std::string> pieces_;   // bytes each token decodes to (special tokens: their text)
  std::vector<int32_t> special_ids_;  // sorted by descending text length, for parse_special
  std::string pre_;                   // tokenizer.ggml.pre
  bool split_digits_ = false;         // pre type splits every number character first
  std::string chat_template_;
  ChatFormat chat_format_ = ChatFormat::kChatMl;
  std::string default_system_;  // system message the template adds, "" if none
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  std::vector<int32_t> eog_ids_;

  bool is_special_type(int32_t id) const;  // control or unknown: rendered only on request
  std::vector<int32_t> encode_impl(std::string_view text, bool parse_special,
                                   const std::vector<std::pair<size_t, size_t>>* plain) const;
  // Byte-pair encodes one pre-tokenizer piece and appends its ids.
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;
};

}  // namespace ct
