// Writes tiny random llama/qwen2 GGUF models (see tiny_model.h). Weights are drawn in the order
// the tensors are written, so a seed fully determines the file.
#include "support/tiny_model.h"

#include <random>
#include <utility>

#include "core/error.h"
#include "model/arch.h"
#include "model/gguf.h"

namespace ct::test {
namespace {

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the others (control
// characters, space, 0x7f..0xa0, 0xad) take code points 256, 257, ... in byte order.
std::string byte_to_unicode(int b) {
  int n = 0;
  int cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
    const int c = printable ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back((char)cp);
  } else {  // every code point here is below 0x800: two UTF-8 bytes
    s.push_back((char)(0xc0 | (cp >> 6)));
    s.push_back((char)(0x80 | (cp & 0x3f)));
  }
  return s;
}

// Merges in rank order, written with ' ' for the GPT-2 space 'Ġ' and '\n' for 'Ċ'. Each side is a
// byte or the result of an earlier merge.
const std::pair<const char*, const char*> kMerges[] = {
    {" ", "t"},  {"h", "e"},  {" ", "a"},  {"i", "n"},   {" t", "he"}, {"e", "r"}, {"a", "n"},
    {"o", "n"},  {"r", "e"},  {" ", "s"},  {"e", "n"},   {"a", "t"},   {"o", "r"}, {" ", "w"},
    {"i", "s"},  {"e", "s"},  {" ", "o"},  {"in", "g"},  {" ", "c"},   {"i", "t"}, {" ", "b"},
    {"a", "r"},  {" ", "f"},  {" ", "p"},  {"l", "e"},   {"o", "u"},   {" ", "m"}, {"e", "d"},
    {" o", "f"}, {" ", "i"},  {"an", "d"}, {" ", "and"}, {" t", "o"},  {" ", "h"}, {" ", "d"},
    {" ", "l"},  {" ", "is"}, {" ", "in"}, {"l", "l"},   {" ", "n"},   {"o", "m"}, {"\n", "\n"},
};

std::string to_gpt2(const std::string& text) {
  std::string s;
  for (unsigned char c : text) s += byte_to_unicode(c);
  return s;
}

class WeightGen {
 public:
  explicit WeightGen(uint32_t seed) : rng_(seed) {}
  // Normal(mean, stddev) values for a tensor with dimensions ne.
  std::vector<float> normal(const std::vector<int64_t>& ne, float mean, float stddev) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v((size_t)n);
    for (float& x : v) x = dist(rng_);
    return v;
  }

 private:
  std::mt19937 rng_;
};

}  // namespace

const char* const kTinyChatTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";

const char* const kTinyToolTemplate =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- endif %}{{- \"\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools><|im_end|>\\n\" }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
    "{%- endif %}{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- elif message.tool_calls %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{{- '\\n<tool_call>\\n{\"name\": \"' }}"
    "{{- tool_call.function.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- elif not (tools and loop.first and message.role == 'system') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}";

TinyVocab tiny_vocab() {
  TinyVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_to_unicode(b));
  for (const auto& [l, r] : kMerges) {
    v.merges.push_back(to_gpt2(l) + " " + to_gpt2(r));
    v.tokens.push_back(to_gpt2(std::string(l) + r));
  }
  v.token_type.assign(v.tokens.size(), 1);
  v.endoftext = (int32_t)v.tokens.size();
  v.im_start = v.endoftext + 1;
  v.im_end = v.endoftext + 2;
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.token_type.push_back(3);
  }
  return v;
}

std::string write_tiny_model(const std::string& path, const TinyModelOptions& o) {
  const std::string& a = o.arch;
  find_arch(a, path);  // throws for an architecture the engine does not know
  CT_THROW_IF_NOT(o.n_layer > 0 && o.n_embd > 0 && o.n_head > 0 && o.n_head_kv > 0 &&
                      o.head_dim > 0 && o.n_ff > 0,
                  "{}: tiny model dimensions must be positive", path);
  CT_THROW_IF_NOT(o.n_head % o.n_head_kv == 0, "{}: n_head {} is not a multiple of n_head_kv {}",
                  path, o.n_head, o.n_head_kv);
  const GgmlType embd_type = o.token_embd_type.value_or(o.weight_type);
  const int64_t n_q = (int64_t)o.n_head * o.head_dim;
  const int64_t n_kv = (int64_t)o.n_head_kv * o.head_dim;
  for (GgmlType t : {o.weight_type, embd_type}) {
    CT_THROW_IF_NOT(ggml_type_supported(t), "{}: tiny model weight type {} is not supported", path,
                    ggml_type_name(t));
    const int64_t be = ggml_block_elems(t);
    CT_THROW_IF_NOT(o.n_embd % be == 0 && o.n_ff % be == 0 && n_q % be == 0,
                    "{}: weight type {} needs n_embd ({}), n_ff ({}) and n_head*head_dim ({}) to "
                    "be multiples of {} (its block size)",
                    path, ggml_type_name(t), o.n_embd, o.n_ff, n_q, be);
  }

  const TinyVocab vocab = tiny_vocab();
  const int64_t n_vocab = (int64_t)vocab.tokens.size();
  GgufWriter w;
  w.set_str("general.architecture", a);
  w.set_str("general.name", "cachetune tiny random " + a);
  w.set_u32(a + ".block_count", (uint32_t)o.n_layer);
  w.set_u32(a + ".context_length", (uint32_t)o.context_length);
  w.set_u32(a + ".embedding_length", (uint32_t)o.n_embd);
  w.set_u32(a + ".feed_forward_length", (uint32_t)o.n_ff);
  w.set_u32(a + ".attention.head_count", (uint32_t)o.n_head);
  w.set_u32(a + ".attention.head_count_kv", (uint32_t)o.n_head_kv);
  w.set_f32(a + ".rope.freq_base", o.rope_theta);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", o.rms_eps);
  w.set_u32(a + ".rope.dimension_count", (uint32_t)o.head_dim);
  if (!o.rope_scaling_type.empty()) {
    w.set_str(a + ".rope.scaling.type", o.rope_scaling_type);
    w.set_f32(a + ".rope.scaling.factor", o.rope_scaling_factor);
  }
  if (o.head_dim * o.n_head != o.n_embd) {
    w.set_u32(a + ".attention.key_length", (uint32_t)o.head_dim);
    w.set_u32(a + ".attention.value_length", (uint32_t)o.head_dim);
  }
  w.set_u32(a + ".vocab_size", (uint32_t)n_vocab);
  w.set_str("tokenizer.ggml.model", "gpt2");
  w.set_str("tokenizer.ggml.pre", "smollm");
  w.set_str_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.token_type);
  w.set_str_array("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", (uint32_t)vocab.im_start);
  w.set_u32("tokenizer.ggml.eos_token_id", (uint32_t)vocab.im_end);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_str("tokenizer.chat_template",
            o.chat_template.empty() ? kTinyChatTemplate : o.chat_template);

  // Scales: embeddings ~0.1 so that RMS-normalised inputs are O(1); projections 0.05 (about
  // 0.4/sqrt(fan_in)) so that each residual update stays small; norm gains near 1.
  WeightGen gen(o.seed);
  auto add = [&](const std::string& name, GgmlType type, std::vector<int64_t> ne, float mean,
                 float stddev) {
    const std::vector<float> v = gen.normal(ne, mean, stddev);
    w.add_tensor(name, type, ne, v.data());
  };
  const int64_t e = o.n_embd;
  add("token_embd.weight", embd_type, {e, n_vocab}, 0.0f, 0.1f);
  for (int i = 0; i < o.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    add(p + "attn_norm.weight", GgmlType::F32, {e}, 1.0f, 0.05f);
    add(p + "attn_q.weight", o.weight_type, {e, n_q}, 0.0f, 0.05f);
    add(p + "attn_k.weight", o.weight_type, {e, n_kv}, 0.0f, 0.05f);
    add(p + "attn_v.weight", o.weight_type, {e, n_kv}, 0.0f, 0.05f);
    if (o.qkv_bias.value_or(a == "qwen2")) {
      add(p + "attn_q.bias", GgmlType::F32, {n_q}, 0.0f, 0.02f);
      add(p + "attn_k.bias", GgmlType::F32, {n_kv}, 0.0f, 0.02f);
      add(p + "attn_v.bias", GgmlType::F32, {n_kv}, 0.0f, 0.02f);
    }
    add(p + "attn_output.weight", o.weight_type, {n_q, e}, 0.0f, 0.05f);
    add(p + "ffn_norm.weight", GgmlType::F32, {e}, 1.0f, 0.05f);
    add(p + "ffn_gate.weight", o.weight_type, {e, o.n_ff}, 0.0f, 0.05f);
    add(p + "ffn_up.weight", o.weight_type, {e, o.n_ff}, 0.0f, 0.05f);
    add(p + "ffn_down.weight", o.weight_type, {o.n_ff, e}, 0.0f, 0.05f);
  }
  add("output_norm.weight", GgmlType::F32, {e}, 1.0f, 0.05f);
  if (!o.tied_output) add("output.weight", o.weight_type, {e, n_vocab}, 0.0f, 0.1f);
  if (!o.rope_freq_factors.empty()) {
    w.add_tensor("rope_freqs.weight", GgmlType::F32, {(int64_t)o.rope_freq_factors.size()},
                 o.rope_freq_factors.data());
  }
  w.write(path, o.gguf_version);
  return path;
}

std::vector<int32_t> random_byte_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace ct::test
