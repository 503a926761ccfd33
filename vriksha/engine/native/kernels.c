/* CPU kernels for the engine's decode path, fp32, called through ctypes (bf16 ones: kernels_bf16.c).
 *
 * linear_f32: y[m, o] = sum_i W[o, i] x[m, i] (+ b[o]) on the weight as nn.Linear stores it, read once per
 *   call; at decode batch sizes this is bound by memory bandwidth, which these loops reach and MKL's GEMV
 *   does not on small cores.
 * decode_attention_f32: one query token per request attending over that request's KV slots, read in place
 *   from the pool (no gather copy), with grouped-query heads and an optional sliding window.
 * Compiled once per instruction set (simd.h): AVX2/FMA paths, AVX-512 ones where the variant has them,
 * scalar loops otherwise.
 * Threads: OpenMP, sharing the runtime torch already loaded; the caller passes its thread count.
 */
#include <stdlib.h>

#include "simd.h"

static inline void prefetch_row(const float* p, int64_t n) {
  for (int64_t e = 0; e < n; e += 16) __builtin_prefetch(p + e);
}

#define TILE_T float
#define TILE_LOAD8 _mm256_loadu_ps
#define TILE_PREFETCH_KEY prefetch_row
#define TILE_LOAD16 _mm512_loadu_ps
#include "tiles.h"

/* Four weight rows against one input row: each weight element is loaded once per input row. */
static inline void dot4(const float* w, int64_t in, const float* x, float* out4) {
  const float *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
  int64_t i = 0;
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#ifdef VRIKSHA_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; i + 8 <= in; i += 8) {
    __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xv, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xv, a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xv, a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xv, a3);
  }
  s0 = hsum8(a0); s1 = hsum8(a1); s2 = hsum8(a2); s3 = hsum8(a3);
#endif
  for (; i < in; i++) {
    s0 += w0[i] * x[i]; s1 += w1[i] * x[i]; s2 += w2[i] * x[i]; s3 += w3[i] * x[i];
  }
  out4[0] = s0; out4[1] = s1; out4[2] = s2; out4[3] = s3;
}

#ifdef VRIKSHA_AVX2
/* Four weight rows against two input rows: eight dot products sharing every load. */
static inline void dot4x2(const float* w, int64_t in, const float* x0, const float* x1, float* y0, float* y1) {
#ifdef VRIKSHA_AVX512
  if (in % 16 == 0) {
    const float *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t i = 0; i < in; i += 16) {
      __m512 u = _mm512_loadu_ps(x0 + i), v = _mm512_loadu_ps(x1 + i), k;
      k = _mm512_loadu_ps(w0 + i); a0 = _mm512_fmadd_ps(k, u, a0); b0 = _mm512_fmadd_ps(k, v, b0);
      k = _mm512_loadu_ps(w1 + i); a1 = _mm512_fmadd_ps(k, u, a1); b1 = _mm512_fmadd_ps(k, v, b1);
      k = _mm512_loadu_ps(w2 + i); a2 = _mm512_fmadd_ps(k, u, a2); b2 = _mm512_fmadd_ps(k, v, b2);
      k = _mm512_loadu_ps(w3 + i); a3 = _mm512_fmadd_ps(k, u, a3); b3 = _mm512_fmadd_ps(k, v, b3);
    }
    y0[0] = _mm512_reduce_add_ps(a0); y0[1] = _mm512_reduce_add_ps(a1);
    y0[2] = _mm512_reduce_add_ps(a2); y0[3] = _mm512_reduce_add_ps(a3);
    y1[0] = _mm512_reduce_add_ps(b0); y1[1] = _mm512_reduce_add_ps(b1);
    y1[2] = _mm512_reduce_add_ps(b2); y1[3] = _mm512_reduce_add_ps(b3);
    return;
  }
#endif
  tile_dot4x2(w, in, x0, x1, y0, y1);
}
#endif

static inline void add_bias4(float* y, const float* bias) {
  if (bias)
    for (int k = 0; k < 4; k++) y[k] += bias[k];
}

void linear_f32(const float* w, const float* bias, const float* x, float* y,
                int64_t out, int64_t in, int64_t m, int threads) {
  int64_t blocks = (out + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t blk = 0; blk < blocks; blk++) {
    int64_t o = blk * 4;
    int64_t r = 0;
#ifdef VRIKSHA_AVX2
    if (in % 8 == 0 && o + 4 <= out) {
      const float* b4 = bias ? bias + o : NULL;
      for (; r + 2 <= m; r += 2) {
        float* y0 = y + r * out + o;
        dot4x2(w + o * in, in, x + r * in, x + (r + 1) * in, y0, y0 + out);
        add_bias4(y0, b4); add_bias4(y0 + out, b4);
      }
    }
#endif
    for (; r < m; r++) {
      const float* xr = x + r * in;
      float* yr = y + r * out;
      if (o + 4 <= out) {
        float s[4];
        dot4(w + o * in, in, xr, s);
        for (int k = 0; k < 4; k++) yr[o + k] = s[k] + (bias ? bias[o + k] : 0.f);
      } else {
        for (int64_t k = o; k < out; k++) yr[k] = dot_f32(w + k * in, xr, in) + (bias ? bias[k] : 0.f);
      }
    }
  }
}


/* One request, one KV head: `group` query heads over n KV slots. scores [group * n], acc [group * dv]. */
NO_AUTO_VECTORIZE
static void attend(const float* qh, const float* k_pool, const float* v_pool, const int64_t* row, int64_t n,
                   int64_t kv_heads, int64_t h, int64_t d, int64_t dv, int64_t group, float scale,
                   float* scores, float* acc, float* out) {
  const int64_t ahead = 4;
  (void)ahead;
  int64_t j = 0;
#ifdef VRIKSHA_AVX512
  if (d % 16 == 0) j = keys4_avx512(qh, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
#endif
#ifdef VRIKSHA_AVX2
  if (d % 8 == 0) j = tile_key_pairs(qh, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
#endif
  for (; j < n; j++) {
    const float* kj = k_pool + (row[j] * kv_heads + h) * d;
    for (int64_t g = 0; g < group; g++) scores[g * n + j] = dot_f32(qh + g * d, kj, d) * scale;
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
  /* 32 output values of up to three heads held in twelve registers while the value rows stream past */
  for (; e0 + 32 <= dv; e0 += 32) {
    for (int64_t g = 0; g < group; g += 3) {
      int64_t cnt = group - g < 3 ? group - g : 3;
      const float *p0 = scores + g * n, *p1 = p0 + (cnt > 1 ? n : 0), *p2 = p0 + (cnt > 2 ? 2 * n : 0);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
      for (int64_t j = 0; j < n; j++) {
        if (j + ahead < n) __builtin_prefetch(v_pool + (row[j + ahead] * kv_heads + h) * dv + e0);
        const float* vj = v_pool + (row[j] * kv_heads + h) * dv + e0;
        __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
        __m256 v2 = _mm256_loadu_ps(vj + 16), v3 = _mm256_loadu_ps(vj + 24);
        __m256 p = _mm256_broadcast_ss(p0 + j);
        a0 = _mm256_fmadd_ps(p, v0, a0); a1 = _mm256_fmadd_ps(p, v1, a1);
        a2 = _mm256_fmadd_ps(p, v2, a2); a3 = _mm256_fmadd_ps(p, v3, a3);
        p = _mm256_broadcast_ss(p1 + j);
        b0 = _mm256_fmadd_ps(p, v0, b0); b1 = _mm256_fmadd_ps(p, v1, b1);
        b2 = _mm256_fmadd_ps(p, v2, b2); b3 = _mm256_fmadd_ps(p, v3, b3);
        p = _mm256_broadcast_ss(p2 + j);
        c0 = _mm256_fmadd_ps(p, v0, c0); c1 = _mm256_fmadd_ps(p, v1, c1);
        c2 = _mm256_fmadd_ps(p, v2, c2); c3 = _mm256_fmadd_ps(p, v3, c3);
      }
      float* o = out + g * dv + e0;
      _mm256_storeu_ps(o, a0); _mm256_storeu_ps(o + 8, a1); _mm256_storeu_ps(o + 16, a2); _mm256_storeu_ps(o + 24, a3);
      if (cnt > 1) {
        o += dv;
        _mm256_storeu_ps(o, b0); _mm256_storeu_ps(o + 8, b1); _mm256_storeu_ps(o + 16, b2); _mm256_storeu_ps(o + 24, b3);
      }
      if (cnt > 2) {
        o += dv;
        _mm256_storeu_ps(o, c0); _mm256_storeu_ps(o + 8, c1); _mm256_storeu_ps(o + 16, c2); _mm256_storeu_ps(o + 24, c3);
      }
    }
  }
#endif
  if (e0 < dv) {  /* the remaining values (all of them without AVX2) */
    int64_t rest = dv - e0;
    for (int64_t e = 0; e < group * rest; e++) acc[e] = 0.f;
    for (int64_t j = 0; j < n; j++) {
      const float* vj = v_pool + (row[j] * kv_heads + h) * dv + e0;
      for (int64_t g = 0; g < group; g++) axpy_f32(acc + g * rest, scores[g * n + j], vj, rest);
    }
    for (int64_t g = 0; g < group; g++)
      for (int64_t e = 0; e < rest; e++) out[g * dv + e0 + e] = acc[g * rest + e];
  }
}

/* q [B, H, D]; k_pool [S, Hkv, D]; v_pool [S, Hkv, Dv]; slots [B, max_len]; lens [B]; out [B, H, Dv].
 * window <= 0: attend to all lens[b] tokens; else to the last `window` of them. */
void decode_attention_f32(const float* q, const float* k_pool, const float* v_pool, const int64_t* slots,
                          const int64_t* lens, float* out, int64_t batch, int64_t heads, int64_t kv_heads,
                          int64_t d, int64_t dv, int64_t max_len, float scale, int64_t window, int threads) {
  int64_t group = heads / kv_heads;
#pragma omp parallel num_threads(threads)
  {
    float* scores = (float*)malloc(sizeof(float) * group * (max_len > 0 ? max_len : 1));
    float* acc = (float*)malloc(sizeof(float) * group * dv);
    /* head-major: consecutive tasks read the same head of requests that often share a cached prefix */
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t h = 0; h < kv_heads; h++) {
      for (int64_t b = 0; b < batch; b++) {
        int64_t len = lens[b];
        int64_t start = (window > 0 && len > window) ? len - window : 0;
        attend(q + (b * heads + h * group) * d, k_pool, v_pool, slots + b * max_len + start, len - start,
               kv_heads, h, d, dv, group, scale, scores, acc, out + (b * heads + h * group) * dv);
      }
    }
    free(scores);
    free(acc);
  }
}

/* x [rows, dim] (+= residual [rows, dim] first, in place, when given); out = x / rms(x) * weight. */
void rms_norm_f32(float* x, const float* residual, const float* weight, float* out, int64_t rows, int64_t dim,
                  float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    float* xr = x + r * dim;
    float* orow = out + r * dim;
    if (residual) {
      const float* rr = residual + r * dim;
      for (int64_t e = 0; e < dim; e++) xr[e] += rr[e];
    }
    float ss = dot_f32(xr, xr, dim);
    float inv = 1.f / sqrtf(ss / (float)dim + eps);
    for (int64_t e = 0; e < dim; e++) orow[e] = weight[e] * (xr[e] * inv);
  }
}

/* Rotary embedding in place (rotate-half form): x [tokens, heads, dim]; cos, sin [tokens, dim]. */
void rope_f32(float* x, const float* cos, const float* sin, int64_t tokens, int64_t heads, int64_t dim,
              int threads) {
  int64_t half = dim / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (tokens > 1)
  for (int64_t t = 0; t < tokens; t++) {
    const float* c = cos + t * dim;
    const float* s = sin + t * dim;
    for (int64_t h = 0; h < heads; h++) {
      float* xh = x + (t * heads + h) * dim;
      for (int64_t e = 0; e < half; e++) {
        float a = xh[e], b = xh[e + half];
        xh[e] = a * c[e] - b * s[e];
        xh[e + half] = b * c[e + half] + a * s[e + half];
      }
    }
  }
}

/* out = silu(gate) * up, elementwise over n values. */
void silu_mul_f32(const float* gate, const float* up, float* out, int64_t n, int threads) {
  int64_t blocks = (n + 1023) / 1024;
#pragma omp parallel for schedule(static) num_threads(threads) if (blocks > 8)
  for (int64_t blk = 0; blk < blocks; blk++) {
    int64_t i = blk * 1024, end = i + 1024 < n ? i + 1024 : n;
#ifdef VRIKSHA_AVX2
    __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= end; i += 8) {
      __m256 g = _mm256_loadu_ps(gate + i);
      __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < end; i++) {
      float g = gate[i];
      out[i] = g / (1.f + expf(-g)) * up[i];
    }
  }
}

/* Greedy picks over logits [rows, vocab]: per row the index of its largest value (the first of equal ones, as
 * torch.argmax picks) and that token's log-probability, -log(sum exp(x - max)), in two passes over the row (the
 * second from cache) with no [rows, vocab] log-softmax written. A row holding a NaN or +inf, or only -inf,
 * gets id -1: the caller samples it another way. */
void greedy_pick_f32(const float* logits, int64_t rows, int64_t vocab, int64_t* ids, float* logprobs,
                     int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const float* x = logits + r * vocab;
    int64_t i = 0, best = 0;
    float top = -INFINITY;
    int bad = 0;
#ifdef VRIKSHA_AVX2
    if (vocab >= 8) {
      __m256 vmax = _mm256_loadu_ps(x);
      __m256 nan = _mm256_cmp_ps(vmax, vmax, _CMP_UNORD_Q);
      __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), index = at;
      const __m256i step = _mm256_set1_epi32(8);
      for (i = 8; i + 8 <= vocab; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        index = _mm256_add_epi32(index, step);
        __m256 above = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ); /* strict: each lane keeps its first maximum */
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        vmax = _mm256_blendv_ps(vmax, v, above);
        at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(index), above));
      }
      float lane_max[8];
      int32_t lane_at[8];
      _mm256_storeu_ps(lane_max, vmax);
      _mm256_storeu_si256((__m256i*)lane_at, at);
      bad = _mm256_movemask_ps(nan) != 0;
      for (int k = 0; k < 8; k++)
        if (lane_max[k] > top || (lane_max[k] == top && lane_at[k] < best)) {
          top = lane_max[k];
          best = lane_at[k];
        }
    }
#endif
    for (; i < vocab; i++) {
      if (x[i] != x[i]) bad = 1;
      else if (x[i] > top) { top = x[i]; best = i; }
    }
    if (bad || isinf(top)) {
      ids[r] = -1;
      logprobs[r] = NAN;
      continue;
    }
    float sum = 0.f;
    i = 0;
#ifdef VRIKSHA_AVX2
    __m256 acc = _mm256_setzero_ps(), shift = _mm256_set1_ps(top);
    for (; i + 8 <= vocab; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift)));
    sum = hsum8(acc);
#endif
    for (; i < vocab; i++) sum += expf(x[i] - top);
    ids[r] = best;
    logprobs[r] = -logf(sum);
  }
}
