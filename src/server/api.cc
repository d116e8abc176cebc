// Parsing and formatting of the OpenAI-compatible chat API (see api.h).
#include "server/api.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "model/json_constraint.h"
#include "model/stop_matcher.h"

namespace ct::server {
namespace {

using nlohmann::json;

// Tool definitions and arguments are walked recursively (dumped, shown as the template shows
// them) and read again with their keys in order (nlohmann's ordered_json compares each new key
// with every earlier one): values nesting deeper, or with objects of more keys, are refused
// before either happens (an 8 MiB body nests millions of levels or holds a million keys).
constexpr int kMaxToolDepth = 64;
// The Hermes form's call block (Tokenizer::apply_chat_template writes the same).
const std::string kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr size_t kMaxToolKeys = 1024;

// Whether v nests no deeper than `depth` levels and no object of it has more than kMaxToolKeys
// keys (checked without going deeper).
bool shape_within(const json& v, int depth) {
  if (!v.is_structured()) return true;
  if (depth <= 0 || (v.is_object() && v.size() > kMaxToolKeys)) return false;
  for (const auto& x : v) {
    if (!shape_within(x, depth - 1)) return false;
  }
  return true;
}

// JSON text read with its keys in order, once its shape passes shape_within (read first
// without the order); nullopt for text that is not JSON or does not pass.
std::optional<nlohmann::ordered_json> parse_in_order(const std::string& text) {
  const json plain = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (plain.is_discarded() || !shape_within(plain, kMaxToolDepth)) return std::nullopt;
  return nlohmann::ordered_json::parse(text);
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw RequestError(400, param, message);
}

std::string type_name(const json& v) { return v.type_name(); }

const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

int int_field(const json& obj, const char* name, int lo, int hi, int fallback) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) {
    bad(name,
        fmt::format("'{}' is a {}; expected an integer in [{}, {}]", name, type_name(*v), lo, hi));
  }
  // Values above INT64_MAX are unsigned in the JSON: compare them as such, not wrapped.
  const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t x = too_big ? 0 : v->get<int64_t>();
  if (too_big || x < lo || x > hi) {
    bad(name, fmt::format("'{}' = {}; expected an integer in [{}, {}]", name, v->dump(), lo, hi));
  }
  return static_cast<int>(x);
}

double number_field(const json& obj, const char* name, double lo, double hi, double fallback) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_number()) {
    bad(name,
        fmt::format("'{}' is a {}; expected a number in [{}, {}]", name, type_name(*v), lo, hi));
  }
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    bad(name, fmt::format("'{}' = {}; expected a number in [{}, {}]", name, x, lo, hi));
  }
  return x;
}

// Messages and their parts are reported under param "messages", as OpenAI does.
std::string string_field(const json& obj, const char* name, const std::string& where) {
  const json* v = field(obj, name);
  if (!v) bad("messages", fmt::format("{} has no '{}'; expected a string", where, name));
  if (!v->is_string()) {
    bad("messages", fmt::format("{}.{} is a {}; expected a string", where, name, type_name(*v)));
  }
  return v->get<std::string>();
}

// OpenAI allows content as a string or as an array of parts; only text parts mean anything here.
std::string message_content(const json& m, const std::string& where) {
  const json* c = field(m, "content");
  if (!c) bad("messages", where + " has no 'content'");
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) {
    bad("messages", fmt::format("{}.content is a {}; expected a string or an array of text parts",
                                where, type_name(*c)));
  }
  std::string text;
  for (size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string pw = fmt::format("{}.content[{}]", where, i);
    if (!part.is_object() || string_field(part, "type", pw) != "text") {
      bad("messages", pw + ": only parts of type \"text\" are supported");
    }
    text += string_field(part, "text", pw);
  }
  return text;
}

// Whether s is well-formed UTF-8 (shortest forms, no surrogates, at most U+10FFFF).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80           ? 1
                  : (c >> 5) == 0x6  ? 2
                  : (c >> 4) == 0xe  ? 3
                  : (c >> 3) == 0x1e ? 4
                                     : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (int j = 1; j < n; ++j) {
      const unsigned char d = s[i + j];
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// A token piece's bytes as a JSON array of numbers (OpenAI's "bytes", llama-server's pieces
// that are not UTF-8).
json piece_bytes(const std::string& piece) {
  json bytes = json::array();
  for (unsigned char b : piece) bytes.push_back((int)b);
  return bytes;
}

// The fields every response object opens with.
json envelope(const char* object, const std::string& id, const std::string& model_id,
              int64_t created) {
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model_id}};
}

void expect_object(const json& body) {
  if (!body.is_object())
    bad("", "request body is a JSON " + type_name(body) + "; expected an object");
}

// The fields both routes share: model, the chunk extension, generation. r.completion is set
// before (it changes the default instruction).
void parse_shared(const json& body, const ApiLimits& limits, ChatRequest& r) {
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", "'model' is a " + type_name(*m) + "; expected a string");
    r.model = m->get<std::string>();
  }
  // Chunk-aware extension: documents reused from the chunk cache.
  if (const json* chunks = field(body, "chunks")) r.chunks = parse_chunks(*chunks, limits);

  r.sel.policy = limits.default_policy;
  r.answer.auto_ratio = limits.default_auto_ratio;
  // A chat request with documents gets the QA instruction; a completion's prompt is raw.
  r.answer.instruction = r.chunks.empty() || r.completion ? "" : kQaInstruction;
  if (const json* ct = field(body, "cachetune")) {
    if (!ct->is_object())
      bad("cachetune", "'cachetune' is a " + type_name(*ct) + "; expected an object");
    for (const auto& [key, _] : ct->items()) {
      if (key != "policy" && key != "ratio" && key != "alpha" && key != "instruction" &&
          key != "seed") {
        bad("cachetune", fmt::format("cachetune.{} is not a known option; expected policy, ratio, "
                                     "alpha, instruction or seed",
                                     key));
      }
    }
    if (const json* p = field(*ct, "policy")) {
      if (!p->is_string()) bad("cachetune.policy", "cachetune.policy must be a string");
      try {
        r.sel.policy.kind = &find_policy(p->get<std::string>());
      } catch (const Error& e) {
        bad("cachetune.policy", e.what());
      }
      if (r.sel.policy.kind->eval_only()) {
        bad("cachetune.policy", fmt::format("policy '{}' needs the full prefill's true drift and "
                                            "runs only in `cachetune eval`",
                                            r.sel.policy.kind->name()));
      }
    }
    if (const json* ratio = field(*ct, "ratio")) {
      if (ratio->is_string() && ratio->get<std::string>() == "auto") {
        r.answer.auto_ratio = true;
      } else {
        r.sel.policy.ratio = number_field(*ct, "ratio", 0.0, 1.0, 0.0);
        r.answer.auto_ratio = false;
      }
    }
    r.sel.policy.alpha = number_field(*ct, "alpha", 0.0, 1.0, r.sel.policy.alpha);
    if (const json* ins = field(*ct, "instruction")) {
      if (!ins->is_string()) bad("cachetune.instruction", "cachetune.instruction must be a string");
      r.answer.instruction = ins->get<std::string>();
    }
    if (const json* s = field(*ct, "seed")) {
      if (!s->is_number_unsigned() && !(s->is_number_integer() && s->get<int64_t>() >= 0)) {
        bad("cachetune.seed", "cachetune.seed must be a non-negative integer");
      }
      r.sel.policy.seed = s->get<uint64_t>();
    }
  }

  // Generation.
  const char* max_name =
      field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  // With echo, 0: the prompt alone (scored, with logprobs).
  r.gen.max_tokens =
      int_field(body, max_name, r.echo ? 0 : 1, limits.max_tokens_limit, limits.default_max_tokens);
  r.gen.sampling.temperature = static_cast<float>(number_field(body, "temperature", 0.0, 2.0, 0.0));
  r.gen.sampling.top_p = static_cast<float>(number_field(body, "top_p", 0.0, 1.0, 1.0));
  if (r.gen.sampling.top_p <= 0.0f) bad("top_p", "'top_p' = 0; expected a number in (0, 1]");
  // OpenAI has no top_k (nucleus sampling alone); vLLM's and llama-server's extension sets it
  // (-1 or 0: off).
  r.gen.sampling.top_k = std::max(0, int_field(body, "top_k", -1, INT32_MAX, 0));
  r.gen.sampling.min_p = static_cast<float>(number_field(body, "min_p", 0.0, 1.0, 0.0));
  // vLLM's multiplicative penalty over the prompt's and the answer's tokens (llama-server's
  // repeat_penalty over its last tokens).
  r.gen.sampling.repetition_penalty =
      static_cast<float>(number_field(body, "repetition_penalty", 0.0, 10.0, 1.0));
  if (r.gen.sampling.repetition_penalty <= 0.0f) {
    bad("repetition_penalty", "'repetition_penalty' = 0; expected a number in (0, 10] (1: off)");
  }
  r.gen.sampling.frequency_penalty =
      static_cast<float>(number_field(body, "frequency_penalty", -2.0, 2.0, 0.0));
  r.gen.sampling.presence_penalty =
      static_cast<float>(number_field(body, "presence_penalty", -2.0, 2.0, 0.0));
  if (const json* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) {
      bad("logit_bias", "'logit_bias' is a " + type_name(*lb) +
                            "; expected an object of token ids and biases in [-100, 100]");
    }
    for (const auto& [key, v] : lb->items()) {
      // A token id in decimal, as OpenAI's keys are; its range is checked against the model.
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
      }
      if (key.empty() || used != key.size() || id < 0 || id > INT32_MAX ||
          !std::isdigit((unsigned char)key[0])) {
        bad("logit_bias", fmt::format("logit_bias key \"{}\" is not a token id (a non-negative "
                                      "integer)",
                                      key));
      }
      if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 100) {
        bad("logit_bias", fmt::format("logit_bias[\"{}\"] = {}; expected a number in [-100, 100]",
                                      key, v.dump()));
      }
      for (const auto& [seen, _] : r.gen.sampling.logit_bias) {
        if (seen == id) bad("logit_bias", fmt::format("logit_bias names token {} twice", id));
      }
      r.gen.sampling.logit_bias.push_back({(int32_t)id, v.get<float>()});
    }
  }
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer())
      bad("seed", "'seed' is a " + type_name(*s) + "; expected an integer");
    r.gen.sampling.seed = static_cast<uint64_t>(s->get<int64_t>());
  }
  r.n = int_field(body, "n", 1, limits.max_choices, 1);
  r.best_of = r.n;  // the completions route's best_of may ask for more
  if (const json* st = field(body, "stop")) r.gen.stop = parse_stop(*st);
  if (field(body, "functions") || field(body, "function_call"))
    bad("functions",
        "'functions' and 'function_call' (deprecated by OpenAI) are not supported; "
        "send 'tools' and 'tool_choice'");
  // JSON output: {"type": "json_object"} constrains the answer to one JSON object,
  // {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}} to one
  // JSON value the schema accepts (JsonSchema: a schema with a keyword it does not check is
  // refused, never answered with unchecked text).
  if (const json* rf = field(body, "response_format")) {
    const json* t = rf->is_object() ? field(*rf, "type") : nullptr;
    const std::string type = t && t->is_string() ? t->get<std::string>() : "";
    if (type == "json_object") {
      r.gen.json_object = true;
    } else if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        bad("response_format",
            "response_format json_schema needs a 'json_schema' object "
            "({\"name\": ..., \"schema\": {...}})");
      if (const json* n = field(*js, "name"); n && !n->is_string())
        bad("response_format",
            "response_format.json_schema.name is a " + type_name(*n) + "; expected a string");
      if (const json* st = field(*js, "strict"); st && !st->is_boolean())
        bad("response_format",
            "response_format.json_schema.strict is a " + type_name(*st) + "; expected a boolean");
      const json* schema = field(*js, "schema");
      if (!schema) bad("response_format", "response_format.json_schema.schema is missing");
      try {
        r.gen.json_schema = JsonSchema::compile(*schema);
      } catch (const Error& e) {
        bad("response_format", std::string("response_format.json_schema.schema: ") + e.what());
      }
    } else if (type != "text") {
      bad("response_format",
          "'response_format' must be {\"type\": \"text\"}, "
          "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
          "\"json_schema\": {...}}");
    }
  }
  if (const json* s = field(body, "stream")) {
    if (!s->is_boolean()) bad("stream", "'stream' is a " + type_name(*s) + "; expected a boolean");
    r.stream = s->get<bool>();
  }
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) {
      bad("stream_options", "'stream_options' is a " + type_name(*so) + "; expected an object");
    }
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with \"stream\": true");
    if (const json* iu = field(*so, "include_usage")) {
      if (!iu->is_boolean())
        bad("stream_options", "stream_options.include_usage must be a boolean");
      r.include_usage = iu->get<bool>();
    }
  }
  // llama-server's and vLLM's extension: generate max_tokens tokens even past end-of-generation.
  if (const json* s = field(body, "ignore_eos")) {
    if (!s->is_boolean())
      bad("ignore_eos", "'ignore_eos' is a " + type_name(*s) + "; expected a boolean");
    r.gen.stop_at_eog = !s->get<bool>();
  }
  if ((r.gen.json_object || r.gen.json_schema) && !r.gen.stop_at_eog)
    bad("ignore_eos",
        "'ignore_eos' with a JSON response_format: the answer ends with the "
        "JSON value");
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": JSON text of an object}}], the arguments shown as the template's tojson shows the
// object.
std::vector<ChatToolCall> tool_calls_of(const json& calls, const std::string& where) {
  if (!calls.is_array() || calls.empty())
    bad("messages", where + ".tool_calls must be a non-empty array of calls");
  std::vector<ChatToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
    const json& c = calls[k];
    if (!c.is_object()) bad("messages", cw + " is a " + type_name(c) + "; expected an object");
    if (const json* t = field(c, "type"); t && (!t->is_string() || *t != "function"))
      bad("messages", cw + ".type must be \"function\"");
    const json* f = field(c, "function");
    if (!f || !f->is_object()) bad("messages", cw + " has no 'function' object");
    ChatToolCall tc;
    tc.name = string_field(*f, "name", cw + ".function");
    if (tc.name.empty()) bad("messages", cw + ".function.name is empty");
    const std::optional<nlohmann::ordered_json> parsed =
        parse_in_order(string_field(*f, "arguments", cw + ".function"));
    if (!parsed || !parsed->is_object()) {
      bad("messages", fmt::format("{}.function.arguments must be the JSON text of an object "
                                  "(nesting at most {} levels, at most {} keys an object)",
                                  cw, kMaxToolDepth, kMaxToolKeys));
    }
    tc.arguments = template_json(*parsed);
    out.push_back(std::move(tc));
  }
  return out;
}

// The references of a tool's parameters schema, which point into that schema ("#..."), made to
// point where the call's schema keeps it (base, "#/$defs/toolI"). Values that are data, not
// schemas (const, enum, default, examples), are left as they are.
void rebase_refs(json& s, const std::string& base) {
  if (s.is_array()) {
    for (json& x : s) rebase_refs(x, base);
    return;
  }
  if (!s.is_object()) return;
  for (auto& [k, v] : s.items()) {
    if (k == "$ref" && v.is_string()) {
      const std::string t = v.get<std::string>();
      if (!t.empty() && t[0] == '#') v = base + t.substr(1);
    } else if (k != "const" && k != "enum" && k != "default" && k != "examples") {
      rebase_refs(v, base);
    }
  }
}

// A function name as OpenAI allows it: 1-64 of a-z, A-Z, 0-9, '_' and '-'.
bool tool_name_ok(const std::string& n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum((unsigned char)c) || c == '_' || c == '-';
  });
}

constexpr size_t kMaxTools = 128;

// The body's "tools" read again from its text with the keys in the client's order (the other
// members skipped); null when there is no text or it does not match the parsed tools.
std::optional<nlohmann::ordered_json> tools_in_order(const std::string& body_text, size_t n) {
  if (body_text.empty()) return std::nullopt;
  nlohmann::ordered_json body = nlohmann::ordered_json::parse(
      body_text, [](int depth, nlohmann::ordered_json::parse_event_t e, nlohmann::ordered_json& v) {
        return !(depth == 1 && e == nlohmann::ordered_json::parse_event_t::key && v != "tools");
      });
  const auto it = body.find("tools");
  if (it == body.end() || !it->is_array() || it->size() != n) return std::nullopt;
  return std::move(*it);
}

// tools, tool_choice and parallel_tool_calls of a chat request; with tool_choice "required" or a
// named function, the schema the call must satisfy (GenerateOptions::json_schema). The
// definitions are shown in the key order of body_text where given (parse_chat_request).
void parse_tools(const json& body, const std::string& body_text, ChatRequest& r) {
  const json* tools = field(body, "tools");
  if (tools) {
    if (!tools->is_array())
      bad("tools", "'tools' is a " + type_name(*tools) + "; expected an array of tools");
    if (tools->size() > kMaxTools)
      bad("tools", fmt::format("'tools' holds {} tools; at most {}", tools->size(), kMaxTools));
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object()) bad("tools", where + " is a " + type_name(t) + "; expected an object");
      const json* type = field(t, "type");
      if (!type || *type != "function")
        bad("tools", where + ".type must be \"function\" (the only kind of tool)");
      const json* f = field(t, "function");
      if (!f || !f->is_object()) bad("tools", where + " has no 'function' object");
      const json* name = field(*f, "name");
      if (!name || !name->is_string() || !tool_name_ok(name->get<std::string>()))
        bad("tools", where + ".function.name must be 1-64 letters, digits, '_' or '-'");
      if (const json* d = field(*f, "description"); d && !d->is_string())
        bad("tools", where + ".function.description is a " + type_name(*d) + "; expected a string");
      if (const json* p = field(*f, "parameters"); p && !p->is_object())
        bad("tools", where + ".function.parameters is a " + type_name(*p) +
                         "; expected a JSON schema object");
      if (const json* st = field(*f, "strict"); st && !st->is_boolean())
        bad("tools", where + ".function.strict is a " + type_name(*st) + "; expected a boolean");
      if (!shape_within(t, kMaxToolDepth))
        bad("tools", fmt::format("{} nests deeper than {} levels or has an object of more than {} "
                                 "keys",
                                 where, kMaxToolDepth, kMaxToolKeys));
      const std::string n = name->get<std::string>();
      if (std::find(r.tool_names.begin(), r.tool_names.end(), n) != r.tool_names.end())
        bad("tools", fmt::format("{}: a second tool named \"{}\"", where, n));
      r.tool_names.push_back(n);
    }
    // Validated: each definition shown once, in the client's order where the text is at hand.
    const std::optional<nlohmann::ordered_json> ordered = tools_in_order(body_text, tools->size());
    for (size_t i = 0; i < tools->size(); ++i) {
      r.tools.push_back(template_json(ordered ? (*ordered)[i]
                                              : nlohmann::ordered_json::parse((*tools)[i].dump())));
    }
  }
  if (const json* tc = field(body, "tool_choice")) {
    const std::string s = tc->is_string() ? tc->get<std::string>() : "";
    if (s == "none") {
      r.tool_choice = ToolChoice::kNone;
    } else if (s == "auto") {
      r.tool_choice = ToolChoice::kAuto;
    } else if (s == "required") {
      r.tool_choice = ToolChoice::kRequired;
    } else if (tc->is_object()) {
      const json* f = field(*tc, "function");
      const json* n = f && f->is_object() ? field(*f, "name") : nullptr;
      if (!n || !n->is_string() || field(*tc, "type") == nullptr ||
          *field(*tc, "type") != "function")
        bad("tool_choice",
            "'tool_choice' as an object must be {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}");
      r.tool_choice = ToolChoice::kNamed;
      r.tool_name = n->get<std::string>();
      if (std::find(r.tool_names.begin(), r.tool_names.end(), r.tool_name) == r.tool_names.end())
        bad("tool_choice",
            fmt::format("tool_choice names \"{}\", which is not one of 'tools'", r.tool_name));
    } else {
      bad("tool_choice",
          "'tool_choice' must be \"none\", \"auto\", \"required\" or "
          "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (r.tools.empty() && r.tool_choice != ToolChoice::kNone)
      bad("tool_choice", "'tool_choice' needs 'tools' (a non-empty array)");
  }
  if (const json* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean())
      bad("parallel_tool_calls",
          "'parallel_tool_calls' is a " + type_name(*p) + "; expected a boolean");
    r.parallel_tool_calls = p->get<bool>();
  }
  if (!r.forces_tool_call()) return;
  if (r.gen.json_object || r.gen.json_schema)
    bad("tool_choice",
        "tool_choice \"required\" or a named function with a JSON "
        "response_format: the answer is the call");
  if (!r.gen.stop_at_eog)
    bad("ignore_eos",
        "'ignore_eos' with tool_choice \"required\" or a named function: the "
        "answer ends with the call");
  // The call's object: the function's name, then its arguments under its parameters' schema,
  // kept under the root's $defs (its own references rebased there); several allowed functions
  // form a union told apart by the name.
  json alts = json::array(), defs = json::object();
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& f = (*tools)[i]["function"];
    const std::string n = f["name"].get<std::string>();
    if (r.tool_choice == ToolChoice::kNamed && n != r.tool_name) continue;
    const std::string key = fmt::format("tool{}", i);
    const json* params = field(f, "parameters");
    json p = params ? *params : json{{"type", "object"}};
    rebase_refs(p, "#/$defs/" + key);
    json one = {
        {"type", "object"},
        {"properties", {{"name", {{"const", n}}}, {"arguments", {{"$ref", "#/$defs/" + key}}}}},
        {"required", {"name", "arguments"}},
        {"additionalProperties", false}};
    try {
      json alone = one;
      alone["$defs"] = {{key, p}};
      JsonSchema::compile(alone);
    } catch (const Error& e) {
      bad("tools", fmt::format("tools[{}].function.parameters: {} (tool_choice \"required\" or "
                               "named holds the call to its schema)",
                               i, e.what()));
    }
    defs[key] = std::move(p);
    alts.push_back(std::move(one));
  }
  json schema = alts.size() == 1 ? alts[0] : json{{"anyOf", alts}};
  schema["$defs"] = std::move(defs);
  try {
    r.gen.json_schema = JsonSchema::compile(schema);
  } catch (const Error& e) {
    bad("tools", std::string("the tools' call schema: ") + e.what());
  }
}

}  // namespace

json parse_json_body(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers a double cannot hold
    throw RequestError(400, "", fmt::format("request body is not valid JSON: {}", e.what()));
  }
}

ChatRequest parse_chat_request(const json& body, const ApiLimits& limits,
                               const std::string& body_text) {
  expect_object(body);
  ChatRequest r;

  // Messages: everything before the final user message is history; that message is the question.
  const json* msgs = field(body, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty()) {
    bad("messages", "'messages' must be a non-empty array of {role, content} objects");
  }
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad("messages", where + " is a " + type_name(m) + "; expected an object");
    const std::string role = string_field(m, "role", where);
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      bad("messages",
          fmt::format("{}.role = \"{}\"; expected system, user, assistant or tool", where, role));
    }
    // An assistant message that made tool calls may have no content.
    const json* calls = role == "assistant" ? field(m, "tool_calls") : nullptr;
    const std::string content = calls && !field(m, "content") ? "" : message_content(m, where);
    if (role == "tool") {
      if (const json* id = field(m, "tool_call_id"); id && !id->is_string())
        bad("messages", where + ".tool_call_id is a " + type_name(*id) + "; expected a string");
    }
    if (i + 1 == msgs->size()) {
      if (role != "user" && role != "tool") {
        bad("messages", fmt::format("the last message has role \"{}\"; expected \"user\" (the "
                                    "question the answer is for) or \"tool\" (a tool's result)",
                                    role));
      }
      r.question = content;
      r.question_role = role;
    } else {
      r.answer.history.push_back(
          {role, content, calls ? tool_calls_of(*calls, where) : std::vector<ChatToolCall>{}});
    }
  }

  parse_shared(body, limits, r);
  parse_tools(body, body_text, r);
  if (const json* lp = field(body, "logprobs")) {
    if (!lp->is_boolean())
      bad("logprobs", "'logprobs' is a " + type_name(*lp) + "; expected a boolean");
    if (lp->get<bool>()) r.gen.logprobs = 0;
  }
  if (field(body, "top_logprobs")) {
    const int k = int_field(body, "top_logprobs", 0, kMaxTopLogprobs, 0);
    if (r.gen.logprobs < 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.gen.logprobs = k;
  }
  return r;
}

ChatRequest parse_chat_request(const json& body, const ApiLimits& limits) {
  return parse_chat_request(body, limits, "");
}

namespace {

// An array of token ids (integers in [0, limit)), refused as field `param` (named `where` in
// the message) otherwise. limit: the vocabulary's size, or 2^31 where it is checked later.
std::vector<int32_t> token_ids(const json& a, const char* param, const std::string& where,
                               int64_t limit = (int64_t)INT32_MAX + 1) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& v = a[i];
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() < (uint64_t)limit
                                                 : v.is_number_integer() && v.get<int64_t>() >= 0 &&
                                                       v.get<int64_t>() < limit;
    if (!in_range) {
      bad(param, fmt::format("{}[{}] = {}; expected a token id (a non-negative integer below {})",
                             where, i, v.dump(), limit));
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace

ChatRequest parse_completion_request(const json& body, const ApiLimits& limits) {
  expect_object(body);
  ChatRequest r;
  if (field(body, "messages")) {
    bad("messages", "/v1/completions takes a 'prompt'; send messages to /v1/chat/completions");
  }
  if (field(body, "tools") || field(body, "tool_choice"))
    bad("tools", "/v1/completions takes no tools; send them to /v1/chat/completions");
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is missing; expected a string or an array of token ids");
  CompletionPrompt cp;
  // OpenAI's forms: a string, an array of strings, token ids, or an array of token-id arrays.
  // Each prompt is answered on its own there; here one request is one prompt (n asks for several
  // choices of it).
  const json* one = p;
  if (p->is_array() && !p->empty() && !(*p)[0].is_number()) {
    if (p->size() != 1) {
      bad("prompt", fmt::format("'prompt' holds {} prompts; this server answers one prompt per "
                                "request: send them as separate requests",
                                p->size()));
    }
    one = &(*p)[0];
  }
  if (one->is_string()) {
    cp.text = one->get<std::string>();
    if (cp.text.empty()) bad("prompt", "'prompt' is an empty string; expected text");
  } else if (one->is_array()) {
    const std::string where = one == p ? "prompt" : "prompt[0]";
    if (one->empty()) bad("prompt", where + " is an empty array; expected token ids");
    cp.ids = token_ids(*one, "prompt", where);
  } else {
    bad("prompt", fmt::format("'prompt' is a {}; expected a string or an array of token ids",
                              type_name(*one)));
  }
  r.completion = std::move(cp);
  if (const json* e = field(body, "echo")) {
    if (!e->is_boolean()) bad("echo", "'echo' is a " + type_name(*e) + "; expected a boolean");
    r.echo = e->get<bool>();
  }
  if (const json* sfx = field(body, "suffix");
      sfx && !(sfx->is_string() && sfx->get_ref<const std::string&>().empty())) {
    bad("suffix", "'suffix' is not supported (no insertion mode)");
  }
  parse_shared(body, limits, r);
  if (field(body, "logprobs")) r.gen.logprobs = int_field(body, "logprobs", 0, kMaxTopLogprobs, 0);
  r.best_of = int_field(body, "best_of", 1, limits.max_choices, r.n);
  if (r.best_of < r.n) {
    bad("best_of",
        fmt::format("'best_of' = {} is less than 'n' = {}; expected best_of >= n", r.best_of, r.n));
  }
  if (r.best_of > r.n && r.stream) {
    bad("best_of",
        "'best_of' > 'n' with \"stream\": true is not supported (the best are known "
        "only at the end)");
  }
  if (r.echo) {
    if (r.stream)
      bad("echo", "'echo' with \"stream\": true is not supported; ask for a whole response");
    if (!r.chunks.empty()) {
      bad("echo",
          "'echo' with 'chunks' is not supported: the documents' rows are reused, not "
          "computed, so the prompt cannot be scored; put the text in 'prompt'");
    }
    r.gen.prompt_logprobs = r.gen.logprobs;  // the prompt scored when logprobs are asked for
  }
  return r;
}

RagPromptTokens prompt_tokens(const ChatRequest& r, const Tokenizer& tok, int n_ctx) {
  RagPromptTokens p;
  const char* param = r.completion ? "prompt" : "messages";
  if (!r.completion) {
    ToolTurns tt;
    if (r.tool_choice != ToolChoice::kNone) tt.tools = r.tools;
    tt.question_role = r.question_role;
    try {
      p = build_rag_prompt(tok, r.chunks, r.question, r.answer.instruction, r.answer.history, tt);
    } catch (const Error& e) {
      // A template without the tool form: the model cannot be shown tools or their turns.
      if (tok.supports_tools()) throw;
      bad(tt.tools.empty() ? "messages" : "tools", e.what());
    }
    if (r.forces_tool_call()) {  // the answer starts inside the call's block
      const std::vector<int32_t> open = tok.encode(kCallOpen + "\n", /*parse_special=*/true, false);
      p.query.insert(p.query.end(), open.begin(), open.end());
    }
  } else {
    const CompletionPrompt& c = *r.completion;
    for (size_t i = 0; i < c.ids.size(); ++i) {
      if (c.ids[i] >= tok.n_vocab()) {
        bad("prompt", fmt::format("prompt token {} is id {}; this model's ids are [0, {})", i,
                                  c.ids[i], tok.n_vocab()));
      }
    }
    p = c.text.empty() ? build_raw_prompt(tok, r.chunks, r.answer.instruction, c.ids)
                       : build_raw_prompt(tok, r.chunks, r.answer.instruction, c.text);
    if (p.query.empty()) {
      bad("prompt",
          "the prompt has no tokens after tokenisation (only bytes the model's "
          "vocabulary lacks)");
    }
  }
  for (const auto& [id, bias] : r.gen.sampling.logit_bias) {
    if (id >= tok.n_vocab()) {
      bad("logit_bias", fmt::format("logit_bias names token {}; this model's ids are [0, {})", id,
                                    tok.n_vocab()));
    }
  }
  const int n = p.n_tokens();
  if (n_ctx > 0 && n + r.gen.max_tokens > n_ctx) {
    bad(param, fmt::format("prompt of {} tokens plus max_tokens {} exceeds the model context of {} "
                           "tokens",
                           n, r.gen.max_tokens, n_ctx));
  }
  return p;
}

json tokenize_body(const json& body, const ApiLimits& limits, const Tokenizer& tok, int n_ctx,
                   const std::string& body_text) {
  expect_object(body);
  const bool messages = field(body, "messages"), prompt = field(body, "prompt"),
             content = field(body, "content");
  if (messages + prompt + content != 1) {
    bad(messages ? "messages" : "prompt",
        "expected one of 'prompt' (or llama-server's 'content') and 'messages'");
  }
  ChatRequest r;
  if (messages) {
    r = parse_chat_request(body, limits, body_text);
  } else if (prompt) {
    r = parse_completion_request(body, limits);
  } else {  // llama-server's name for the prompt
    json b = body;
    b["prompt"] = std::move(b["content"]);
    b.erase("content");
    try {
      r = parse_completion_request(b, limits);
    } catch (const RequestError& e) {
      if (e.param() != "prompt") throw;
      throw RequestError(400, "content", std::string("'content' (the prompt): ") + e.what());
    }
  }
  const RagPromptTokens p = prompt_tokens(r, tok, 0);
  std::vector<int32_t> ids = p.prefix;
  for (const auto& c : p.chunks) ids.insert(ids.end(), c.begin(), c.end());
  ids.insert(ids.end(), p.query.begin(), p.query.end());
  json tokens = ids;
  if (const json* wp = field(body, "with_pieces")) {
    if (!wp->is_boolean())
      bad("with_pieces", "'with_pieces' is a " + type_name(*wp) + "; expected a boolean");
    if (wp->get<bool>()) {  // llama-server's form: {id, piece}, a piece's bytes where not UTF-8
      tokens = json::array();
      for (int32_t id : ids) {
        const std::string piece = tok.token_to_piece(id, /*render_special=*/true);
        const json shown = valid_utf8(piece) ? json(piece) : piece_bytes(piece);
        tokens.push_back({{"id", id}, {"piece", shown}});
      }
    }
  }
  return {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", n_ctx}};
}

json detokenize_body(const json& body, const Tokenizer& tok) {
  expect_object(body);
  const json* t = field(body, "tokens");
  if (!t || !t->is_array()) bad("tokens", "'tokens' must be an array of token ids");
  const std::string text =
      tok.decode(token_ids(*t, "tokens", "tokens", tok.n_vocab()), /*render_special=*/true);
  return {{"prompt", text}, {"content", text}};
}

std::vector<std::string> parse_stop(const json& stop) {
  std::vector<std::string> out;
  if (stop.is_string()) {
    out.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    for (size_t i = 0; i < stop.size(); ++i) {
      if (!stop[i].is_string()) {
        bad("stop", fmt::format("stop[{}] is a {}; expected a string", i, type_name(stop[i])));
      }
      out.push_back(stop[i].get<std::string>());
    }
  } else {
    bad("stop", "'stop' is a " + type_name(stop) + "; expected a string or an array of strings");
  }
  try {
    StopMatcher check(out);  // count, emptiness and length, with the matcher's own message
  } catch (const Error& e) {
    bad("stop", e.what());
  }
  return out;
}

std::vector<std::string> parse_chunks(const json& chunks, const ApiLimits& limits) {
  if (!chunks.is_array()) {
    bad("chunks", "'chunks' is a " + type_name(chunks) + "; expected an array of strings");
  }
  if (chunks.size() > static_cast<size_t>(limits.max_chunks)) {
    bad("chunks", fmt::format("{} chunks given; this server takes at most {}", chunks.size(),
                              limits.max_chunks));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& c = chunks[i];
    if (!c.is_string() || c.get_ref<const std::string&>().empty()) {
      bad("chunks", fmt::format("chunks[{}] is a {}; expected a non-empty string", i,
                                c.is_string() ? "empty string" : type_name(c)));
    }
    const std::string& text = c.get_ref<const std::string&>();
    if (text.size() > limits.max_chunk_bytes) {
      bad("chunks", fmt::format("chunks[{}] has {} bytes; this server takes at most {} per chunk",
                                i, text.size(), limits.max_chunk_bytes));
    }
    out.push_back(text);
  }
  return out;
}

json error_body(int status, const std::string& message, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", status >= 500 ? "server_error" : "invalid_request_error"},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::string template_json(const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += nlohmann::ordered_json(k).dump() + ": " + template_json(x);
      }
      return out + "}";
    }
    case nlohmann::ordered_json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + template_json(v[i]);
      return out + "]";
    }
    default:
      // Scalars as nlohmann writes them: strings escaped as json.dumps with ensure_ascii=False
      // escapes them (quote, backslash, control characters), numbers in their shortest form.
      return v.dump();
  }
}

namespace {

// The call a block's JSON text holds: {"name": string, "arguments": object}, in either order.
std::optional<ToolCall> call_of(const std::string& text) {
  const std::optional<nlohmann::ordered_json> parsed = parse_in_order(text);
  if (!parsed) return std::nullopt;
  const nlohmann::ordered_json& j = *parsed;
  if (!j.is_object() || j.size() != 2 || !j.contains("name") || !j.contains("arguments") ||
      !j["name"].is_string() || !j["arguments"].is_object()) {
    return std::nullopt;
  }
  return ToolCall{j["name"].get<std::string>(), j["arguments"].dump()};
}

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace((unsigned char)c); });
}

}  // namespace

ToolCallsParsed parse_tool_calls(const std::string& text, bool forced) {
  ToolCallsParsed none{text, {}};
  if (forced) {
    std::optional<ToolCall> c = call_of(text);
    if (!c) return none;
    return {std::nullopt, {std::move(*c)}};
  }
  const std::string &open = kCallOpen, &close = kCallClose;
  const size_t first = text.find(open);
  if (first == std::string::npos) return none;
  ToolCallsParsed out;
  const std::string before = text.substr(0, first);
  if (!blank(before)) out.content = before;
  for (size_t at = first; at < text.size();) {
    const size_t next = text.find(open, at);
    if (!blank(text.substr(at, next == std::string::npos ? std::string::npos : next - at)))
      return none;  // text between or after the blocks
    if (next == std::string::npos) break;
    const size_t end = text.find(close, next);
    if (end == std::string::npos) return none;
    std::optional<ToolCall> c = call_of(text.substr(next + open.size(), end - next - open.size()));
    if (!c) return none;
    out.calls.push_back(std::move(*c));
    at = end + close.size();
  }
  return out;
}

size_t tool_stream_ready(const std::string& text, size_t from, bool forced) {
  if (forced) return 0;
  const std::string& open = kCallOpen;
  size_t ready = text.size();
  if (const size_t at = text.find(open, from); at != std::string::npos) {
    ready = at;
  } else {
    // Hold a tail that may be the start of "<tool_call>".
    for (size_t k = std::min(open.size() - 1, text.size()); k > 0; --k) {
      if (text.compare(text.size() - k, k, open, 0, k) == 0) {
        ready = text.size() - k;
        break;
      }
    }
  }
  // Blank text before a call is no content (parse_tool_calls makes it null): wait for more.
  return from == 0 && blank(text.substr(0, ready)) ? 0 : ready;
}

std::string finish_reason(const Answer& a, const ChatRequest& r) {
  if (a.stopped_at_sequence) return "stop";
  return static_cast<int>(a.tokens.size()) >= r.gen.max_tokens ? "length" : "stop";
}

json answer_stats(const Answer& a, const ChatRequest& r) {
  json chunks = json::array();
  for (const ChunkInfo& c : a.chunks) {
    json one = {{"id", c.id}, {"n_tok", c.n_tok}, {"hit", c.hit}, {"tier", c.tier}};
    if (c.replaced) one["replaced"] = c.replaced;
    if (!c.note.empty()) one["note"] = c.note;
    chunks.push_back(std::move(one));
  }
  json out = {{"policy", r.sel.policy.kind->name()},
              {"device", a.device},
              {"ratio", a.ratio},
              {"ttft_ms", a.ttft_ms},
              {"lookup_ms", a.lookup_ms},
              {"select_ms", a.prefill.select_ms},
              {"compute_ms", a.prefill.compute_ms},
              {"load_ms", a.prefill.load_ms},
              {"load_wait_ms", a.prefill.load_wait_ms},
              {"logits_ms", a.prefill.logits_ms},
              {"decode_ms", a.decode_ms},
              {"recomputed_rows", a.prefill.n_active},
              {"loaded_rows", a.prefill.n_loaded},
              {"retries", a.retries},
              {"chunks", chunks}};
  if (!a.ratio_note.empty()) out["ratio_note"] = a.ratio_note;
  return out;
}

std::vector<Answer> best_answers(std::vector<Answer> all, int n) {
  // Each choice's log-probability per token (one with no tokens counts 0, as likely as can be).
  std::vector<std::pair<double, size_t>> score;
  for (size_t i = 0; i < all.size(); ++i) {
    double sum = 0;
    for (const TokenLogprob& t : all[i].logprobs) sum += t.logprob;
    score.push_back({all[i].logprobs.empty() ? 0.0 : sum / (double)all[i].logprobs.size(), i});
  }
  std::stable_sort(score.begin(), score.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Answer> best;
  for (size_t k = 0; k < score.size() && (int)k < n; ++k)
    best.push_back(std::move(all[score[k].second]));
  return best;
}

json usage(const std::vector<Answer>& answers) {
  int n_out = 0;
  for (const Answer& a : answers) n_out += static_cast<int>(a.tokens.size());
  const int n_prompt = answers.empty() ? 0 : answers[0].n_prompt;  // once, as OpenAI counts it
  return {{"prompt_tokens", n_prompt},
          {"completion_tokens", n_out},
          {"total_tokens", n_prompt + n_out}};
}

namespace {

// A token's text as logprobs show it: its piece (special tokens as their text), or, when the
// piece is part of a UTF-8 character, OpenAI's "bytes:\xNN..." spelling, so that no two such
// tokens collide as one key (the exact bytes are in chat's "bytes" too).
std::string logprob_token(const Tokenizer& tok, int32_t id) {
  const std::string piece = tok.token_to_piece(id, /*render_special=*/true);
  if (valid_utf8(piece)) return piece;
  std::string out = "bytes:";
  for (unsigned char b : piece) out += fmt::format("\\x{:02x}", b);
  return out;
}

// OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}.
json chat_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  const auto entry = [&](int32_t id, float lp) {
    return json{{"token", logprob_token(tok, id)},
                {"logprob", lp},
                {"bytes", piece_bytes(tok.token_to_piece(id, /*render_special=*/true))}};
  };
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    json e = entry(t.id, t.logprob);
    json top = json::array();
    for (const auto& [id, lp] : t.top) top.push_back(entry(id, lp));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", content}};
}

// The completions route's: parallel lists of tokens, their logprobs, a {token: logprob} object of
// the alternatives each (with the chosen token, as OpenAI's has), and each token's byte offset in
// the generated text (which leaves special tokens out: their offsets do not advance).
json completion_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                         size_t& text_offset) {
  json tokens = json::array(), lp = json::array(), top = json::array(), offset = json::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(logprob_token(tok, t.id));
    lp.push_back(t.logprob);
    json alt = json::object();
    for (const auto& [id, p] : t.top) alt[logprob_token(tok, id)] = p;
    alt[logprob_token(tok, t.id)] = t.logprob;
    top.push_back(std::move(alt));
    offset.push_back(text_offset);
    text_offset += tok.token_to_piece(t.id).size();
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", offset}};
}

// The completions route's logprobs of an echoed prompt (its tokens, `scores` holding the
// entries of all but the first) followed by the generated tokens' (lps): one list each, the
// first token's logprob and alternatives null, as OpenAI's.
json echoed_logprobs(const std::vector<int32_t>& prompt, const std::vector<TokenLogprob>& scores,
                     const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  CT_ASSERT(!prompt.empty() && scores.size() + 1 == prompt.size(),
            "{} prompt scores for a prompt of {} tokens", scores.size(), prompt.size());
  json out = {{"tokens", {logprob_token(tok, prompt[0])}},
              {"token_logprobs", {nullptr}},
              {"top_logprobs", {nullptr}},
              {"text_offset", {0}}};
  size_t at = tok.token_to_piece(prompt[0]).size();
  for (const std::vector<TokenLogprob>* part : {&scores, &lps}) {
    const json more = completion_logprobs(*part, tok, at);
    for (const auto& [key, list] : more.items()) {
      for (const json& x : list) out[key].push_back(x);
    }
  }
  return out;
}

}  // namespace

json logprobs_body(const ChatRequest& r, const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                   size_t& text_offset) {
  return r.completion ? completion_logprobs(lps, tok, text_offset) : chat_logprobs(lps, tok);
}

json tool_calls_body(const std::vector<ToolCall>& calls, const ChatRequest& r,
                     const std::string& id, int choice) {
  json out = json::array();
  for (size_t k = 0; k < calls.size() && (k == 0 || r.parallel_tool_calls); ++k) {
    out.push_back({{"index", k},
                   {"id", fmt::format("call_{}_{}_{}", id, choice, k)},
                   {"type", "function"},
                   {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
  }
  return out;
}

json response_body(const std::vector<Answer>& answers, const ChatRequest& r, const Tokenizer& tok,
                   const RagPromptTokens& prompt, const std::string& id,
                   const std::string& model_id, int64_t created) {
  CT_ASSERT(!answers.empty(), "a response of no choices");
  std::vector<int32_t> echoed;  // the prompt's tokens (echo takes no chunks)
  std::string echo_text;        // the prompt as sent, or what its tokens spell
  if (r.echo) {
    echoed = prompt.prefix;
    echoed.insert(echoed.end(), prompt.query.begin(), prompt.query.end());
    echo_text = r.completion && !r.completion->text.empty() && r.answer.instruction.empty()
                    ? r.completion->text
                    : tok.decode(echoed);
  }
  json choices = json::array();
  for (size_t i = 0; i < answers.size(); ++i) {
    const Answer& a = answers[i];
    json c = {{"index", i}, {"finish_reason", finish_reason(a, r)}};
    if (r.completion) {
      c["text"] = r.echo ? echo_text + a.text : a.text;
    } else if (r.reads_tool_calls()) {
      const ToolCallsParsed p = parse_tool_calls(a.text, r.forces_tool_call());
      c["message"] = {{"role", "assistant"},
                      {"content", p.content ? json(*p.content) : json(nullptr)}};
      if (!p.calls.empty()) {
        c["message"]["tool_calls"] = tool_calls_body(p.calls, r, id, (int)i);
        c["finish_reason"] = "tool_calls";
      }
    } else {
      c["message"] = {{"role", "assistant"}, {"content", a.text}};
    }
    size_t offset = 0;
    if (r.gen.logprobs < 0) {
      c["logprobs"] = nullptr;
    } else if (r.echo) {
      c["logprobs"] = echoed_logprobs(echoed, answers[0].prompt_logprobs, a.logprobs, tok);
    } else {
      c["logprobs"] = logprobs_body(r, a.logprobs, tok, offset);
    }
    choices.push_back(std::move(c));
  }
  json out = envelope(r.completion ? "text_completion" : "chat.completion", id, model_id, created);
  out["choices"] = std::move(choices);
  out["usage"] = usage(answers);
  out["cachetune"] = answer_stats(answers[0], r);
  return out;
}

json usage_event(const std::vector<Answer>& a, const ChatRequest& r, const std::string& id,
                 const std::string& model_id, int64_t created) {
  json out =
      envelope(r.completion ? "text_completion" : "chat.completion.chunk", id, model_id, created);
  out["choices"] = json::array();
  out["usage"] = usage(a);
  return out;
}

json stream_event(const ChatRequest& r, const std::string& id, const std::string& model_id,
                  int64_t created, const std::optional<std::string>& text,
                  const std::string& finish_reason, int index, const json& logprobs) {
  if (!r.completion) {
    json out = chat_chunk(id, model_id, created, text, std::nullopt, finish_reason, index);
    out["choices"][0]["logprobs"] = logprobs;
    return out;
  }
  json out = envelope("text_completion", id, model_id, created);
  out["choices"] = {
      {{"index", index},
       {"text", text.value_or("")},
       {"logprobs", logprobs},
       {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}}};
  return out;
}

json chat_chunk(const std::string& id, const std::string& model_id, int64_t created,
                const std::optional<std::string>& content, const std::optional<std::string>& role,
                const std::string& finish_reason, int index) {
  json delta = json::object();
  if (role) delta["role"] = *role;
  if (content) delta["content"] = *content;
  json out = envelope("chat.completion.chunk", id, model_id, created);
  out["choices"] = {
      {{"index", index},
       {"delta", delta},
       {"logprobs", nullptr},
       {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}}};
  return out;
}

}  // namespace ct::server
