// Byte-level BPE tokenizer (GPT-2 family, as used by SmolLM2, Llama-3, Qwen2) built from GGUF
// metadata (tokenizer.ggml.*), plus the model's chat template.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ct {

class GgufFile;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,...}.
  // Throws ct::Error naming the file and key for a missing key or an unsupported model/pre type.
  static Tokenizer from_gguf(const GgufFile& f);

  // Tokenises UTF-8 text. With parse_special, control/user-defined tokens written literally in the
  // text (e.g. "<|im_start|>") become their ids, as llama.cpp does with parse_special=true.
  // Invalid UTF-8 is handled byte-wise, never throws.
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  // Concatenates token texts back to bytes (UTF-8). Special tokens are rendered as their text
  // when render_special, else skipped.
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  int32_t n_vocab() const { return (int32_t)tokens_.size(); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  // End-of-generation: eos, "<|im_end|>", "<|endoftext|>", "<|eot_id|>" when present.
  bool is_eog(int32_t id) const;
  int32_t find_token(const std::string& text) const;  // -1 if absent

  // Renders messages with the model's chat template (ChatML for SmolLM2/Qwen2; Llama-3 style when
  // the template uses <|start_header_id|>). Reproduces the GGUF template's default system prompt.
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt) const;

 private:
  struct PairHash {
    size_t operator()(const std::pair<int32_t, int32_t>& p) const {
      return std::hash<uint64_t>()(((uint64_t)(uint32_t)p.first << 32) | (uint32_t)p.second);
    }
  };
  std::vector<std::string> tokens_;       // token text in byte-level (GPT-2 unicode) form
  std::vector<int32_t> token_type_;       // 1 normal, 3 control, 4 user-defined, 6 byte
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<std::pair<int32_t, int32_t>, int32_t, PairHash> merge_rank_;
  std::vector<int32_t> special_ids_;      // sorted by descending text length, for parse_special
  std::string pre_;                       // tokenizer.ggml.pre
  std::string chat_template_;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  std::vector<int32_t> eog_ids_;
};

}  // namespace ct
