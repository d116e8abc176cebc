// Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ from our own writers, so
// each seed is a valid input the real code produces: a tiny GGUF model and a metadata-only GGUF,
// chunk records from encode_header + slab_pack. Run by tools/fuzz.sh --seeds; the JSON, tier-spec
// and tokenizer seeds are plain text files kept by hand.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "store/record_format.h"
#include "support/tiny_model.h"

namespace {

void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  if (!f) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// A record as the Redis tier stores it (align 1: header then slabs back to back), prefixed by the
// record target's flag byte and row range (see record_fuzz.cc).
std::vector<uint8_t> record_seed(int n_tok, int n_layer, int kv_dim, ct::KvDtype dtype,
                                 uint8_t flags, uint16_t a, uint16_t b) {
  using namespace ct::store;
  ct::ChunkKV kv;
  ct::ChunkMeta& m = kv.meta;
  m.id = "seed-" + std::to_string(n_tok) + "-" + std::to_string(n_layer);
  m.model_fingerprint = "fuzzseed";
  m.n_tok = n_tok, m.n_layer = n_layer, m.kv_dim = kv_dim, m.dtype = dtype;
  m.sink = true, m.rank_mode = "lowfreq", m.alpha = 0.5, m.rank_ms = 1.5;
  std::mt19937 rng(7);
  for (int t = 0; t < n_tok; ++t) {
    m.tokens.push_back((int32_t)(rng() % 300));
    m.order.push_back(n_tok - 1 - t);
    m.scores.push_back((float)(rng() % 1000) / 1000.0f);
  }
  for (int l = 0; l < n_layer; ++l) {
    kv.k.emplace_back(m.layer_bytes());
    kv.v.emplace_back(m.layer_bytes());
    for (auto& x : kv.k.back()) x = (uint8_t)rng();
    for (auto& x : kv.v.back()) x = (uint8_t)rng();
  }
  const RecordLayout lay = plan_record(m, 1);
  std::vector<uint8_t> slabs(n_layer * slab_bytes(m));
  std::vector<uint32_t> crcs(n_layer * n_row_groups(n_tok));
  for (int l = 0; l < n_layer; ++l) {
    slab_pack(kv, l, slabs.data() + l * slab_bytes(m));
    slab_group_crcs(slabs.data() + l * slab_bytes(m), m, crcs.data() + l * n_row_groups(n_tok));
  }
  std::vector<uint8_t> out{flags, (uint8_t)a, (uint8_t)(a >> 8), (uint8_t)b, (uint8_t)(b >> 8)};
  const std::vector<uint8_t> h = encode_header(lay, m, crcs);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), slabs.begin(), slabs.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  for (const char* t : {"gguf", "record", "tokenizer"})
    std::filesystem::create_directories(dir / t);

  // A tiny model with quantised matrices (small file, every tensor type path), and a v2 F16 one.
  ct::test::TinyModelOptions o;
  o.n_layer = 1, o.n_embd = 32, o.n_head = 2, o.n_head_kv = 1, o.head_dim = 16, o.n_ff = 32;
  o.context_length = 64, o.weight_type = ct::GgmlType::Q8_0;
  const std::string tmp = (std::filesystem::temp_directory_path() / "ct_seed.gguf").string();
  ct::test::write_tiny_model(tmp, o);
  write_file(dir / "gguf" / "tiny_q8_0.gguf", read_file(tmp));
  o.weight_type = ct::GgmlType::Q4_1, o.token_embd_type = ct::GgmlType::Q8_0, o.arch = "qwen2";
  o.gguf_version = 2;
  ct::test::write_tiny_model(tmp, o);
  write_file(dir / "gguf" / "tiny_qwen2_q4_1_v2.gguf", read_file(tmp));
  // Metadata of every value type, nested arrays, and one tensor: the parser without the weights.
  ct::GgufWriter w;
  w.set_u32("general.alignment", 64);
  w.set_str("general.architecture", "llama");
  w.set_i32("i32", -5);
  w.set_u64("u64", 1ull << 40);
  w.set_f32("f32", 1e-5f);
  w.set_bool("flag", true);
  w.set_str_array("strs", {"a", "bc", ""});
  w.set_i32_array("ints", {1, -2, 3});
  w.set_f32_array("floats", {0.5f, -1.0f});
  ct::GgufValue nested;
  nested.type = ct::GgufValueType::ARRAY;
  nested.elem_type = ct::GgufValueType::ARRAY;
  nested.arr.resize(2);
  for (auto& inner : nested.arr) {
    inner.type = ct::GgufValueType::ARRAY;
    inner.elem_type = ct::GgufValueType::INT8;
    inner.arr_i = {1, 2};
  }
  w.set_value("nested", nested);
  const float x[32] = {1.0f};
  w.add_tensor("t", ct::GgmlType::F16, {32}, x);
  w.write(tmp);
  write_file(dir / "gguf" / "metadata.gguf", read_file(tmp));
  std::filesystem::remove(tmp);

  write_file(dir / "record" / "f16_3tok_2layer", record_seed(3, 2, 4, ct::KvDtype::F16, 0, 0, 3));
  write_file(dir / "record" / "f32_40tok_1layer_crcfix",
             record_seed(40, 1, 2, ct::KvDtype::F32, 1, 17, 20));
  write_file(dir / "record" / "bf16_20tok_3layer_crcfix",
             record_seed(20, 3, 2, ct::KvDtype::BF16, 1, 5, 9));
  std::printf("make_seeds: wrote %s/{gguf,record}\n", dir.c_str());
  return 0;
}
