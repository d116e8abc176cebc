// libFuzzer target: the HTTP API's request parsing (server/api.h) on arbitrary body text, the way
// the server runs it: parse_json_body, then parse_chat_request (/v1/chat/completions),
// parse_completion_request (/v1/completions) and prompt_tokens on a byte-level vocabulary, and
// parse_chunks on the "chunks" member (/v1/chunks). A bad request must be a RequestError (a 400
// naming the field); any other exception, crash or sanitizer report is a finding.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "model/tokenizer.h"
#include "server/api.h"

namespace {

// A byte-level BPE vocabulary of the 256 bytes (GPT-2's byte-to-unicode form) and two control
// tokens, so that prompts tokenise and ids are range-checked against 258.
const ct::Tokenizer& byte_vocab() {
  static const ct::Tokenizer tok = [] {
    ct::VocabSpec s;
    s.pre = "gpt2";
    for (int b = 0; b < 256; ++b) {
      int cp = b;
      if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae))) {
        static int next = 256;
        cp = next++;
      }
      std::string u;
      if (cp < 0x80) {
        u.push_back((char)cp);
      } else {
        u.push_back((char)(0xc0 | (cp >> 6)));
        u.push_back((char)(0x80 | (cp & 0x3f)));
      }
      s.tokens.push_back(u);
    }
    s.tokens.push_back("<|im_start|>");
    s.tokens.push_back("<|im_end|>");
    s.token_types.assign(256, 1);
    s.token_types.push_back(3);
    s.token_types.push_back(3);
    s.eos = 257;
    // ChatML with the Hermes tool form, so that tools and tool turns are rendered too.
    s.chat_template =
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- \"\\n<tools>\" }}{%- for t in tools %}"
        "{{- \"\\n\" }}{{- t | tojson }}{%- endfor %}"
        "{{- \"\\n</tools><|im_end|>\\n\" }}{%- endif %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- '\", \"arguments\": ' }}"
        "{{- '}\\n</tool_call>' }}"
        "{{- '\\n<tool_response>\\n' }}{{- '\\n</tool_response>' }}<|im_start|>";
    return ct::Tokenizer::from_vocab(s);
  }();
  return tok;
}

// The checks both routes' parsed requests must pass.
void check_request(const ct::server::ChatRequest& r, const ct::server::ApiLimits& limits) {
  if (r.chunks.size() > (size_t)limits.max_chunks) ct::fuzz::finding("chunk limit not enforced");
  if (r.gen.max_tokens < (r.echo ? 0 : 1) || r.gen.max_tokens > limits.max_tokens_limit) {
    ct::fuzz::finding("max_tokens outside its limits");
  }
  if (r.gen.logprobs < -1 || r.gen.logprobs > ct::kMaxTopLogprobs) ct::fuzz::finding("logprobs");
  // echo (completions only): never streamed nor with chunks; the prompt scored with logprobs.
  if (r.echo && (!r.completion || r.stream || !r.chunks.empty())) ct::fuzz::finding("echo");
  if (r.gen.prompt_logprobs != (r.echo ? r.gen.logprobs : -1)) {
    ct::fuzz::finding("prompt_logprobs not echo's logprobs");
  }
  if (r.best_of < r.n || r.best_of > limits.max_choices || (r.best_of > r.n && r.stream)) {
    ct::fuzz::finding("best_of");
  }
  if (!(r.gen.sampling.repetition_penalty > 0 && r.gen.sampling.repetition_penalty <= 10)) {
    ct::fuzz::finding("repetition_penalty outside (0, 10]");
  }
  for (const auto& [id, bias] : r.gen.sampling.logit_bias) {
    if (id < 0 || !(bias >= -100 && bias <= 100)) ct::fuzz::finding("logit_bias entry");
  }
  // The prompt: a RequestError or tokens that fit the context.
  try {
    const ct::RagPromptTokens p = ct::server::prompt_tokens(r, byte_vocab(), 4096);
    if (p.n_tokens() + r.gen.max_tokens > 4096 || p.query.empty()) ct::fuzz::finding("prompt");
    for (int32_t id : p.query) {
      if (id < 0 || id >= byte_vocab().n_vocab()) ct::fuzz::finding("prompt id out of range");
    }
  } catch (const ct::server::RequestError&) {
  }
}

}  // namespace

// The tool-call reader on arbitrary answer text: calls hold a name and an object's JSON text,
// and content is held back from the first "<tool_call>" on.
void check_tool_reader(const std::string& text) {
  for (bool forced : {false, true}) {
    const ct::server::ToolCallsParsed p = ct::server::parse_tool_calls(text, forced);
    for (const ct::server::ToolCall& c : p.calls) {
      const nlohmann::json a = nlohmann::json::parse(c.arguments, nullptr, false);
      if (a.is_discarded() || !a.is_object()) ct::fuzz::finding("tool call arguments");
    }
    if (p.calls.empty() && p.content != text) ct::fuzz::finding("text lost without calls");
    const size_t n = ct::server::tool_stream_ready(text, 0, forced);
    if (n > text.size() || (forced && n != 0)) ct::fuzz::finding("tool_stream_ready");
    const size_t at = text.find("<tool_call>");
    if (at != std::string::npos && n > at) ct::fuzz::finding("a call streamed as content");
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  check_tool_reader(text);
  ct::server::ApiLimits limits;
  limits.max_chunks = 8;
  limits.max_chunk_bytes = 64;  // small, so the fuzzer reaches the size checks
  nlohmann::json body;
  try {
    body = ct::server::parse_json_body(text);
  } catch (const ct::server::RequestError& e) {
    if (e.status() != 400) ct::fuzz::finding("malformed JSON is not a 400:", e.what());
    return 0;
  }
  try {
    check_request(ct::server::parse_chat_request(body, limits, text), limits);
  } catch (const ct::server::RequestError&) {
  }
  try {
    check_request(ct::server::parse_completion_request(body, limits), limits);
  } catch (const ct::server::RequestError&) {
  }
  try {
    if (body.is_object() && body.contains("chunks")) {
      for (const std::string& c : ct::server::parse_chunks(body["chunks"], limits)) {
        if (c.empty() || c.size() > limits.max_chunk_bytes) ct::fuzz::finding("chunk size");
      }
    }
  } catch (const ct::server::RequestError&) {
  }
  return 0;
}
