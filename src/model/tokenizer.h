// The tokenizer of a GGUF file (tokenizer.ggml.*), matching llama.cpp token for token: byte-level
// BPE ("gpt2": SmolLM2, Qwen2, Llama 3, GPT-2, StarCoder, ...) and SentencePiece ("llama": Llama 2,
// Mistral, Phi-3), plus the model's chat template (ChatML, Llama 3, Llama 2 / Mistral [INST]).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ct {

class GgufFile;

// A call an assistant message made (OpenAI's tool_calls): the function's name and its arguments
// as the template shows them (JSON text).
struct ChatToolCall {
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c, std::vector<ChatToolCall> calls = {})
      : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)) {}
  std::string role;  // "system", "user", "assistant", "tool" (a tool's result)
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // an assistant message's calls
};

// What a GGUF file says about its tokenizer; Tokenizer::from_vocab builds from it, so tests can
// write small vocabularies without a file.
struct VocabSpec {
  std::string model = "gpt2";  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SPM)
  std::string pre;             // tokenizer.ggml.pre; BPE only (SPM files say "default" or nothing)
  // Token texts: byte-level (GPT-2 unicode) form for BPE; SentencePiece form ("\u2581" for a space,
  // "<0x0A>" byte tokens) for SPM.
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
                                     // 6 byte; empty: all normal
  std::vector<float> scores;         // SPM: merge priority, higher first; empty: all 0
  std::vector<std::string> merges;   // BPE: "left right", lowest rank first
  std::string chat_template;         // tokenizer.chat_template; empty: ChatML
  int32_t bos = -1, eos = -1, eot = -1, eom = -1;  // -1: none
  std::optional<bool> add_bos;   // tokenizer.ggml.add_bos_token; unset: the type's default (SPM and
                                 // Llama 3 add it, other BPE types do not)
  bool add_space_prefix = true;  // SPM: a space before text that starts the input or follows a
                                 // special token (tokenizer.ggml.add_space_prefix)
  std::string name;              // general.name: llama.cpp keys per-token attributes on it (Phi-3)
  std::string source;            // the file, for messages; "" for built vocabularies
};

// Immutable after construction; encode and decode are safe to call from several threads.
class Tokenizer {
 public:
  // Reads tokenizer.ggml.* and general.name. Works on vocabulary-only files (no tensors). Throws
  // ct::Error naming the file and key for a missing key, an unsupported model or pre type.
  static Tokenizer from_gguf(const GgufFile& f);
  // Throws ct::Error for an unsupported model or pre type, inconsistent sizes, or a merge naming an
  // unknown token. An unsupported chat template is accepted here and refused by
  // apply_chat_template, so that files whose template we cannot render still tokenise.
  static Tokenizer from_vocab(VocabSpec spec);

  // Tokenises UTF-8 text as llama.cpp's llama_tokenize with add_special = false. With
  // parse_special, control tokens written literally in the text (e.g. "<|im_start|>") become their
  // ids; user-defined tokens always do. Any bytes are accepted, never throws. BPE: undecodable
  // UTF-8 becomes U+FFFD and a byte with no token is dropped (SmolLM2 lacks 21, e.g. 0x04). SPM:
  // spaces become U+2581, a space is prefixed where llama.cpp prefixes one (see starts_text), and
  // a character with no token falls back to its byte tokens. Never adds BOS; callers check
  // add_bos(). starts_text = false marks text that continues a prompt tokenised in pieces (a
  // document spliced after the prefix): SPM then adds no space prefix before its first fragment.
  std::vector<int32_t> encode(std::string_view text, bool parse_special,
                              bool starts_text = true) const;
  // encode(text, true), except that control tokens are not recognised where they overlap the
  // byte ranges `plain` ([begin, end) pairs): user text spliced into a chat template cannot forge
  // <|im_start|> and the like, while the template's own special tokens still count. Inside those
  // ranges the text tokenises as with parse_special = false (user-defined tokens still count).
  std::vector<int32_t> encode(std::string_view text,
                              const std::vector<std::pair<size_t, size_t>>& plain,
                              bool starts_text = true) const;
  // Concatenates token pieces (llama.cpp's token_to_piece, no leading-space stripping): special
  // tokens are rendered as their text when render_special, else skipped; user-defined tokens are
  // always rendered. SPM pieces show U+2581 as a space, so SPM text decodes with the space prefix
  // encode added. Throws ct::Error for an id outside [0, n_vocab).
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  int32_t n_vocab() const { return (int32_t)tokens_.size(); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  bool is_spm() const { return spm_; }
  // End-of-generation tokens, as llama.cpp lists them: eos, eot, eom, and tokens named
  // <|im_end|>, <|eot_id|>, <|end|>, </s>, <|endoftext|>, ... when present.
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  // Looks a token up by its vocabulary text (byte-level form, e.g. "\u0120the" for " the";
  // special tokens as written). -1 if absent.
  int32_t find_token(const std::string& text) const;

  // Renders messages in the format the GGUF template belongs to, as llama.cpp's built-in formats
  // do (ChatML, with the template's default system message when it has one; Llama 3 headers; Llama
  // 2 and Mistral [INST] variants). No BOS: callers add it when add_bos(). Throws ct::Error naming
  // the file and the template's start when the template is none of these.
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt) const;
  // The same with tool definitions (each one line of JSON text, as the template's `tojson` shows
  // it), tool results (role "tool") and assistant tool calls, in the Hermes form of Qwen2.5's
  // template: the definitions inside <tools></tools> in the system message under the template's
  // own instructions, calls as <tool_call> blocks, results as a user turn of <tool_response>
  // blocks. Throws ct::Error when the template has no such form (supports_tools()).
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                                  const std::vector<std::string>& tools) const;
  // Whether the template renders tools (ChatML whose template carries the Hermes tool form; its
  // instructions around the definitions are read from the template's text).
  bool supports_tools() const { return !tool_head_.empty(); }

 private:
  enum class ChatFormat {
    kChatMl,
    kLlama3,
    kLlama2,          // [INST] ... [/INST], a system message as plain text
    kLlama2Sys,       // with <<SYS>>
    kLlama2SysBos,    // and "<s>" before every later turn
    kLlama2SysStrip,  // and contents trimmed
    kMistralV1,       // " [INST] ... [/INST]"
    kMistralV3,       // "[INST] ...[/INST]", assistant contents trimmed
    kMistralV3Tekken,
    kMistralV7,  // [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT]
    kUnsupported,
  };
  struct Merge {
    int32_t rank;    // position in tokenizer.ggml.merges; lower merges first
    int32_t result;  // id of the merged token
  };
  struct PairHash {
    size_t operator()(const std::pair<int32_t, int32_t>& p) const {
      return std::hash<uint64_t>()(((uint64_t)(uint32_t)p.first << 32) | (uint32_t)p.second);
    }
  };
  std::vector<std::string> tokens_;  // token text as in the file
  std::vector<int32_t> token_type_;  // as VocabSpec, after llama.cpp's control-token detection
  std::vector<float> scores_;        // [n_vocab] SPM merge priority
  std::vector<uint8_t> rstrip_;      // [n_vocab] whitespace after this special token is dropped
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<std::pair<int32_t, int32_t>, Merge, PairHash> merges_;
  std::vector<int32_t> byte_ids_;     // [256] id of each byte's token (BPE: its byte-level
                                      // character; SPM: <0xXX>), -1 if none
  std::vector<std::string> pieces_;   // bytes each token decodes to (special tokens: their text)
  std::vector<int32_t> special_ids_;  // sorted by descending text length, for parse_special
  bool spm_ = false;
  std::string pre_;             // tokenizer.ggml.pre
  int pre_split_ = 0;           // unicode::PreSplit of the pre type (BPE)
  bool ignore_merges_ = false;  // BPE: a piece that is a token is emitted whole (Llama 3)
  bool add_space_prefix_ = false;
  std::string source_;
  std::string chat_template_;
  ChatFormat chat_format_ = ChatFormat::kChatMl;
  std::string default_system_;  // system message the template adds, "" if none
  // The template's text before and after the tool definitions (its string literals holding
  // <tools> and </tools>); both "" when it renders no tools.
  std::string tool_head_, tool_tail_;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  std::vector<int32_t> eog_ids_;

  static ChatFormat classify_template(const std::string& tmpl);
  bool is_special_type(int32_t id) const;  // control or unknown: rendered only on request
  std::vector<int32_t> encode_impl(std::string_view text, bool parse_special,
                                   const std::vector<std::pair<size_t, size_t>>* plain,
                                   bool starts_text) const;
  // Byte-pair encodes one pre-tokenizer piece (raw bytes) and appends its ids.
  void encode_bpe_piece(std::string_view piece, std::vector<int32_t>* out) const;
  // SentencePiece-encodes one text fragment (spaces already escaped) and appends its ids.
  void encode_spm(std::string_view text, std::vector<int32_t>* out) const;
};

}  // namespace ct
