/* bfloat16 CPU kernels, called through ctypes: every value stored in bf16, every sum in float32.
 *
 * The elementwise kernels (RMSNorm, rotary, SiLU gating) round where torch's bf16 ops round, so they give
 * torch's bits or differ by one bf16 step. decode_attention_bf16 reads the bf16 KV pool in place (no gather
 * copy): each key and value row is widened to float32 once (a 16-bit shift), or, with AVX-512 BF16, the
 * query-key dot products run on bf16 pairs (`_mm512_dpbf16_ps`) with float32 accumulation.
 * linear_bf16 streams the bf16 weight once per call, widening it in registers.
 */
#include <stdlib.h>

#include "simd.h"

#define TILE_T bf16
#define TILE_LOAD8 load8_bf16
#define TILE_PREFETCH_KEY(p, d) __builtin_prefetch(p)
#define TILE_LOAD16 load16_bf16
#include "tiles.h"

/* sum a[i] * float(b[i]) over n values: a float32, b bf16. */
static inline float dot_f32_bf16(const float* a, const bf16* b, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#ifdef VRIKSHA_AVX512
  __m512 z = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) z = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16_bf16(b + i), z);
  s = _mm512_reduce_add_ps(z);
#endif
#ifdef VRIKSHA_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_bf16(b + i), acc);
  s += hsum8(acc);
#endif
  for (; i < n; i++) s += a[i] * bf16_to_f32(b[i]);
  return s;
}

#ifdef VRIKSHA_AVX512_BF16
/* sum a[i] * b[i] over n values (n % 32 == 0), both bf16, products summed pairwise in float32. */
static inline float dot_bf16_pairs(const bf16* a, const bf16* b, int64_t n) {
  __m512 z = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 32) {
    __m512bh x = (__m512bh)_mm512_loadu_si512((const void*)(a + i));
    __m512bh y = (__m512bh)_mm512_loadu_si512((const void*)(b + i));
    z = _mm512_dpbf16_ps(z, x, y);
  }
  return _mm512_reduce_add_ps(z);
}
#endif

/* One request, one KV head: `group` query heads (qf float32, qb bf16) over n KV slots. */
NO_AUTO_VECTORIZE
static void attend_bf16(const float* qf, const bf16* qb, const bf16* k_pool, const bf16* v_pool,
                        const int64_t* row, int64_t n, int64_t kv_heads, int64_t h, int64_t d, int64_t dv,
                        int64_t group, float scale, float* scores, float* vrow, float* out) {
  /* vrow: scratch of max(d, dv) floats */
  (void)qb;
  int64_t j = 0;
#ifdef VRIKSHA_AVX512
  /* four key rows widened once each for up to three query heads: faster than bf16 pairs one row at a time */
  if (d % 16 == 0) j = keys4_avx512(qf, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
#endif
#ifdef VRIKSHA_AVX512_BF16
  if (d % 32 == 0) {
    for (; j < n; j++) {
      const bf16* kj = k_pool + (row[j] * kv_heads + h) * d;
      if (j + 4 < n) __builtin_prefetch(k_pool + (row[j + 4] * kv_heads + h) * d);
      for (int64_t g = 0; g < group; g++) scores[g * n + j] = dot_bf16_pairs(qb + g * d, kj, d) * scale;
    }
  }
#endif
#ifdef VRIKSHA_AVX2
  /* two key rows against up to three query heads per pass: each key element widened once, used thrice */
  if (d % 8 == 0) j = tile_key_pairs(qf, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
#endif
  for (; j < n; j++) {
    const bf16* kj = k_pool + (row[j] * kv_heads + h) * d;
    widen_bf16(vrow, kj, d);  /* once per key row, for every query head of the group */
    for (int64_t g = 0; g < group; g++) scores[g * n + j] = dot_f32(qf + g * d, vrow, d) * scale;
  }
  for (int64_t g = 0; g < group; g++) softmax_inplace(scores + g * n, n);
#ifdef VRIKSHA_AVX512
  if (dv % 64 == 0) {
    values64_avx512(scores, v_pool, row, n, kv_heads, h, dv, group, out);
    return;
  }
#endif
  int64_t e0 = 0;
#ifdef VRIKSHA_AVX2
  /* 16 output values of up to three heads held in six registers while the value rows stream past */
  for (; e0 + 16 <= dv; e0 += 16) {
    for (int64_t g = 0; g < group; g += 3) {
      int64_t cnt = group - g < 3 ? group - g : 3;
      const float *p0 = scores + g * n, *p1 = p0 + (cnt > 1 ? n : 0), *p2 = p0 + (cnt > 2 ? 2 * n : 0);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
      for (int64_t j = 0; j < n; j++) {
        const bf16* vj = v_pool + (row[j] * kv_heads + h) * dv + e0;
        __m256 v0 = load8_bf16(vj), v1 = load8_bf16(vj + 8), p;
        p = _mm256_broadcast_ss(p0 + j); a0 = _mm256_fmadd_ps(p, v0, a0); a1 = _mm256_fmadd_ps(p, v1, a1);
        p = _mm256_broadcast_ss(p1 + j); b0 = _mm256_fmadd_ps(p, v0, b0); b1 = _mm256_fmadd_ps(p, v1, b1);
        p = _mm256_broadcast_ss(p2 + j); c0 = _mm256_fmadd_ps(p, v0, c0); c1 = _mm256_fmadd_ps(p, v1, c1);
      }
      float* o = out + g * dv + e0;
      _mm256_storeu_ps(o, a0); _mm256_storeu_ps(o + 8, a1);
      if (cnt > 1) { _mm256_storeu_ps(o + dv, b0); _mm256_storeu_ps(o + dv + 8, b1); }
      if (cnt > 2) { _mm256_storeu_ps(o + 2 * dv, c0); _mm256_storeu_ps(o + 2 * dv + 8, c1); }
    }
  }
#endif
  if (e0 == dv) return;
  int64_t rest = dv - e0;
  for (int64_t g = 0; g < group; g++)
    for (int64_t e = e0; e < dv; e++) out[g * dv + e] = 0.f;
  for (int64_t j = 0; j < n; j++) {
    if (j + 4 < n) __builtin_prefetch(v_pool + (row[j + 4] * kv_heads + h) * dv + e0);
    widen_bf16(vrow, v_pool + (row[j] * kv_heads + h) * dv + e0, rest);  /* once per row, for every head */
    for (int64_t g = 0; g < group; g++) axpy_f32(out + g * dv + e0, scores[g * n + j], vrow, rest);
  }
}

/* Decode attention over a bf16 pool for a query given in bf16 (`q16`) or in float32 (`q32`, rounded to bf16
 * first, as the engine's Python path rounds it before calling decode_attention_bf16): one of the two is NULL. */
static void attend_bf16_pool(const bf16* q16, const float* q32, const bf16* k_pool, const bf16* v_pool,
                             const int64_t* slots, const int64_t* lens, float* out, int64_t batch, int64_t heads,
                             int64_t kv_heads, int64_t d, int64_t dv, int64_t max_len, float scale,
                             int64_t window, int threads) {
  int64_t group = heads / kv_heads;
#pragma omp parallel num_threads(threads)
  {
    float* scores = (float*)malloc(sizeof(float) * group * (max_len > 0 ? max_len : 1));
    float* qf = (float*)malloc(sizeof(float) * group * d);
    bf16* rounded = q32 ? (bf16*)malloc(sizeof(bf16) * group * d) : NULL;
    float* vrow = (float*)malloc(sizeof(float) * (dv > d ? dv : d));
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t h = 0; h < kv_heads; h++) {
      for (int64_t b = 0; b < batch; b++) {
        int64_t len = lens[b];
        int64_t start = (window > 0 && len > window) ? len - window : 0;
        int64_t at = (b * heads + h * group) * d;
        const bf16* qb = q16 ? q16 + at : rounded;
        if (q32)
          for (int64_t e = 0; e < group * d; e++) rounded[e] = f32_to_bf16(q32[at + e]);
        widen_bf16(qf, qb, group * d);
        attend_bf16(qf, qb, k_pool, v_pool, slots + b * max_len + start, len - start, kv_heads, h, d, dv,
                    group, scale, scores, vrow, out + (b * heads + h * group) * dv);
      }
    }
    free(scores);
    free(qf);
    free(rounded);
    free(vrow);
  }
}

/* q [B, H, D] bf16; k_pool [S, Hkv, D], v_pool [S, Hkv, Dv] bf16; slots [B, max_len]; lens [B];
 * out [B, H, Dv] float32. window <= 0: attend to all lens[b] tokens; else to the last `window`. */
void decode_attention_bf16(const bf16* q, const bf16* k_pool, const bf16* v_pool, const int64_t* slots,
                           const int64_t* lens, float* out, int64_t batch, int64_t heads, int64_t kv_heads,
                           int64_t d, int64_t dv, int64_t max_len, float scale, int64_t window, int threads) {
  attend_bf16_pool(q, NULL, k_pool, v_pool, slots, lens, out, batch, heads, kv_heads, d, dv, max_len, scale,
                   window, threads);
}

/* The same for a float32 engine over a bf16 KV pool: q [B, H, D] float32, rounded to bf16 as above, so the
 * native decode step and the Python path give the same bits. */
void decode_attention_f32q_bf16kv(const float* q, const bf16* k_pool, const bf16* v_pool, const int64_t* slots,
                                  const int64_t* lens, float* out, int64_t batch, int64_t heads, int64_t kv_heads,
                                  int64_t d, int64_t dv, int64_t max_len, float scale, int64_t window,
                                  int threads) {
  attend_bf16_pool(NULL, q, k_pool, v_pool, slots, lens, out, batch, heads, kv_heads, d, dv, max_len, scale,
                   window, threads);
}

/* Four bf16 weight rows against one float32 input row. */
static inline void dot4_bf16(const bf16* w, int64_t in, const float* x, float* out4) {
  for (int k = 0; k < 4; k++) out4[k] = dot_f32_bf16(x, w + k * in, in);
}

/* y[m, o] = bf16(sum_i W[o, i] x[m, i] + b[o]), W [out, in] bf16 as nn.Linear stores it; float32 sums. */
void linear_bf16(const bf16* w, const bf16* bias, const bf16* x, bf16* y, int64_t out, int64_t in, int64_t m,
                 int threads) {
#ifdef VRIKSHA_AVX512_BF16
  if (in % 32 == 0) { /* bf16 pairs straight from the weight and the input, float32 sums */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
      float b = bias ? bf16_to_f32(bias[o]) : 0.f;
      for (int64_t r = 0; r < m; r++) y[r * out + o] = f32_to_bf16(dot_bf16_pairs(w + o * in, x + r * in, in) + b);
    }
    return;
  }
#endif
  float* xf = (float*)malloc(sizeof(float) * (m * in > 0 ? m * in : 1));
  widen_bf16(xf, x, m * in);
  int64_t blocks = (out + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t blk = 0; blk < blocks; blk++) {
    int64_t o = blk * 4, cnt = out - o < 4 ? out - o : 4;
    float s0[4];
    int64_t r = 0;
#ifdef VRIKSHA_AVX2
    if (in % 8 == 0 && cnt == 4) {
      float s1[4];
      for (; r + 2 <= m; r += 2) {
        tile_dot4x2(w + o * in, in, xf + r * in, xf + (r + 1) * in, s0, s1);
        for (int k = 0; k < 4; k++) {
          float b = bias ? bf16_to_f32(bias[o + k]) : 0.f;
          y[r * out + o + k] = f32_to_bf16(s0[k] + b);
          y[(r + 1) * out + o + k] = f32_to_bf16(s1[k] + b);
        }
      }
    }
#endif
    for (; r < m; r++) {
      if (cnt == 4) {
        dot4_bf16(w + o * in, in, xf + r * in, s0);
      } else {
        for (int64_t k = 0; k < cnt; k++) s0[k] = dot_f32_bf16(xf + r * in, w + (o + k) * in, in);
      }
      for (int64_t k = 0; k < cnt; k++)
        y[r * out + o + k] = f32_to_bf16(s0[k] + (bias ? bf16_to_f32(bias[o + k]) : 0.f));
    }
  }
  free(xf);
}

/* x [rows, dim] (x = bf16(x + residual) first, in place, when given); out = weight * bf16(x / rms(x)),
 * rounded as Transformers' bf16 RMSNorm rounds (normalised in float32, cast, then scaled). */
void rms_norm_bf16(bf16* x, const bf16* residual, const bf16* weight, bf16* out, int64_t rows, int64_t dim,
                   float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    bf16* xr = x + r * dim;
    bf16* orow = out + r * dim;
    int64_t e = 0;
    float ss = 0.f;
#ifdef VRIKSHA_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; e + 8 <= dim; e += 8) {
      __m256 v = load8_bf16(xr + e);
      if (residual) {
        v = round8_bf16(_mm256_add_ps(v, load8_bf16(residual + r * dim + e)));
        store8_bf16(xr + e, v);
      }
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    ss = hsum8(acc);
#endif
    for (; e < dim; e++) {
      if (residual) xr[e] = f32_to_bf16(bf16_to_f32(xr[e]) + bf16_to_f32(residual[r * dim + e]));
      float v = bf16_to_f32(xr[e]);
      ss += v * v;
    }
    float inv = 1.f / sqrtf(ss / (float)dim + eps);
    e = 0;
#ifdef VRIKSHA_AVX2
    __m256 iv = _mm256_set1_ps(inv);
    for (; e + 8 <= dim; e += 8)
      store8_bf16(orow + e, _mm256_mul_ps(load8_bf16(weight + e), round8_bf16(_mm256_mul_ps(load8_bf16(xr + e), iv))));
#endif
    for (; e < dim; e++)
      orow[e] = f32_to_bf16(bf16_to_f32(weight[e]) * round_bf16(bf16_to_f32(xr[e]) * inv));
  }
}

/* Rotary embedding in place (rotate-half form) on bf16 x [tokens, heads, dim], cos/sin [tokens, dim]:
 * x * cos + rotate_half(x) * sin with each product and the sum rounded to bf16, as torch computes it. */
void rope_bf16(bf16* x, const bf16* cos, const bf16* sin, int64_t tokens, int64_t heads, int64_t dim,
               int threads) {
  int64_t half = dim / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (tokens > 1)
  for (int64_t t = 0; t < tokens; t++) {
    const bf16* c = cos + t * dim;
    const bf16* s = sin + t * dim;
    for (int64_t h = 0; h < heads; h++) {
      bf16* xh = x + (t * heads + h) * dim;
      for (int64_t e = 0; e < half; e++) {
        float a = bf16_to_f32(xh[e]), b = bf16_to_f32(xh[e + half]);
        float c0 = bf16_to_f32(c[e]), c1 = bf16_to_f32(c[e + half]);
        float s0 = bf16_to_f32(s[e]), s1 = bf16_to_f32(s[e + half]);
        xh[e] = f32_to_bf16(round_bf16(a * c0) + round_bf16(-b * s0));
        xh[e + half] = f32_to_bf16(round_bf16(b * c1) + round_bf16(a * s1));
      }
    }
  }
}

/* out = bf16(bf16(silu(gate)) * up), elementwise over n bf16 values. */
void silu_mul_bf16(const bf16* gate, const bf16* up, bf16* out, int64_t n, int threads) {
  int64_t blocks = (n + 1023) / 1024;
#pragma omp parallel for schedule(static) num_threads(threads) if (blocks > 8)
  for (int64_t blk = 0; blk < blocks; blk++) {
    int64_t i = blk * 1024, end = i + 1024 < n ? i + 1024 : n;
#ifdef VRIKSHA_AVX2
    __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= end; i += 8) {
      __m256 g = load8_bf16(gate + i);
      __m256 silu = round8_bf16(_mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g)))));
      store8_bf16(out + i, _mm256_mul_ps(silu, load8_bf16(up + i)));
    }
#endif
    for (; i < end; i++) {
      float g = bf16_to_f32(gate[i]);
      out[i] = f32_to_bf16(round_bf16(g / (1.f + expf(-g))) * bf16_to_f32(up[i]));
    }
  }
}
