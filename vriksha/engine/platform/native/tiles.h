/* AVX2 register tiles shared by kernels.c and attention_f32.c (float32 weights and keys) and kernels_bf16.c
 * (bfloat16 ones).
 *
 * No include guard: each kernel source includes this once, after defining
 *   TILE_T                    the element type of the weight and key rows (float or bf16),
 *   TILE_LOAD8(p)             eight of them at p, as a __m256 of float32,
 *   TILE_PREFETCH_KEY(p, d)   the prefetch of a key row of d elements at p, a few rows ahead.
 * The inputs and queries are float32 in both; every sum is float32.
 */
#if !defined(TILE_T) || !defined(TILE_LOAD8) || !defined(TILE_PREFETCH_KEY)
#error "define TILE_T, TILE_LOAD8 and TILE_PREFETCH_KEY before including tiles.h"
#endif

#ifdef VRIKSHA_AVX2
/* Four weight rows against two input rows (in % 8 == 0): eight dot products sharing every load. */
static inline void tile_dot4x2(const TILE_T* w, int64_t in, const float* x0, const float* x1, float* y0,
                               float* y1) {
  const TILE_T *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int64_t i = 0; i < in; i += 8) {
    __m256 u = _mm256_loadu_ps(x0 + i), v = _mm256_loadu_ps(x1 + i), k;
    k = TILE_LOAD8(w0 + i); a0 = _mm256_fmadd_ps(k, u, a0); b0 = _mm256_fmadd_ps(k, v, b0);
    k = TILE_LOAD8(w1 + i); a1 = _mm256_fmadd_ps(k, u, a1); b1 = _mm256_fmadd_ps(k, v, b1);
    k = TILE_LOAD8(w2 + i); a2 = _mm256_fmadd_ps(k, u, a2); b2 = _mm256_fmadd_ps(k, v, b2);
    k = TILE_LOAD8(w3 + i); a3 = _mm256_fmadd_ps(k, u, a3); b3 = _mm256_fmadd_ps(k, v, b3);
  }
  _mm_storeu_ps(y0, hsum8x4(a0, a1, a2, a3));
  _mm_storeu_ps(y1, hsum8x4(b0, b1, b2, b3));
}

/* The scaled scores of key slots j, j + 1, ... (two a pass, from j until fewer than two are left; d % 8 == 0)
 * for the `group` query heads qf [group, d] of KV head h, into scores [group, n]: two key rows against up to
 * three query heads per pass, six dot products sharing five loads a step. Returns the first slot not done. */
NO_AUTO_VECTORIZE /* as the attention loops that inline it */
static inline int64_t tile_key_pairs(const float* qf, const TILE_T* k_pool, const int64_t* row, int64_t j,
                                     int64_t n, int64_t kv_heads, int64_t h, int64_t d, int64_t group,
                                     float scale, float* scores) {
  for (; j + 2 <= n; j += 2) {
    if (j + 5 < n) {
      TILE_PREFETCH_KEY(k_pool + (row[j + 4] * kv_heads + h) * d, d);
      TILE_PREFETCH_KEY(k_pool + (row[j + 5] * kv_heads + h) * d, d);
    }
    const TILE_T* k0 = k_pool + (row[j] * kv_heads + h) * d;
    const TILE_T* k1 = k_pool + (row[j + 1] * kv_heads + h) * d;
    for (int64_t g = 0; g < group; g += 3) {
      int64_t cnt = group - g < 3 ? group - g : 3;
      const float *q0 = qf + g * d, *q1 = q0 + (cnt > 1 ? d : 0), *q2 = q0 + (cnt > 2 ? 2 * d : 0);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, b0 = a0, b1 = a0, b2 = a0;
      for (int64_t i = 0; i < d; i += 8) {
        __m256 u = TILE_LOAD8(k0 + i), v = TILE_LOAD8(k1 + i), qv;
        qv = _mm256_loadu_ps(q0 + i); a0 = _mm256_fmadd_ps(qv, u, a0); b0 = _mm256_fmadd_ps(qv, v, b0);
        qv = _mm256_loadu_ps(q1 + i); a1 = _mm256_fmadd_ps(qv, u, a1); b1 = _mm256_fmadd_ps(qv, v, b1);
        qv = _mm256_loadu_ps(q2 + i); a2 = _mm256_fmadd_ps(qv, u, a2); b2 = _mm256_fmadd_ps(qv, v, b2);
      }
      float r[8];
      _mm_storeu_ps(r, hsum8x4(a0, a1, a2, b0));
      _mm_storeu_ps(r + 4, hsum8x4(b1, b2, b2, b2));
      float* sg = scores + g * n + j;
      sg[0] = r[0] * scale;
      sg[1] = r[3] * scale;
      if (cnt > 1) { sg[n] = r[1] * scale; sg[n + 1] = r[4] * scale; }
      if (cnt > 2) { sg[2 * n] = r[2] * scale; sg[2 * n + 1] = r[5] * scale; }
    }
  }
  return j;
}

/* tile_key_pairs four key rows a pass (from j until fewer than four are left), the pairs then taking the tail:
 * twelve dot products on seven loads a step, where the pairs take five for six, each dot summed in the same
 * order. On Zen 1 float32 decode attention runs about 20% faster with it. */
NO_AUTO_VECTORIZE
static inline int64_t tile_key_quads(const float* qf, const TILE_T* k_pool, const int64_t* row, int64_t j,
                                     int64_t n, int64_t kv_heads, int64_t h, int64_t d, int64_t group,
                                     float scale, float* scores) {
  const __m128 sc = _mm_set1_ps(scale);
  for (; j + 4 <= n; j += 4) {
    if (j + 8 <= n)
      for (int t = 4; t < 8; t++) TILE_PREFETCH_KEY(k_pool + (row[j + t] * kv_heads + h) * d, d);
    const TILE_T* k0 = k_pool + (row[j] * kv_heads + h) * d;
    const TILE_T* k1 = k_pool + (row[j + 1] * kv_heads + h) * d;
    const TILE_T* k2 = k_pool + (row[j + 2] * kv_heads + h) * d;
    const TILE_T* k3 = k_pool + (row[j + 3] * kv_heads + h) * d;
    for (int64_t g = 0; g < group; g += 3) {
      int64_t cnt = group - g < 3 ? group - g : 3;
      const float *q0 = qf + g * d, *q1 = q0 + (cnt > 1 ? d : 0), *q2 = q0 + (cnt > 2 ? 2 * d : 0);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
      for (int64_t i = 0; i < d; i += 8) {
        __m256 x = _mm256_loadu_ps(q0 + i), y = _mm256_loadu_ps(q1 + i), z = _mm256_loadu_ps(q2 + i), k;
        k = TILE_LOAD8(k0 + i);
        a0 = _mm256_fmadd_ps(x, k, a0); b0 = _mm256_fmadd_ps(y, k, b0); c0 = _mm256_fmadd_ps(z, k, c0);
        k = TILE_LOAD8(k1 + i);
        a1 = _mm256_fmadd_ps(x, k, a1); b1 = _mm256_fmadd_ps(y, k, b1); c1 = _mm256_fmadd_ps(z, k, c1);
        k = TILE_LOAD8(k2 + i);
        a2 = _mm256_fmadd_ps(x, k, a2); b2 = _mm256_fmadd_ps(y, k, b2); c2 = _mm256_fmadd_ps(z, k, c2);
        k = TILE_LOAD8(k3 + i);
        a3 = _mm256_fmadd_ps(x, k, a3); b3 = _mm256_fmadd_ps(y, k, b3); c3 = _mm256_fmadd_ps(z, k, c3);
      }
      float* sg = scores + g * n + j;
      _mm_storeu_ps(sg, _mm_mul_ps(hsum8x4(a0, a1, a2, a3), sc));
      if (cnt > 1) _mm_storeu_ps(sg + n, _mm_mul_ps(hsum8x4(b0, b1, b2, b3), sc));
      if (cnt > 2) _mm_storeu_ps(sg + 2 * n, _mm_mul_ps(hsum8x4(c0, c1, c2, c3), sc));
    }
  }
  return j;
}
#endif

#if defined(VRIKSHA_AVX512) && defined(TILE_LOAD16)
/* AVX-512 decode attention pieces; TILE_LOAD16(p): sixteen key or value elements at p as a __m512 of float32. */
/* Scores of four key rows against up to three query heads per pass (d % 16 == 0): each key vector loaded once
 * for every head, the sixteen-wide partial sums folded to four per head at the end. */
static inline int64_t keys4_avx512(const float* qh, const TILE_T* k_pool, const int64_t* row, int64_t j, int64_t n,
                                   int64_t kv_heads, int64_t h, int64_t d, int64_t group, float scale,
                                   float* scores) {
  for (; j + 4 <= n; j += 4) {
    if (j + 8 < n)
      for (int t = 4; t < 8; t++) __builtin_prefetch(k_pool + (row[j + t] * kv_heads + h) * d);
    const TILE_T* k[4];
    for (int t = 0; t < 4; t++) k[t] = k_pool + (row[j + t] * kv_heads + h) * d;
    for (int64_t g = 0; g < group; g += 3) {
      int64_t cnt = group - g < 3 ? group - g : 3;
      const float *q0 = qh + g * d, *q1 = q0 + (cnt > 1 ? d : 0), *q2 = q0 + (cnt > 2 ? 2 * d : 0);
      __m512 a[3][4];
      for (int c = 0; c < 3; c++)
        for (int t = 0; t < 4; t++) a[c][t] = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        __m512 x0 = _mm512_loadu_ps(q0 + i), x1 = _mm512_loadu_ps(q1 + i), x2 = _mm512_loadu_ps(q2 + i);
        for (int t = 0; t < 4; t++) {
          __m512 kv = TILE_LOAD16(k[t] + i);
          a[0][t] = _mm512_fmadd_ps(x0, kv, a[0][t]);
          a[1][t] = _mm512_fmadd_ps(x1, kv, a[1][t]);
          a[2][t] = _mm512_fmadd_ps(x2, kv, a[2][t]);
        }
      }
      for (int c = 0; c < cnt; c++) {
        __m256 y[4];
        for (int t = 0; t < 4; t++)
          y[t] = _mm256_add_ps(_mm512_castps512_ps256(a[c][t]), _mm512_extractf32x8_ps(a[c][t], 1));
        _mm_storeu_ps(scores + (g + c) * n + j, _mm_mul_ps(hsum8x4(y[0], y[1], y[2], y[3]), _mm_set1_ps(scale)));
      }
    }
  }
  return j;
}

/* out[g, :] = sum_j p[g, j] v_j for up to three heads at a time, 64 values held in four registers per head. */
static inline void values64_avx512(const float* scores, const TILE_T* v_pool, const int64_t* row, int64_t n,
                                   int64_t kv_heads, int64_t h, int64_t dv, int64_t group, float* out) {
  for (int64_t e0 = 0; e0 < dv; e0 += 64) {
    for (int64_t g = 0; g < group; g += 3) {
      int64_t cnt = group - g < 3 ? group - g : 3;
      const float *p0 = scores + g * n, *p1 = p0 + (cnt > 1 ? n : 0), *p2 = p0 + (cnt > 2 ? 2 * n : 0);
      __m512 a[3][4];
      for (int c = 0; c < 3; c++)
        for (int t = 0; t < 4; t++) a[c][t] = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; j++) {
        if (j + 4 < n) __builtin_prefetch(v_pool + (row[j + 4] * kv_heads + h) * dv + e0);
        const TILE_T* vj = v_pool + (row[j] * kv_heads + h) * dv + e0;
        __m512 b0 = _mm512_set1_ps(p0[j]), b1 = _mm512_set1_ps(p1[j]), b2 = _mm512_set1_ps(p2[j]);
        for (int t = 0; t < 4; t++) {
          __m512 v = TILE_LOAD16(vj + 16 * t);
          a[0][t] = _mm512_fmadd_ps(b0, v, a[0][t]);
          a[1][t] = _mm512_fmadd_ps(b1, v, a[1][t]);
          a[2][t] = _mm512_fmadd_ps(b2, v, a[2][t]);
        }
      }
      for (int c = 0; c < cnt; c++)
        for (int t = 0; t < 4; t++) _mm512_storeu_ps(out + (g + c) * dv + e0 + 16 * t, a[c][t]);
    }
  }
}
#endif
