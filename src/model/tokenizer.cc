// Tokenizers matching llama.cpp's "gpt2" (byte-level BPE) and "llama" (SentencePiece) vocabulary
// types token for token: special token partition, pre-tokenization (unicode.h), BPE by merge rank
// or SPM by token score with byte fallback, decoding, and chat templates.
#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <queue>
#include <tuple>

#include "core/error.h"
#include "model/gguf.h"
#include "model/unicode.h"

namespace ct {

namespace {

constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeByte = 6;

constexpr int32_t kNoToken = -1;  // a byte without a token of its own
constexpr int32_t kMerged = -2;   // a symbol merged into its left neighbour

// The tokenizer.ggml.pre values of byte-level BPE files we tokenise, with what llama.cpp does for
// each (llama-vocab.cpp): the pre-tokenizer regex, whether a piece that is itself a token skips
// the merges, and whether BOS is added when the file does not say. Pre types with other regexes
// or normalisation are rejected rather than tokenised differently.
struct PreType {
  const char* name;
  unicode::PreSplit split;
  bool ignore_merges;
  bool add_bos;
};
constexpr PreType kPreTypes[] = {
    {"gpt2", unicode::PreSplit::kGpt2, false, false},
    {"gpt-2", unicode::PreSplit::kGpt2, false, false},
    {"phi-2", unicode::PreSplit::kGpt2, false, false},
    {"mpt", unicode::PreSplit::kGpt2, false, false},
    {"olmo", unicode::PreSplit::kGpt2, false, false},
    {"smollm", unicode::PreSplit::kDigitsGpt2, false, false},
    {"starcoder", unicode::PreSplit::kDigitsGpt2, false, false},
    {"refact", unicode::PreSplit::kDigitsGpt2, false, false},
    {"command-r", unicode::PreSplit::kDigitsGpt2, false, false},
    {"qwen2", unicode::PreSplit::kQwen2, false, false},
    {"deepseek-r1-qwen", unicode::PreSplit::kQwen2, false, false},
    {"stablelm2", unicode::PreSplit::kQwen2, false, false},
    {"qwen35", unicode::PreSplit::kQwen35, false, false},
    {"llama3", unicode::PreSplit::kLlama3, true, true},
    {"llama-v3", unicode::PreSplit::kLlama3, true, true},
    {"llama-bpe", unicode::PreSplit::kLlama3, true, true},
    {"falcon3", unicode::PreSplit::kLlama3, true, true},
    {"dbrx", unicode::PreSplit::kLlama3, false, false},
    {"smaug-bpe", unicode::PreSplit::kLlama3, false, false},
};

const PreType* find_pre_type(const std::string& pre) {
  for (const PreType& p : kPreTypes) {
    if (pre == p.name) return &p;
  }
  return nullptr;
}

std::string pre_type_names() {
  std::string names;
  for (const PreType& p : kPreTypes) {
    if (!names.empty()) names += ", ";
    names += p.name;
  }
  return names;
}

// Token texts llama.cpp treats as control tokens whatever their type says ("control-looking"
// tokens: end of turn, end of message, fill-in-the-middle), and which of them end generation.
struct NamedSpecial {
  const char* text;
  bool eog;
};
constexpr NamedSpecial kNamedSpecials[] = {
    {"<|eot_id|>", true},
    {"<|im_end|>", true},
    {"<|end|>", true},
    {"<end_of_turn>", true},
    {"<|endoftext|>", true},
    {"<|end_of_text|>", true},
    {"<EOT>", true},
    {"_<EOT>", true},
    {"<|eom_id|>", true},
    {"</s>", true},
    {"<end_of_utterance>", true},
    {"<|fim_prefix|>", false},
    {"<fim-prefix>", false},
    {"<fim_prefix>", false},
    {"<PRE>", false},
    {"\xE2\x96\x81<PRE>", false},
    {"<|fim_suffix|>", false},
    {"<fim-suffix>", false},
    {"<fim_suffix>", false},
    {"<SUF>", false},
    {"\xE2\x96\x81<SUF>", false},
    {"<|fim_middle|>", false},
    {"<fim-middle>", false},
    {"<fim_middle>", false},
    {"<MID>", false},
    {"\xE2\x96\x81<MID>", false},
    {"<|fim_pad|>", true},
    {"<fim-pad>", true},
    {"<fim_pad>", true},
    {"<PAD>", true},
    {"<|fim_repo|>", true},
    {"<|repo_name|>", true},
    {"<fim-repo>", true},
    {"<REPO>", true},
    {"<reponame>", true},
    {"<|file_sep|>", true},
};

const char kSpmSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, pos)) {
    out.append(*s, pos, at - pos);
    out.append(to);
    pos = at + from.size();
  }
  out.append(*s, pos);
  s->swap(out);
}

// Length of the UTF-8 sequence a lead byte announces, as llama.cpp's unicode_len_utf8 (which SPM
// uses to cut text into symbols): a continuation byte counts as 1, F8..FF as 4.
size_t utf8_lead_len(uint8_t b) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[b >> 4];
}

std::string shorten(const std::string& s, size_t n = 80) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

// Undoes the byte-level mapping of a normal token's text. A character outside the mapping (not
// produced by byte-level BPE training) is kept as its UTF-8.
std::string decode_byte_level(const std::string& text) {
  std::string out;
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    const size_t len = unicode::utf8_decode(text, pos, &cp);
    const int b = cp == unicode::kInvalidCp ? -1 : unicode::unicode_to_byte(cp);
    if (b >= 0) {
      out.push_back((char)b);
    } else {
      out.append(text, pos, len);
    }
    pos += len;
  }
  return out;
}

// "<0xAB>" -> 0xAB, as byte tokens are written; -1 otherwise.
int parse_byte_token(const std::string& text) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// Finds the system message a ChatML template inserts when the conversation has none: a string
// literal '<|im_start|>system\n...<|im_end|>' whose body is plain text (not an expression such as
// "' + messages[0]['content'] + '"). Returns "" when the template has no such literal.
std::string extract_default_system(const std::string& tmpl) {
  const std::string head = "<|im_start|>system";
  for (size_t at = tmpl.find(head); at != std::string::npos; at = tmpl.find(head, at + 1)) {
    if (at == 0) continue;
    const char quote = tmpl[at - 1];
    if (quote != '\'' && quote != '"') continue;
    size_t body = at + head.size();
    if (tmpl.compare(body, 1, "\n") == 0) {
      body += 1;
    } else if (tmpl.compare(body, 2, "\\n") == 0) {
      body += 2;
    } else {
      continue;
    }
    const size_t end = tmpl.find("<|im_end|>", body);
    if (end == std::string::npos) continue;
    // Unescape the literal's body; an unescaped closing quote means the body is an expression.
    std::string text;
    bool literal = true;
    for (size_t i = body; i < end && literal; ++i) {
      const char c = tmpl[i];
      if (c == quote) {
        literal = false;
      } else if (c == '\\' && i + 1 < end) {
        const char e = tmpl[++i];
        text.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
      } else {
        text.push_back(c);
      }
    }
    if (literal && !text.empty()) return text;
  }
  return "";
}

// The string literals inside the template's tags ({{ ... }} and {% ... %}), unescaped, in order.
std::vector<std::string> template_literals(const std::string& tmpl) {
  std::vector<std::string> out;
  bool in_tag = false;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if (!in_tag) {
      if (c == '{' && i + 1 < tmpl.size() && (tmpl[i + 1] == '{' || tmpl[i + 1] == '%')) {
        in_tag = true;
        ++i;
      }
      continue;
    }
    if ((c == '}' || c == '%') && i + 1 < tmpl.size() && tmpl[i + 1] == '}') {
      in_tag = false;
      ++i;
    } else if (c == '\'' || c == '"') {
      std::string text;
      size_t j = i + 1;
      for (; j < tmpl.size() && tmpl[j] != c; ++j) {
        if (tmpl[j] == '\\' && j + 1 < tmpl.size()) {
          const char e = tmpl[++j];
          text.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
        } else {
          text.push_back(tmpl[j]);
        }
      }
      if (j == tmpl.size()) break;  // an unterminated literal: nothing after it is trusted
      out.push_back(std::move(text));
      i = j;
    }
  }
  return out;
}

// The Hermes tool form of a ChatML template (Qwen2.5's): its literals before and after the tool
// definitions (ending "<tools>", and from "\n</tools>" to "<|im_end|>\n"), provided it also writes
// calls and results exactly as apply_chat_template does. {"", ""} otherwise.
std::pair<std::string, std::string> extract_tool_form(const std::string& tmpl) {
  const std::vector<std::string> lits = template_literals(tmpl);
  auto has = [&](const std::string& s) {
    return std::find(lits.begin(), lits.end(), s) != lits.end();
  };
  if (!has("\n<tool_call>\n{\"name\": \"") || !has("\", \"arguments\": ") ||
      !has("}\n</tool_call>") || !has("\n<tool_response>\n") || !has("\n</tool_response>")) {
    return {};
  }
  std::string head, tail;
  for (const std::string& l : lits) {
    auto ends_with = [&l](const std::string& e) {
      return l.size() >= e.size() && l.compare(l.size() - e.size(), e.size(), e) == 0;
    };
    if (ends_with("<tools>")) head = l;
    if (l.rfind("\n</tools>", 0) == 0 && ends_with("<|im_end|>\n")) tail = l;
  }
  if (head.empty() || tail.empty()) return {};
  return {head, tail};
}

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// One symbol of the word being merged; symbols form a doubly linked list in text order.
struct Symbol {
  int32_t id;  // token id, kNoToken, or kMerged
  int32_t prev, next;
};

// A candidate merge of symbols left and left's successor, valid while both still hold the ids it
// was made from. Ordered by rank, then leftmost first, as llama.cpp's queue.
struct Candidate {
  int32_t rank;
  int32_t left, right;
  int32_t left_id, right_id;
  int32_t result;
  bool operator<(const Candidate& o) const {  // inverted: std::priority_queue is a max-heap
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

// Recognises the template's family in llama.cpp's order (llm_chat_detect_template), for the
// families rendered here. Anything else would be rendered wrongly, so it is kUnsupported and
// apply_chat_template refuses it rather than falling back silently.
Tokenizer::ChatFormat Tokenizer::classify_template(const std::string& tmpl) {
  auto has = [&](const char* s) { return tmpl.find(s) != std::string::npos; };
  if (tmpl.empty()) return ChatFormat::kChatMl;  // llama.cpp's default as well
  if (has("<|im_start|>")) {
    // Phi-4 and SmolVLM use <|im_start|> in formats that are not ChatML.
    return has("<|im_sep|>") || has("<end_of_utterance>") ? ChatFormat::kUnsupported
                                                          : ChatFormat::kChatMl;
  }
  if (has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) return ChatFormat::kMistralV7;
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return ChatFormat::kMistralV1;
      if (has("\"[INST]\"")) return ChatFormat::kMistralV3Tekken;
      return ChatFormat::kMistralV3;
    }
    if (has("content.strip()")) return ChatFormat::kLlama2SysStrip;
    if (has("bos_token + '[INST]")) return ChatFormat::kLlama2SysBos;
    if (has("<<SYS>>")) return ChatFormat::kLlama2Sys;
    return ChatFormat::kLlama2;
  }
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::kLlama3;
  return ChatFormat::kUnsupported;
}

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  VocabSpec spec;
  spec.source = f.path();
  spec.model = f.get_string("tokenizer.ggml.model");
  spec.pre = f.get_string("tokenizer.ggml.pre", "");
  spec.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
      spec.token_types.push_back((int32_t)t);
    }
  }
  if (f.has("tokenizer.ggml.scores")) {
    const GgufValue* v = f.find("tokenizer.ggml.scores");
    if (v->type == GgufValueType::ARRAY && v->elem_type == GgufValueType::INT32) {
      for (int64_t s : f.get_int_array("tokenizer.ggml.scores")) spec.scores.push_back((float)s);
    } else {
      for (double s : f.get_float_array("tokenizer.ggml.scores")) spec.scores.push_back((float)s);
    }
  }
  if (spec.model == "gpt2") spec.merges = f.get_string_array("tokenizer.ggml.merges");
  spec.chat_template = f.get_string("tokenizer.chat_template", "");
  // Out-of-range ids are an error here (llama.cpp warns and ignores them): a file that names a
  // missing BOS or EOS would otherwise generate or stop wrongly without notice.
  auto token_id = [&](const char* key, int64_t def = -1) {
    const int64_t id = f.get_int(key, def);
    CT_THROW_IF_NOT(id >= -1 && id < (int64_t)spec.tokens.size(), "{}: {} is {}, expected < {}",
                    f.path(), key, id, spec.tokens.size());
    return (int32_t)id;
  };
  // Without the keys llama.cpp assumes SentencePiece's <s> = 1 and </s> = 2.
  const bool spm = spec.model == "llama" && spec.tokens.size() > 2;
  spec.bos = token_id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  spec.eos = token_id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  spec.eot = token_id("tokenizer.ggml.eot_token_id");
  spec.eom = token_id("tokenizer.ggml.eom_token_id");
  if (f.has("tokenizer.ggml.add_bos_token")) {
    spec.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  }
  spec.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  spec.name = f.get_string("general.name", "");
  try {
    return from_vocab(std::move(spec));
  } catch (const Error& e) {
    CT_THROW("{}: {}", f.path(), e.what());
  }
}

Tokenizer Tokenizer::from_vocab(VocabSpec spec) {
  Tokenizer t;
  const size_t n = spec.tokens.size();
  CT_THROW_IF_NOT(spec.model == "gpt2" || spec.model == "llama",
                  "tokenizer.ggml.model is '{}', expected 'gpt2' (byte-level BPE) or 'llama' "
                  "(SentencePiece)",
                  spec.model);
  t.spm_ = spec.model == "llama";
  const PreType* pre_type = nullptr;
  if (!t.spm_) {
    pre_type = find_pre_type(spec.pre);
    // llama.cpp falls back to a default pre-tokenizer for a missing value ("generation quality
    // will be degraded"); we refuse rather than tokenise differently from the model's training.
    CT_THROW_IF_NOT(pre_type != nullptr, "tokenizer.ggml.pre is '{}'{}, expected one of: {}",
                    spec.pre, spec.pre.empty() ? " (missing)" : "", pre_type_names());
  }
  CT_THROW_IF_NOT(n > 0 && n < (size_t)INT32_MAX,
                  "tokenizer.ggml.tokens has {} entries, expected 1 to 2^31-2", n);
  if (spec.token_types.empty()) spec.token_types.assign(n, kTypeNormal);
  CT_THROW_IF_NOT(spec.token_types.size() == n,
                  "tokenizer.ggml.token_type has {} entries, expected {} (one per token)",
                  spec.token_types.size(), n);
  if (spec.scores.empty()) spec.scores.assign(n, 0.0f);
  CT_THROW_IF_NOT(spec.scores.size() == n,
                  "tokenizer.ggml.scores has {} entries, expected {} (one per token)",
                  spec.scores.size(), n);
  for (const auto& [key, id] : {std::pair<const char*, int32_t>{"bos_token_id", spec.bos},
                                {"eos_token_id", spec.eos},
                                {"eot_token_id", spec.eot},
                                {"eom_token_id", spec.eom}}) {
    CT_THROW_IF_NOT(id >= -1 && id < (int32_t)n, "tokenizer.ggml.{} is {}, expected < {}", key, id,
                    n);
  }

  t.tokens_ = std::move(spec.tokens);
  t.token_type_ = std::move(spec.token_types);
  t.scores_ = std::move(spec.scores);
  t.token_to_id_.reserve(n);
  // A text listed twice resolves to its last id, as in llama.cpp.
  for (size_t i = 0; i < n; ++i) t.token_to_id_[t.tokens_[i]] = (int32_t)i;

  // llama.cpp makes end-of-turn and fill-in-the-middle tokens control tokens whatever the file
  // says, so they are parsed only with parse_special and rendered only on request.
  for (const NamedSpecial& s : kNamedSpecials) {
    const int32_t id = t.find_token(s.text);
    if (id >= 0) t.token_type_[id] = kTypeControl;
  }

  // Byte tokens: BPE has one per byte in byte-level form (SmolLM2 lacks 21, e.g. 0x04 and 0xC0;
  // encode drops those, as llama.cpp does). SPM falls back to "<0xXX>", else to the byte as text.
  t.byte_ids_.assign(256, kNoToken);
  for (int b = 0; b < 256; ++b) {
    if (t.spm_) {
      static const char* hex = "0123456789ABCDEF";
      const char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
      int32_t id = t.find_token(name);
      if (id < 0) id = t.find_token(std::string(1, (char)b));
      t.byte_ids_[b] = id;
    } else {
      t.byte_ids_[b] = t.find_token(unicode::byte_to_unicode((uint8_t)b));
    }
  }

  t.merges_.reserve(spec.merges.size());
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const std::string& m = spec.merges[i];
    // The separator is searched from index 1 so that a left part starting with ' ' still parses.
    const size_t sp = m.find(' ', 1);
    CT_THROW_IF_NOT(sp != std::string::npos,
                    "tokenizer.ggml.merges[{}] is '{}', expected 'left right'", i, m);
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    auto l = t.token_to_id_.find(left), r = t.token_to_id_.find(right),
         res = t.token_to_id_.find(left + right);
    CT_THROW_IF_NOT(
        l != t.token_to_id_.end() && r != t.token_to_id_.end() && res != t.token_to_id_.end(),
        "tokenizer.ggml.merges[{}] is '{}', expected both parts and their concatenation "
        "to be tokens",
        i, m);
    // A repeated pair keeps its first (lowest) rank.
    t.merges_.emplace(std::make_pair(l->second, r->second), Merge{(int32_t)i, res->second});
  }

  t.pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = t.tokens_[i];
    const int32_t type = t.token_type_[i];
    const bool special = type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined;
    if (type == kTypeByte && parse_byte_token(text) >= 0) {
      t.pieces_[i] = std::string(1, (char)parse_byte_token(text));
    } else if (special) {
      t.pieces_[i] = text;
    } else if (type == kTypeNormal) {
      std::string piece = t.spm_ ? text : decode_byte_level(text);
      if (t.spm_) replace_all(&piece, kSpmSpace, " ");
      t.pieces_[i] = std::move(piece);
    }  // unused and undefined tokens decode to nothing, as in llama.cpp
    if (special && !text.empty()) t.special_ids_.push_back((int32_t)i);
  }
  // Longest first, so that a special token containing another is matched whole. Ties by id keep
  // the order deterministic (llama.cpp leaves it to an unstable sort).
  std::sort(t.special_ids_.begin(), t.special_ids_.end(), [&](int32_t a, int32_t b) {
    const size_t la = t.tokens_[a].size(), lb = t.tokens_[b].size();
    return la != lb ? la > lb : a < b;
  });

  // llama.cpp sets per-token attributes from general.name: for Phi-3 whitespace after a special
  // token (but <unk>, <s>, <|endoftext|>) is dropped, so "<|user|>\n" reads like "<|user|>".
  t.rstrip_.assign(n, 0);
  std::string name = spec.name;
  for (char& c : name) c = (char)std::tolower((unsigned char)c);
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : t.special_ids_) t.rstrip_[id] = 1;
    if (t.find_token("</s>") >= 0) t.rstrip_[t.find_token("</s>")] = 1;
    for (const char* keep : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (t.find_token(keep) >= 0) t.rstrip_[t.find_token(keep)] = 0;
    }
  }

  for (int32_t id : {spec.eos, spec.eot, spec.eom}) {
    if (id >= 0) t.eog_ids_.push_back(id);
  }
  for (const NamedSpecial& s : kNamedSpecials) {
    const int32_t id = t.find_token(s.text);
    if (s.eog && id >= 0) t.eog_ids_.push_back(id);
  }
  std::sort(t.eog_ids_.begin(), t.eog_ids_.end());
  t.eog_ids_.erase(std::unique(t.eog_ids_.begin(), t.eog_ids_.end()), t.eog_ids_.end());

  if (!t.spm_) {
    t.pre_ = spec.pre;
    t.pre_split_ = (int)pre_type->split;
    t.ignore_merges_ = pre_type->ignore_merges;
  }
  t.add_space_prefix_ = t.spm_ && spec.add_space_prefix;
  t.source_ = std::move(spec.source);
  t.chat_format_ = classify_template(spec.chat_template);
  if (t.chat_format_ == ChatFormat::kChatMl) {
    t.default_system_ = extract_default_system(spec.chat_template);
    std::tie(t.tool_head_, t.tool_tail_) = extract_tool_form(spec.chat_template);
  }
  t.chat_template_ = std::move(spec.chat_template);
  t.bos_ = spec.bos;
  t.eos_ = spec.eos;
  t.add_bos_ = spec.add_bos.value_or(t.spm_ || (pre_type != nullptr && pre_type->add_bos));
  return t;
}

bool Tokenizer::is_special_type(int32_t id) const {
  const int32_t type = token_type_[id];
  return type == kTypeControl || type == kTypeUnknown;
}

void Tokenizer::encode_bpe_piece(std::string_view piece, std::vector<int32_t>* out) const {
  const auto* bytes = reinterpret_cast<const uint8_t*>(piece.data());
  const int32_t n = (int32_t)piece.size();
  if (n == 0) return;
  if (n == 1) {
    if (byte_ids_[bytes[0]] != kNoToken) out->push_back(byte_ids_[bytes[0]]);
    return;
  }
  if (ignore_merges_) {
    std::string text;
    for (int32_t i = 0; i < n; ++i) text += unicode::byte_to_unicode(bytes[i]);
    const int32_t id = find_token(text);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  // A byte without a token stays a symbol (kNoToken never merges), so it separates its neighbours
  // exactly as in llama.cpp, and is dropped from the output.
  std::vector<Symbol> syms(n);
  for (int32_t i = 0; i < n; ++i) syms[i] = {byte_ids_[bytes[i]], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0) return;
    auto it = merges_.find({syms[left].id, syms[right].id});
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, syms[left].id, syms[right].id, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = syms[c.left];
    Symbol& r = syms[c.right];
    // Stale when either side has changed since: a symbol's id changes whenever it grows or is
    // merged away, and the two must still be neighbours.
    if (l.id != c.left_id || l.next != c.right || r.id != c.right_id) continue;
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = kMerged;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id != kNoToken) out->push_back(syms[i].id);
  }
}

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>* out) const {
  // Symbols are UTF-8 characters as their lead bytes announce them (not validated, as in
  // llama.cpp). Adjacent symbols whose concatenation is a token merge, highest token score first
  // and leftmost first among equal scores, until no pair is a token.
  struct Sym {
    size_t begin, n;  // bytes of text; n = 0 once merged into the left neighbour
    int32_t prev, next;
  };
  struct Bigram {
    float score;
    int32_t left, right;
    size_t size;                             // bytes of the merged text when it was proposed
    bool operator<(const Bigram& o) const {  // std::priority_queue is a max-heap
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::vector<Sym> syms;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_lead_len((uint8_t)text[off]), text.size() - off);
    syms.push_back({off, len, (int32_t)syms.size() - 1, -1});
    off += len;
  }
  if (syms.empty()) return;
  for (size_t i = 0; i + 1 < syms.size(); ++i) syms[i].next = (int32_t)i + 1;

  std::priority_queue<Bigram> queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string merged(text.substr(syms[left].begin, syms[left].n + syms[right].n));
    const int32_t id = find_token(merged);
    if (id >= 0) queue.push({scores_[id], left, right, merged.size()});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) consider((int32_t)i, (int32_t)i + 1);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Sym& l = syms[b.left];
    Sym& r = syms[b.right];
    // Stale when either side has merged since: a side that grew or vanished changes the size.
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    consider(l.prev, b.left);
    consider(b.left, l.next);
  }
  // Every merged symbol is a token; a single character that is not falls back to its bytes'
  // tokens (llama.cpp's resegment), and a byte without one is dropped (llama.cpp throws).
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].begin, syms[i].n);
    const int32_t id = find_token(std::string(piece));
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      if (byte_ids_[(uint8_t)c] != kNoToken) out->push_back(byte_ids_[(uint8_t)c]);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special,
                                       bool starts_text) const {
  return encode_impl(text, parse_special, nullptr, starts_text);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text,
                                       const std::vector<std::pair<size_t, size_t>>& plain,
                                       bool starts_text) const {
  return encode_impl(text, true, &plain, starts_text);
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool parse_special,
                                            const std::vector<std::pair<size_t, size_t>>* plain,
                                            bool starts_text) const {
  // Split the text around special tokens first (llama.cpp's tokenizer_st_partition): each
  // special token in turn, longest first, cuts every occurrence out of the remaining raw text.
  // Control tokens are only recognised with parse_special; user-defined ones always are.
  struct Fragment {
    int32_t id;  // -1 for raw text
    size_t begin, end;
  };
  // Empty text has no fragment at all, so SPM adds no space prefix to it.
  std::vector<Fragment> frags, next;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  auto is_space = [](char c) { return std::isspace((unsigned char)c) != 0; };
  for (int32_t sid : special_ids_) {
    if (!parse_special && is_special_type(sid)) continue;
    const std::string& st = tokens_[sid];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.begin, f.end - f.begin);
      // A control token overlapping a plain (user) range is text there, not a token.
      auto in_plain = [&](size_t at) {
        if (plain == nullptr || !is_special_type(sid)) return false;
        const size_t b = f.begin + at, e = b + st.size();
        for (const auto& [pb, pe] : *plain) {
          if (b < pe && pb < e) return true;
        }
        return false;
      };
      size_t pos = 0;
      for (size_t at = raw.find(st); at != std::string_view::npos;) {
        if (in_plain(at)) {
          at = raw.find(st, at + 1);
          continue;
        }
        if (at > pos) next.push_back({-1, f.begin + pos, f.begin + at});
        next.push_back({sid, 0, 0});
        pos = at + st.size();
        if (rstrip_[sid]) {
          while (pos < raw.size() && is_space(raw[pos])) ++pos;
        }
        at = raw.find(st, pos);
      }
      if (pos < raw.size()) next.push_back({-1, f.begin + pos, f.end});
    }
    frags.swap(next);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (spm_) {
    // llama.cpp prefixes a space to raw text at the start and after every special token.
    bool prev_special = starts_text;
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        ids.push_back(f.id);
        prev_special = true;
        continue;
      }
      std::string raw = add_space_prefix_ && prev_special ? " " : "";
      raw.append(text.substr(f.begin, f.end - f.begin));
      replace_all(&raw, " ", kSpmSpace);
      encode_spm(raw, &ids);
      prev_special = false;
    }
    return ids;
  }
  std::vector<unicode::Piece> pieces;
  const auto mode = (unicode::PreSplit)pre_split_;
  for (const Fragment& f : frags) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      continue;
    }
    // llama.cpp tokenises the text re-encoded from its code points (U+FFFD for undecodable
    // bytes), so the same is done here.
    const std::string raw = unicode::utf8_normalize(text.substr(f.begin, f.end - f.begin));
    unicode::pre_split(raw, mode, &pieces);
    for (const unicode::Piece& p : pieces) {
      encode_bpe_piece(std::string_view(raw).substr(p.begin, p.end - p.begin), &ids);
    }
  }
  return ids;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  CT_THROW_IF_NOT(id >= 0 && id < n_vocab(), "token id {} is out of range, expected [0, {})", id,
                  n_vocab());
  if (is_special_type(id) && !render_special) return "";
  return pieces_[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, render_special);
  return out;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

int32_t Tokenizer::find_token(const std::string& text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& msgs,
                                           bool add_generation_prompt) const {
  return apply_chat_template(msgs, add_generation_prompt, {});
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& msgs,
                                           bool add_generation_prompt,
                                           const std::vector<std::string>& tools) const {
  const bool tool_turns = std::any_of(msgs.begin(), msgs.end(), [](const ChatMessage& m) {
    return m.role == "tool" || !m.tool_calls.empty();
  });
  CT_THROW_IF_NOT((tools.empty() && !tool_turns) || supports_tools(),
                  "{}: the chat template has no tool-call form (tools, tool calls and tool results "
                  "are rendered for ChatML templates with Qwen2.5's <tool_call> form): '{}'",
                  source_.empty() ? "tokenizer" : source_, shorten(chat_template_));
  std::string out;
  switch (chat_format_) {
    case ChatFormat::kChatMl: {
      // The template adds its default system message only to a non-empty conversation that does
      // not open with a system message of its own; with tools the system turn always comes, the
      // definitions after its text.
      const bool own_system = !msgs.empty() && msgs[0].role == "system";
      if (!tools.empty()) {
        out +=
            "<|im_start|>system\n" + (own_system ? msgs[0].content : default_system_) + tool_head_;
        for (const std::string& t : tools) out += "\n" + t;
        out += tool_tail_;
      } else if (!msgs.empty() && !own_system && !default_system_.empty()) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      }
      for (size_t i = !tools.empty() && own_system ? 1 : 0; i < msgs.size(); ++i) {
        const ChatMessage& m = msgs[i];
        if (m.role == "tool") {
          // Consecutive results share one user turn.
          if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
          out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
          if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
        } else if (!m.tool_calls.empty()) {
          out += "<|im_start|>" + m.role;
          if (!m.content.empty()) out += "\n" + m.content;
          for (const ChatToolCall& c : m.tool_calls) {
            out += "\n<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + c.arguments +
                   "}\n</tool_call>";
          }
          out += "<|im_end|>\n";
        } else {
          out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        }
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case ChatFormat::kLlama3:
      // As llama.cpp's built-in Llama-3 format: contents trimmed, no default system message.
      for (const ChatMessage& m : msgs) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
               "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFormat::kMistralV7:
      // The [INST] formats always end ready for the assistant: add_generation_prompt is implied.
      for (const ChatMessage& m : msgs) {
        if (m.role == "system") {
          out += "[SYSTEM_PROMPT] " + m.content + "[/SYSTEM_PROMPT]";
        } else if (m.role == "user") {
          out += "[INST] " + m.content + "[/INST]";
        } else {
          out += " " + m.content + "</s>";
        }
      }
      return out;
    case ChatFormat::kMistralV1:
    case ChatFormat::kMistralV3:
    case ChatFormat::kMistralV3Tekken: {
      const std::string lead = chat_format_ == ChatFormat::kMistralV1 ? " " : "";
      const std::string trail = chat_format_ == ChatFormat::kMistralV3Tekken ? "" : " ";
      bool in_turn = false;
      for (const ChatMessage& m : msgs) {
        if (!in_turn) {
          out += lead + "[INST]" + trail;
          in_turn = true;
        }
        if (m.role == "system") {
          out += m.content + "\n\n";
        } else if (m.role == "user") {
          out += m.content + lead + "[/INST]";
        } else {
          out += trail + (chat_format_ == ChatFormat::kMistralV3 ? trim(m.content) : m.content) +
                 "</s>";
          in_turn = false;
        }
      }
      return out;
    }
    case ChatFormat::kLlama2:
    case ChatFormat::kLlama2Sys:
    case ChatFormat::kLlama2SysBos:
    case ChatFormat::kLlama2SysStrip: {
      const bool sys = chat_format_ != ChatFormat::kLlama2;
      const bool strip = chat_format_ == ChatFormat::kLlama2SysStrip;
      out += "[INST] ";
      bool in_turn = true;  // the first turn's BOS is the tokenizer's
      for (const ChatMessage& m : msgs) {
        const std::string content = strip ? trim(m.content) : m.content;
        if (!in_turn) {
          out += chat_format_ == ChatFormat::kLlama2SysBos ? "<s>[INST] " : "[INST] ";
          in_turn = true;
        }
        if (m.role == "system") {
          out += sys ? "<<SYS>>\n" + content + "\n<</SYS>>\n\n" : content + "\n";
        } else if (m.role == "user") {
          out += content + " [/INST]";
        } else {
          out += content + "</s>";
          in_turn = false;
        }
      }
      return out;
    }
    case ChatFormat::kUnsupported:
      break;
  }
  CT_THROW(
      "{}: tokenizer.chat_template is not a supported template (expected ChatML with "
      "<|im_start|>, Llama 3 with <|start_header_id|>, or Llama 2 / Mistral with [INST]): '{}'",
      source_.empty() ? "tokenizer" : source_, shorten(chat_template_));
}

}  // namespace ct
