// Tiny random llama-family GGUF models for unit tests: the tensor names, shapes and metadata keys
// llama.cpp writes, a byte-level GPT-2 tokenizer with a few English merges and the ChatML special
// tokens, and seeded random weights scaled so that activations stay in a sane range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/ggml_types.h"

namespace ct::test {

struct TinyModelOptions {
  // general.architecture, any row of model/arch.h ("llama", "mistral", "qwen2"); the metadata
  // keys are written as {arch}.*.
  std::string arch = "llama";
  int n_layer = 3;
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;  // fewer KV heads than query heads: grouped-query attention
  // Per-head dimension. When it differs from n_embd / n_head the file also carries
  // {arch}.attention.key_length and value_length, as llama.cpp expects.
  int head_dim = 16;
  int n_ff = 96;
  int context_length = 512;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  // RoPE scaling as llama.cpp GGUFs carry it: rope_freqs.weight, F32 [head_dim/2] of per-pair
  // divisors (Llama 3.1; empty: no tensor), and {arch}.rope.scaling.type / .factor (empty type:
  // neither key is written).
  std::vector<float> rope_freq_factors;
  std::string rope_scaling_type;
  float rope_scaling_factor = 1.0f;
  // Type of every 2-D matrix (attention, FFN, output and, unless token_embd_type is set, the
  // token embedding): any type of core/ggml_types.h. Block types need n_embd, n_ff and
  // n_head * head_dim to be multiples of the block size (32, or 256 for the K-quants). Norm
  // weights and biases are always F32.
  GgmlType weight_type = GgmlType::F32;
  std::optional<GgmlType> token_embd_type;  // e.g. Q8_0 with Q4_1 matrices, like SmolLM2 Q4_1
  // True: no output.weight, the output projection reuses token_embd.weight (as in SmolLM2).
  bool tied_output = true;
  uint32_t seed = 1234;  // std::mt19937 seed; equal options give byte-identical files
  uint32_t gguf_version = 3;
  // F32 biases blk.N.attn_{q,k,v}.bias; unset: exactly when arch is "qwen2" (as Qwen2 files).
  // Last, so that positional initialisers of the fields above keep their meaning.
  std::optional<bool> qkv_bias;
  // tokenizer.chat_template; empty: kTinyChatTemplate (kTinyToolTemplate adds the tool form).
  std::string chat_template;
};

// The tokenizer written into every tiny model, for tests that check token ids.
struct TinyVocab {
  std::vector<std::string> tokens;  // GPT-2 byte-to-unicode form; ids 0..255 are the bytes
  std::vector<int32_t> token_type;  // 1 normal (bytes and merges), 3 control (special tokens)
  std::vector<std::string> merges;  // "left right", in rank order
  int32_t endoftext = -1;           // <|endoftext|>
  int32_t im_start = -1;            // <|im_start|>, also bos
  int32_t im_end = -1;              // <|im_end|>, also eos
};
TinyVocab tiny_vocab();

// The ChatML template stored as tokenizer.chat_template.
extern const char* const kTinyChatTemplate;
// A ChatML template with the Hermes tool form (Qwen2.5's structure; no instructions around the
// definitions): tools inside <tools></tools> in the system turn, calls as <tool_call> blocks,
// results as <tool_response> blocks. Without tools it renders as kTinyChatTemplate.
extern const char* const kTinyToolTemplate;

// n seeded random token ids in [0, 255]: the byte tokens of the tiny vocabulary (std::mt19937).
std::vector<int32_t> random_byte_tokens(int n, uint32_t seed);

// Writes the model to `path` (atomically) and returns `path`. Throws ct::Error for inconsistent
// options (unknown arch, n_head not a multiple of n_head_kv, row lengths a quantised type cannot
// hold).
std::string write_tiny_model(const std::string& path, const TinyModelOptions& o = {});

}  // namespace ct::test
