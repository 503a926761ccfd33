/* CPU kernels for the engine's decode path, fp32, called through ctypes (bf16 ones: kernels_bf16.c; float32
 * attention: attention_f32.c).
 *
 * linear_f32: y[m, o] = sum_i W[o, i] x[m, i] (+ b[o]) on the weight as nn.Linear stores it, read once per
 *   call; at decode batch sizes this is bound by memory bandwidth, which these loops reach and MKL's GEMV
 *   does not on small cores.
 * Compiled once per instruction set (simd.h): AVX2/FMA paths, AVX-512 ones where the variant has them,
 * scalar loops otherwise.
 * Threads: OpenMP, sharing the runtime torch already loaded; the caller passes its thread count.
 */
#include <stdlib.h>

#include "simd.h"

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
