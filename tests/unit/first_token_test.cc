// The one request runner (reuse/first_token.h): the first token is the greedy one of the same
// selective prefill's logits, with its text, a positive TTFT and the prefill's breakdown; and a
// policy's ingest-time work (Policy::prepare) runs before the prefill, for every chunk.
#include "reuse/first_token.h"

#include <gtest/gtest.h>


#include "model/sampler.h"
#include "reuse/encoder.h"
#include "support/chunk_fixtures.h"
#include "support/random_data.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

// Counts prepare() calls and the selections made after them (cachetune's selection otherwise).
class CountingPolicy final : public Policy {
 public:
  CountingPolicy()
      : Policy("counting", "cachetune, counting prepare() (test only)", PolicyStage::kChunk) {}
  void prepare(const ChunkSource&, const PolicyOptions&) const override { ++prepared; }
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    EXPECT_EQ(prepared, 2) << "prepare() ran for every chunk before any selection";
    return find_policy("cachetune").select_chunk(c, p);
  }
  mutable int prepared = 0;
};

TEST(FirstToken, IsTheGreedyTokenOfTheSelectivePrefill) {
  test::TinyModelOptions o;
  const std::string path = test::temp_path("ct_first_token_tiny.gguf");
  test::write_tiny_model(path, o);
  auto m = Model::load(path);
  const ChunkKV a = encode_chunk(*m, test::random_byte_tokens(30, 1), {});
  const ChunkKV b = encode_chunk(*m, test::random_byte_tokens(20, 2), {});
  InMemoryChunk sa(a), sb(b);
  const ComposedRequest req{
      test::random_byte_tokens(4, 3), {&sa, &sb}, test::random_byte_tokens(5, 4)};
  const int n = layout_request(req).n_total;
  CountingPolicy pol;
  SelectiveOptions so;
  so.policy.kind = &pol;
  so.policy.ratio = 0.3;
  Workspace ws;
  KVCache kv = m->make_cache(n);
  SelectionReport rep;
  const FirstToken ft = run_to_first_token(*m, req, so, kv, ws, &rep);
  EXPECT_EQ(pol.prepared, 2);
  KVCache kv2 = m->make_cache(n);
  PrefillBreakdown bd;
  const std::vector<float> want = selective_prefill(*m, req, so, kv2, ws, &bd);
  EXPECT_EQ(ft.logits, want);
  EXPECT_EQ(ft.token, argmax(want.data(), (int)want.size()));
  EXPECT_EQ(ft.piece, m->tokenizer().token_to_piece(ft.token));
  EXPECT_GT(ft.ttft_ms, 0.0);
  EXPECT_GE(ft.ttft_ms, ft.bd.total_ms);  // the prefill is inside the TTFT
  EXPECT_EQ(ft.bd.n_active, bd.n_active);
  EXPECT_EQ(ft.bd.n_total, n);
  ASSERT_EQ(rep.selected.size(), 2u);
  EXPECT_EQ(kv.n_pos, n);
}

}  // namespace
}  // namespace ct
