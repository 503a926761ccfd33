/* AVX2 register tiles shared by kernels.c (float32 weights and keys) and kernels_bf16.c (bfloat16 ones).
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
#endif
