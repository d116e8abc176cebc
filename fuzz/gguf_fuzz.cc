// libFuzzer target: the GGUF reader on arbitrary bytes (GgufFile::open_memory runs the same
// parser as open on a mapping), then the hyper-parameters and the tokenizer of every file that
// opens. The promise under test: malformed input is a ct::Error, never a crash, a sanitizer report,
// a leak or another exception type.
#include <cstdint>
#include <exception>
#include <string>

#include "core/error.h"
#include "fuzz_common.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<ct::GgufFile> f;
  try {
    f = ct::GgufFile::open_memory(data, size, "fuzz.gguf");
  } catch (const ct::Error&) {
    return 0;
  }
  // Every tensor the reader hands out lies inside the input.
  for (const ct::GgufTensorInfo& t : f->tensors()) {
    if (t.nbytes > 0 && (t.data < data || t.data + t.nbytes > data + size)) {
      ct::fuzz::finding("tensor outside the input:", t.name.c_str());
    }
  }
  try {
    (void)ct::ModelConfig::from_gguf(*f);
  } catch (const ct::Error&) {
  }
  try {
    const ct::Tokenizer tok = ct::Tokenizer::from_gguf(*f);
    // Exercise the tables the constructor built: a fixed text with a special token, and back.
    const std::vector<int32_t> ids = tok.encode("Hello <|im_start|>world 123\n\xff", true);
    (void)tok.decode(ids, true);
    (void)tok.apply_chat_template({{"user", "hi"}}, true);
  } catch (const ct::Error&) {
  }
  return 0;
}
