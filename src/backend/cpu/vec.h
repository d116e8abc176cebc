// AVX2 vector helpers shared by the CPU operators (dot products, exponentials, scaling).
// exp256_ps is a Cephes-style range reduction + degree-6 polynomial, ~1 ulp on [-87, 88].
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace ct::cpu {

// (v0 + v1) + (v2 + v3).
inline float hsum128_ps(__m128 v) {
  __m128 sh = _mm_movehdup_ps(v);
  v = _mm_add_ps(v, sh);
  sh = _mm_movehl_ps(sh, v);
  v = _mm_add_ss(v, sh);
  return _mm_cvtss_f32(v);
}

// ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)).
inline float hsum256_ps(__m256 v) {
  return hsum128_ps(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

inline float vec_dot(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float s = hsum256_ps(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline __m256 exp256_ps(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 lo = _mm256_set1_ps(-87.3365447504f);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // x - fx*ln2 in two steps for precision
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
  e = _mm256_slli_epi32(e, 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// The largest of m and s[0..n), for input without NaN. Exact whatever the order, so the vector
// form gives the scalar loop's value (a zero's sign aside, which exp(s - max) does not see); the
// scalar loop's dependence on its last maximum costs a max latency per element, most of
// attention's softmax. (A NaN score makes the softmax's sum NaN either way.)
inline float vec_max(const float* s, int n, float m) {
  int j = 0;
  if (n >= 16) {
    __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8);
    for (j = 16; j + 16 <= n; j += 16) {
      a = _mm256_max_ps(a, _mm256_loadu_ps(s + j));
      b = _mm256_max_ps(b, _mm256_loadu_ps(s + j + 8));
    }
    a = _mm256_max_ps(a, b);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = std::max(m, _mm_cvtss_f32(h));
  }
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// s[j] = exp(s[j] - m) for j < n; returns the sum of the new values.
inline float vec_exp_sub_sum(float* s, int n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum256_ps(acc);
  for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  return sum;
}

inline void vec_scale(float* x, int n, float c) {
  const __m256 vc = _mm256_set1_ps(c);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vc));
  for (; i < n; ++i) x[i] *= c;
}

}  // namespace ct::cpu
