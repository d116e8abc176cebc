// Byte-level BPE tokenizer, matching llama.cpp's "gpt2" vocabulary type token for token: special
// token partition, regex pre-tokenization (unicode.h), BPE by merge rank, and chat templates.
#include "model/tokenizer.h"

#include <algorithm>
#include <queue>

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

// tokenizer.ggml.pre values whose llama.cpp pre-tokenizer is the GPT-2 regex, alone ("gpt2") or
// after '\p{N}' ("smollm", and "starcoder" whose tokenizer SmolLM2 reuses). Other pre types use
// other regexes or token attributes and are rejected rather than tokenised differently.
struct PreType {
  const char* name;
  bool split_digits;
};
constexpr PreType kPreTypes[] = {{"smollm", true}, {"starcoder", true}, {"gpt2", false}};

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

// Chat template recognition. Only the two families the engine renders natively are accepted; any
// other template would be rendered wrongly, so it is an error rather than a silent fallback.
enum class TemplateKind { kChatMl, kLlama3, kUnsupported };

TemplateKind classify_template(const std::string& tmpl) {
  if (tmpl.empty() || tmpl.find("<|im_start|>") != std::string::npos) return TemplateKind::kChatMl;
  if (tmpl.find("<|start_header_id|>") != std::string::npos) return TemplateKind::kLlama3;
  return TemplateKind::kUnsupported;
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

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  const std::string& model = f.get_string("tokenizer.ggml.model");
  CT_THROW_IF_NOT(model == "gpt2",
                  "{}: tokenizer.ggml.model is '{}', expected 'gpt2' (byte-level BPE)", f.path(),
                  model);
  const std::string& pre = f.get_string("tokenizer.ggml.pre");
  CT_THROW_IF_NOT(find_pre_type(pre) != nullptr,
                  "{}: tokenizer.ggml.pre is '{}', expected one of: {}", f.path(), pre,
                  pre_type_names());
  std::string tmpl = f.get_string("tokenizer.chat_template", "");
  CT_THROW_IF_NOT(classify_template(tmpl) != TemplateKind::kUnsupported,
                  "{}: tokenizer.chat_template is not a supported template (expected ChatML with "
                  "<|im_start|> or Llama-3 with <|start_header_id|>): '{}'",
                  f.path(), shorten(tmpl));

  std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types;
  if (f.has("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) types.push_back((int32_t)t);
  }
  std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
  auto token_id = [&](const char* key) {
    const int64_t id = f.get_int(key, -1);
    CT_THROW_IF_NOT(id >= -1 && id < (int64_t)tokens.size(), "{}: {} is {}, expected < {}",
                    f.path(), key, id, tokens.size());
    return (int32_t)id;
  };
  const int32_t bos = token_id("tokenizer.ggml.bos_token_id");
  const int32_t eos = token_id("tokenizer.ggml.eos_token_id");
  const bool add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  try {
    return from_vocab(std::move(tokens), std::move(types), std::move(merges), pre, std::move(tmpl),
                      bos, eos, add_bos);
  } catch (const Error& e) {
    CT_THROW("{}: {}", f.path(), e.what());
  }
}

Tokenizer Tokenizer::from_vocab(std::vector<std::string> tokens, std::vector<int32_t> token_types,
                                std::vector<std::string> merges, std::string pre,
                                std::string chat_template, int32_t bos, int32_t eos, bool add_bos) {
  Tokenizer t;
  const size_t n = tokens.size();
  CT_THROW_IF_NOT(n > 0 && n < (size_t)INT32_MAX,
                  "tokenizer.ggml.tokens has {} entries, expected 1 to 2^31-2", n);
  if (token_types.empty()) token_types.assign(n, kTypeNormal);
  CT_THROW_IF_NOT(token_types.size() == n,
                  "tokenizer.ggml.token_type has {} entries, expected {} (one per token)",
                  token_types.size(), n);
  const PreType* pre_type = find_pre_type(pre);
  CT_THROW_IF_NOT(pre_type != nullptr, "tokenizer.ggml.pre is '{}', expected one of: {}", pre,
                  pre_type_names());
  const TemplateKind kind = classify_template(chat_template);
  CT_THROW_IF_NOT(kind != TemplateKind::kUnsupported,
                  "tokenizer.chat_template is not a supported template (expected ChatML with "
                  "<|im_start|> or Llama-3 with <|start_header_id|>): '{}'",
                  shorten(chat_template));
  CT_THROW_IF_NOT(bos >= -1 && bos < (int32_t)n, "tokenizer.ggml.bos_token_id is {}, expected < {}",
                  bos, n);
  CT_THROW_IF_NOT(eos >= -1 && eos < (int32_t)n, "tokenizer.ggml.eos_token_id is {}, expected < {}",
                  eos, n);

  t.tokens_ = std::move(tokens);
  t.token_type_ = std::move(token_types);
  t.token_to_id_.reserve(n);
  // A text listed twice resolves to its last id, as in llama.cpp.
  for (size_t i = 0; i < n; ++i) t.token_to_id_[t.tokens_[i]] = (int32_t)i;

  // A byte may have no token (SmolLM2 lacks 21, e.g. 0x04 and 0xC0); encode drops it, as llama.cpp
  // does.
  t.byte_ids_.assign(256, kNoToken);
  for (int b = 0; b < 256; ++b) {
    auto it = t.token_to_id_.find(unicode::byte_to_unicode((uint8_t)b));
    if (it != t.token_to_id_.end()) t.byte_ids_[b] = it->second;
  }

  t.merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
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
    const int byte = type == kTypeByte ? parse_byte_token(text) : -1;
    if (byte >= 0) {
      t.pieces_[i] = std::string(1, (char)byte);
    } else if (type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined) {
      t.pieces_[i] = text;
    } else {
      t.pieces_[i] = decode_byte_level(text);
    }
    if ((type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined) &&
        !text.empty()) {
      t.special_ids_.push_back((int32_t)i);
    }
  }
  // Longest first, so that a special token containing another is matched whole. Ties by id keep
  // the order deterministic (llama.cpp leaves it to an unstable sort).
  std::sort(t.special_ids_.begin(), t.special_ids_.end(), [&](int32_t a, int32_t b) {
    const size_t la = t.tokens_[a].size(), lb = t.tokens_[b].size();
    return la != lb ? la > lb : a < b;
  });

  if (eos >= 0) t.eog_ids_.push_back(eos);
  for (const char* text : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>"}) {
    const int32_t id = t.find_token(text);
    if (id >= 0 && std::find(t.eog_ids_.begin(), t.eog_ids_.end(), id) == t.eog_ids_.end()) {
      t.eog_ids_.push_back(id);
    }
  }

  t.pre_ = std::move(pre);
  t.split_digits_ = pre_type->split_digits;
  t.chat_format_ = kind == TemplateKind::kLlama3 ? ChatFormat::kLlama3 : ChatFormat::kChatMl;
  if (t.chat_format_ == ChatFormat::kChatMl) {
    t.default_system_ = extract_default_system(chat_template);
  }
  t.chat_template_ = std::move(chat_template);
  t.bos_ = bos;
  t.eos_ = eos;
  t.add_bos_ = add_bos;
  return t;
}

bool Tokenizer::is_special_type(int32_t id) const {
  const int32_t type = token_type_[id];
  return type == kTypeControl || type == kTypeUnknown;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  const auto* bytes = reinterpret_cast<const uint8_t*>(piece.data());
  const int32_t n = (int32_t)piece.size();
  if (n == 0) return;
  if (n == 1) {
    if (byte_ids_[bytes[0]] != kNoToken) out->push_back(byte_ids_[bytes[0]]);
    return;
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

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  return encode_impl(text, parse_special, nullptr);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text,
                                       const std::vector<std::pair<size_t, size_t>>& plain) const {
  return encode_impl(text, true, &plain);
}

std::vector<int32_t> Tokenizer::encode_impl(
    std::string_view text, bool parse_special,
    const std::vector<std::pair<size_t, size_t>>* plain) const {
  // Split the text around special tokens first (llama.cpp's tokenizer_st_partition): each
  // special token in turn, longest first, cuts every occurrence out of the remaining raw text.
  // Control tokens are only recognised with parse_special; user-defined ones always are.
  struct Fragment {
    int32_t id;  // -1 for raw text
    size_t begin, end;
  };
  std::vector<Fragment> frags{{-1, 0, text.size()}}, next;
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
        at = raw.find(st, pos);
      }
      if (pos < raw.size()) next.push_back({-1, f.begin + pos, f.end});
    }
    frags.swap(next);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  std::vector<unicode::Piece> pieces;
  const auto mode = split_digits_ ? unicode::PreSplit::kDigitsGpt2 : unicode::PreSplit::kGpt2;
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
      encode_piece(std::string_view(raw).substr(p.begin, p.end - p.begin), &ids);
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
  return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

int32_t Tokenizer::find_token(const std::string& text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& msgs,
                                           bool add_generation_prompt) const {
  std::string out;
  if (chat_format_ == ChatFormat::kLlama3) {
    // As llama.cpp's built-in Llama-3 format: contents trimmed, no BOS (the caller adds it).
    for (const ChatMessage& m : msgs) {
      out +=
          "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }
  // The template adds its default system message only to a non-empty conversation that does not
  // open with a system message of its own.
  if (!msgs.empty() && msgs[0].role != "system" && !default_system_.empty()) {
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const ChatMessage& m : msgs) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace ct
