// Fidelity measures; plain double-precision loops, since they run once per answer position or
// chunk and must be exact references themselves.
#include "eval/fidelity.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/backend.h"
#include "core/error.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"

namespace ct {
namespace {

double log_sum_exp(const float* x, int n) {
  double mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, (double)x[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp((double)x[i] - mx);
  return mx + std::log(s);
}

double row_dist(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) {
    const double d = (double)a[i] - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

void check_layers(const std::vector<const float*>& a, const std::vector<const float*>& b,
                  const std::vector<const float*>& c, const std::vector<const float*>& d, int n_tok,
                  int kv_dim) {
  CT_THROW_IF_NOT(n_tok >= 0 && kv_dim > 0, "bad drift shape: n_tok {}, kv_dim {}", n_tok, kv_dim);
  CT_THROW_IF_NOT(a.size() == b.size() && a.size() == c.size() && a.size() == d.size(),
                  "drift inputs need the same layer count, got {} {} {} {}", a.size(), b.size(),
                  c.size(), d.size());
}

}  // namespace

double kl_from_logits(const float* p_logits, const float* q_logits, int n) {
  CT_THROW_IF_NOT(n > 0, "KL over {} classes", n);
  const double lp = log_sum_exp(p_logits, n), lq = log_sum_exp(q_logits, n);
  double d = 0;
  for (int i = 0; i < n; ++i) {
    const double a = p_logits[i] - lp, b = q_logits[i] - lq;
    d += std::exp(a) * (a - b);
  }
  // Rounding can leave -1e-17 for identical distributions; KL is never negative.
  return std::max(0.0, d);
}

double mean_kl_from_logits(const std::vector<float>& p, const std::vector<float>& q, int n_vocab,
                           int n_pos) {
  CT_THROW_IF_NOT(n_pos >= 1 && n_vocab > 0, "mean KL needs n_pos >= 1, got {}", n_pos);
  const size_t need = (size_t)n_pos * n_vocab;
  CT_THROW_IF_NOT(p.size() >= need && q.size() >= need,
                  "mean KL over {} positions of {} logits needs {} values, got {} and {}", n_pos,
                  n_vocab, need, p.size(), q.size());
  double s = 0;
  for (int i = 0; i < n_pos; ++i) {
    s += kl_from_logits(p.data() + (size_t)i * n_vocab, q.data() + (size_t)i * n_vocab, n_vocab);
  }
  return s / n_pos;
}

double cosine_similarity(const float* a, const float* b, int n) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < n; ++i) {
    ab += (double)a[i] * b[i];
    aa += (double)a[i] * a[i];
    bb += (double)b[i] * b[i];
  }
  if (aa == 0 || bb == 0) return 0.0;
  return ab / std::sqrt(aa * bb);
}

std::vector<float> kv_drift(const std::vector<const float*>& k_iso,
                            const std::vector<const float*>& v_iso,
                            const std::vector<const float*>& k_ctx,
                            const std::vector<const float*>& v_ctx, int n_tok, int kv_dim) {
  check_layers(k_iso, v_iso, k_ctx, v_ctx, n_tok, kv_dim);
  std::vector<double> acc(n_tok, 0.0), dk(n_tok), dv(n_tok);
  const std::vector<float> zero(kv_dim, 0.0f);
  for (size_t l = 0; l < k_iso.size(); ++l) {
    double sk = 0, sv = 0;
    for (int t = 0; t < n_tok; ++t) {
      const size_t o = (size_t)t * kv_dim;
      dk[t] = row_dist(k_iso[l] + o, k_ctx[l] + o, kv_dim);
      dv[t] = row_dist(v_iso[l] + o, v_ctx[l] + o, kv_dim);
      sk += row_dist(k_ctx[l] + o, zero.data(), kv_dim);
      sv += row_dist(v_ctx[l] + o, zero.data(), kv_dim);
    }
    const double mk = sk / std::max(1, n_tok), mv = sv / std::max(1, n_tok);
    for (int t = 0; t < n_tok; ++t) {
      acc[t] += 0.5 * (mk > 0 ? dk[t] / mk : 0.0) + 0.5 * (mv > 0 ? dv[t] / mv : 0.0);
    }
  }
  return std::vector<float>(acc.begin(), acc.end());
}

double kv_max_abs_diff(const std::vector<const float*>& a_k, const std::vector<const float*>& a_v,
                       const std::vector<const float*>& b_k, const std::vector<const float*>& b_v,
                       int n_tok, int kv_dim) {
  check_layers(a_k, a_v, b_k, b_v, n_tok, kv_dim);
  double mx = 0;
  const size_t n = (size_t)n_tok * kv_dim;
  for (size_t l = 0; l < a_k.size(); ++l) {
    for (size_t i = 0; i < n; ++i) {
      mx = std::max(mx, std::fabs((double)a_k[l][i] - b_k[l][i]));
      mx = std::max(mx, std::fabs((double)a_v[l][i] - b_v[l][i]));
    }
  }
  return mx;
}

RecallCount recall_at(const std::vector<int32_t>& selected, const std::vector<float>& drift,
                      double r) {
  const int n = (int)drift.size();
  std::vector<uint8_t> is_sel(n, 0);
  for (int32_t t : selected) {
    CT_THROW_IF_NOT(t >= 0 && t < n, "selected token {} outside the chunk's {} tokens", t, n);
    is_sel[t] = 1;
  }
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = n_select(r, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return drift[a] > drift[b] || (drift[a] == drift[b] && a < b);
  });
  RecallCount c;
  c.n_ref = k;
  for (int i = 0; i < k; ++i) c.hits += is_sel[idx[i]];
  return c;
}

PrefillKV capture_prefill_kv(const Model& m, const std::vector<int32_t>& tokens, int query_begin,
                             DeviceSequence* device) {
  const ModelConfig& c = m.config();
  const int n = (int)tokens.size(), KV = c.kv_dim();
  CT_THROW_IF_NOT(n > 0 && n <= c.n_ctx_train, "cannot capture K/V of {} tokens (context {})", n,
                  c.n_ctx_train);
  CT_THROW_IF_NOT(query_begin < n, "query begins at row {} of {}", query_begin, n);
  PrefillKV out;
  out.n_tok = n;
  out.k.resize((size_t)c.n_layer * n * KV);
  out.v.resize((size_t)c.n_layer * n * KV);
  if (query_begin >= 0) out.query_attention.assign(n, 0.0f);
  tapped_prefill(m, tokens.data(), n, device, out.k.data(), out.v.data(),
                 query_begin >= 0 ? out.query_attention.data() : nullptr, query_begin);
  const double n_q = (double)(n - std::max(0, query_begin)) * c.n_layer;
  for (float& a : out.query_attention) a = (float)(a / n_q);
  return out;
}

std::vector<float> chunk_drift(const ChunkKV& rec, const PrefillKV& ctx, int offset,
                               double* max_abs_diff) {
  const int L = rec.meta.n_layer, n = rec.meta.n_tok, KV = rec.meta.kv_dim;
  CT_THROW_IF_NOT(offset >= 0 && offset + n <= ctx.n_tok && !ctx.k.empty() &&
                      ctx.k.size() == (size_t)L * ctx.n_tok * KV && ctx.v.size() == ctx.k.size(),
                  "chunk_drift: chunk of {} rows x {} layers x {} at offset {} does not fit a "
                  "captured prefill of {} rows ({} K values)",
                  n, L, KV, offset, ctx.n_tok, ctx.k.size());
  const ChunkKVF32 f = unpack_text_order(rec);
  std::vector<const float*> ki(L), vi(L), kc(L), vc(L);
  for (int l = 0; l < L; ++l) {
    ki[l] = f.k_layer(l, n, KV);
    vi[l] = f.v_layer(l, n, KV);
    kc[l] = ctx.k_rows(l, offset, KV);
    vc[l] = ctx.v_rows(l, offset, KV);
  }
  if (max_abs_diff) *max_abs_diff = kv_max_abs_diff(ki, vi, kc, vc, n, KV);
  return kv_drift(ki, vi, kc, vc, n, KV);
}

}  // namespace ct
