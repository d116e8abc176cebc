// The OpenAI-compatible request/response format of `cachetune serve`, kept apart from the HTTP
// transport so it can be tested without sockets. A chat completion or a (legacy, raw-prompt)
// completion request may carry the chunk-aware extension: "chunks" (documents, each cached and
// reused on its own) and a "cachetune" object (policy, ratio, instruction). docs/SERVER.md
// describes the wire format.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "reuse/prompt.h"

namespace ct::server {

// A request the server refuses, with the HTTP status and OpenAI error fields to send.
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, std::string param, const std::string& message)
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }  // offending field, may be empty

 private:
  int status_;
  std::string param_;
};

// Server-wide defaults and limits a request is checked against.
struct ApiLimits {
  int default_max_tokens = 128;
  int max_tokens_limit = 1024;       // larger max_tokens is refused (400)
  int max_chunks = 64;               // more chunks is refused (400)
  int max_choices = 8;               // largest n (serve: --max-batch)
  size_t max_chunk_bytes = 1 << 20;  // one document's text
  PolicyOptions default_policy;      // kind, ratio, alpha when the request gives none
  bool default_auto_ratio = false;   // `serve --ratio auto`
};

// /v1/completions' prompt, used as the client wrote it (no chat template): text, or token ids.
struct CompletionPrompt {
  std::string text;          // tokenised with control tokens parsed (it may spell out a template)
  std::vector<int32_t> ids;  // token ids as given, when the prompt was ids (text then empty)
};

// OpenAI's tool_choice: no call (the tools are not shown), the model's choice, at least one call,
// or a call of the function ChatRequest::tool_name.
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// A request of either route. A chat request has the question and history; a completion request
// has `completion` instead (and answer.instruction is raw text before the documents).
struct ChatRequest {
  std::vector<std::string> chunks;             // documents, in prompt order
  std::string question;                        // content of the final user message
  std::optional<CompletionPrompt> completion;  // set for /v1/completions only
  AnswerOptions answer;                        // instruction, history, auto ratio (no on_piece)
  SelectiveOptions sel;                        // policy and ratio
  GenerateOptions gen;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last event with usage alone
  int n = 1;                   // choices, each generated on its own (choice i with seed + i)
  // /v1/completions' echo: each choice's text (and, with logprobs, its tokens) starts with the
  // prompt's; max_tokens may then be 0 (the prompt scored, nothing generated).
  bool echo = false;
  // The choices generated: n, or /v1/completions' best_of (>= n), of which the n with the
  // highest log-probability per token are returned (best_answers).
  int best_of = 1;
  std::string model;  // as the client named it (echoed back); may be empty
  // Tools (chat route): each definition as the chat template shows it (template_json of the
  // client's object, in its key order where parse_chat_request has the body text), their names,
  // tool_choice and parallel_tool_calls (false: an answer's first call only). question_role: the
  // last message's role, "user" or "tool" (a tool's result).
  std::vector<std::string> tools;
  std::vector<std::string> tool_names;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_name;
  bool parallel_tool_calls = true;
  std::string question_role = "user";
  // Whether answers are read for tool calls (tools given, tool_choice not "none").
  bool reads_tool_calls() const { return !tools.empty() && tool_choice != ToolChoice::kNone; }
  // Whether the answer is forced to be one call (tool_choice "required" or named): it then
  // starts after the template's "<tool_call>\n" and is one JSON object {"name", "arguments"}
  // under a schema of the allowed tools' parameters.
  bool forces_tool_call() const {
    return reads_tool_calls() &&
           (tool_choice == ToolChoice::kRequired || tool_choice == ToolChoice::kNamed);
  }
};

// A tool call read from an answer.
struct ToolCall {
  std::string name;
  std::string arguments;  // compact JSON text of the arguments object
};
// An answer split into its content and its tool calls: the Hermes form's
// <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks, in order; content is the text
// before the first block (null when that is only whitespace). Anything the form does not account
// for (a block that is unterminated or holds something else, text between or after blocks other
// than whitespace) leaves the whole text as content and no calls, as vLLM's Hermes parser does.
// forced: the answer is the JSON object of one call alone (ChatRequest::forces_tool_call).
struct ToolCallsParsed {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ToolCallsParsed parse_tool_calls(const std::string& text, bool forced);

// OpenAI's tool_calls array of a choice: index, id (unique within the response `id`), type and
// function {name, arguments}; the first call only when r.parallel_tool_calls is false.
nlohmann::json tool_calls_body(const std::vector<ToolCall>& calls, const ChatRequest& r,
                               const std::string& id, int choice);

// While a streamed answer's tool calls are read: how many bytes of its text so far may go out as
// content, the text before the first "<tool_call>" less a tail that may begin one, and nothing
// while that text is blank (none when the answer is a forced call). The rest waits for the
// answer's end, where parse_tool_calls decides between calls and content. from: the bytes
// already sent (text before them is not searched again).
size_t tool_stream_ready(const std::string& text, size_t from, bool forced);

// The templates' `tojson` (Python's json.dumps as Hugging Face's chat templates call it): ", "
// and ": " between items, keys in the object's order, non-ASCII characters as they are.
std::string template_json(const nlohmann::ordered_json& v);

// The "chunks" array of a request: non-empty strings, at most limits.max_chunks of them, each at
// most limits.max_chunk_bytes. Throws RequestError (400, param "chunks") otherwise.
std::vector<std::string> parse_chunks(const nlohmann::json& chunks, const ApiLimits& limits);

// Parses and validates a /v1/chat/completions body. Throws RequestError (400) naming the field,
// the value and what was expected. body_text, the body as sent (the server has it), is read
// again for the tools alone, so that the prompt shows them with the client's key order (the
// parsed body orders keys alphabetically); without it they keep that order.
ChatRequest parse_chat_request(const nlohmann::json& body, const ApiLimits& limits,
                               const std::string& body_text);
ChatRequest parse_chat_request(const nlohmann::json& body, const ApiLimits& limits);

// Parses and validates a /v1/completions body: "prompt" (a string, one token-id array, or an
// array holding one of those) in place of "messages", and the same generation fields and
// chunk extension, and its integer "logprobs"; refuses (400, naming the field) what it does not
// do: several prompts, suffix, best_of below n or (above n) with stream, echo with stream or with
// chunks. With echo and logprobs the prompt is scored (GenerateOptions::prompt_logprobs). Token
// ids are range-checked by prompt_tokens.
ChatRequest parse_completion_request(const nlohmann::json& body, const ApiLimits& limits);

// The prompt the engine runs for a request: the chat template's (build_rag_prompt) or a
// completion's raw one (build_raw_prompt). Throws RequestError (400, param "prompt" or
// "messages") for a token id outside the vocabulary, an empty prompt after tokenisation, or a
// prompt that leaves no room for max_tokens in the model's context of n_ctx tokens; (param
// "logit_bias") for a biased token outside the vocabulary. n_ctx = 0 skips the context check
// (the tokenize route reports the length instead).
RagPromptTokens prompt_tokens(const ChatRequest& r, const Tokenizer& tok, int n_ctx);

// POST /tokenize (vLLM's and llama-server's route): the tokens a request's prompt runs as, from
// {"prompt": text or ids} (or llama-server's "content") as /v1/completions tokenises it, or from
// {"messages": [...], "chunks": [...]} as /v1/chat/completions lays it out (exactly one of
// them). Returns {"tokens", "count", "max_model_len"}; with "with_pieces": true, llama-server's
// form of "tokens": [{"id", "piece"}], a piece that is not UTF-8 as its bytes.
// body_text: the body as sent, from which a chat request's tools are re-read in the client's
// key order (as parse_chat_request); "" leaves them in the parsed body's order.
nlohmann::json tokenize_body(const nlohmann::json& body, const ApiLimits& limits,
                             const Tokenizer& tok, int n_ctx, const std::string& body_text = "");
// POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (and llama-server's "content"); an id
// outside the vocabulary is a RequestError (400, param "tokens").
nlohmann::json detokenize_body(const nlohmann::json& body, const Tokenizer& tok);

// Parses the request body text as JSON; malformed JSON is a RequestError (400) with the parser's
// position.
nlohmann::json parse_json_body(const std::string& text);

// {"error": {"message", "type", "param", "code"}} in OpenAI's shape. type follows the status:
// invalid_request_error (4xx) or server_error (5xx); param and code are null when empty.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = "",
                          const std::string& code = "");

// The "stop" field: a string or an array of at most StopMatcher::kMaxSequences non-empty strings
// (each at most StopMatcher::kMaxBytes). Throws RequestError (400, param "stop") otherwise.
std::vector<std::string> parse_stop(const nlohmann::json& stop);

// Per-request engine figures returned under "cachetune" in responses.
nlohmann::json answer_stats(const Answer& a, const ChatRequest& r);

// The n of `all` (a best_of request's choices, each with its tokens' Answer::logprobs) with the
// highest mean log-probability per token, best first (ties: the earlier choice first).
std::vector<Answer> best_answers(std::vector<Answer> all, int n);

// OpenAI's usage object: prompt (once), completion (every choice's) and total token counts.
nlohmann::json usage(const std::vector<Answer>& answers);

// A whole (non-streamed) response of one choice per answer: chat.completion, or text_completion
// for a completion request, with the tokens' log-probabilities in OpenAI's shape of that route
// when the request asked for them (tok renders their text); the cachetune figures are the first
// choice's (they share the prompt's lookups). With r.echo each choice's text begins with the
// prompt (as sent; for token ids, or after cachetune.instruction, what its tokens spell), and its
// logprobs list the prompt's tokens first (the first with a null logprob, as OpenAI's), from the
// first answer's Answer::prompt_logprobs.
nlohmann::json response_body(const std::vector<Answer>& answers, const ChatRequest& r,
                             const Tokenizer& tok, const RagPromptTokens& prompt,
                             const std::string& id, const std::string& model_id, int64_t created);

// The log-probabilities lps of a choice's tokens in the shape of r's route: chat's
// {"content": [{token, logprob, bytes, top_logprobs}]}, or the completions route's parallel lists
// whose text_offset starts at `text_offset` (the bytes of the choice's text before the first of
// them) and which advances it past them. A whole response renders all of a choice's tokens from
// offset 0; a stream renders each event's tokens, continuing the offset.
nlohmann::json logprobs_body(const ChatRequest& r, const std::vector<TokenLogprob>& lps,
                             const Tokenizer& tok, size_t& text_offset);

// The event OpenAI sends last when stream_options.include_usage is set: "choices" empty, "usage"
// the whole response's.
nlohmann::json usage_event(const std::vector<Answer>& a, const ChatRequest& r,
                           const std::string& id, const std::string& model_id, int64_t created);

// One event of a streamed response in the request's shape: chat.completion.chunk (a content
// delta) or text_completion (a text delta), with the logprobs of the tokens it brings
// (logprobs_body, or null); with finish_reason set (delta empty) the last event, to which the
// caller adds usage and the cachetune figures.
nlohmann::json stream_event(const ChatRequest& r, const std::string& id,
                            const std::string& model_id, int64_t created,
                            const std::optional<std::string>& text,
                            const std::string& finish_reason = "", int index = 0,
                            const nlohmann::json& logprobs = nullptr);

// One chat.completion.chunk event of a streamed response: a content delta, or (finish_reason
// set, delta empty) the last event, which also carries usage and the cachetune figures.
nlohmann::json chat_chunk(const std::string& id, const std::string& model_id, int64_t created,
                          const std::optional<std::string>& content,
                          const std::optional<std::string>& role,
                          const std::string& finish_reason = "", int index = 0);

// "stop" when generation ended at an end-of-generation token or a stop sequence, "length" when it
// hit max_tokens.
std::string finish_reason(const Answer& a, const ChatRequest& r);

}  // namespace ct::server
