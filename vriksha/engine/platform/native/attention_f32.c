/* Float32 attention over the KV pool in place, called through ctypes (no gather copy of K/V, no mask tensor).
 *
 * decode_attention_f32: one query token per request over that request's KV slots, with grouped-query heads and
 *   an optional sliding window.
 * prefill_attention_f32: a prompt chunk's causal attention over its slots (a cached prefix, then its own K/V),
 *   (token, query head) lanes of one KV head sixteen at a time.
 * attend_lanes_f32: sixteen query rows ("lanes") of one KV head against the same key slots, the queries
 *   transposed so that a lane is a vector element: every key element is broadcast once against two vectors of
 *   lanes, so a pass of six keys is twelve independent FMA chains and no horizontal sum; the scores of a key
 *   for all lanes then sit side by side, and the softmax and the value sums run across lanes too. Each lane
 *   may see a different number of the slots.
 * Compiled once per instruction set (simd.h); threads: OpenMP, the caller passes its thread count.
 */
#include <stdlib.h>

#include "simd.h"

#define TILE_T float
#define TILE_LOAD8 _mm256_loadu_ps
#define TILE_PREFETCH_KEY prefetch_row
#define TILE_LOAD16 _mm512_loadu_ps
#include "tiles.h"

#ifdef VRIKSHA_AVX2
#define LANES 16
#define KEYS_PER_PASS 6

/* s[j * 16 + u] = scale * q_u . k_j for keys j < keys (slots row[j], KV head h), -inf where j >= seen[u];
 * qt[i * 16 + u] = q_u[i]. Returns the lanes' maxima in mx[16]. */
NO_AUTO_VECTORIZE
static void lane_scores(const float* qt, const float* k_pool, const int64_t* row, int64_t keys, int64_t kv_heads,
                        int64_t h, int64_t d, float scale, const int32_t* seen, float* s, float* mx) {
  const __m256i seen0 = _mm256_loadu_si256((const __m256i*)seen);
  const __m256i seen1 = _mm256_loadu_si256((const __m256i*)(seen + 8));
  const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx0 = ninf, mx1 = ninf;
  for (int64_t j = 0; j < keys; j += KEYS_PER_PASS) {
    int real = keys - j < KEYS_PER_PASS ? (int)(keys - j) : KEYS_PER_PASS;
    const float* k[KEYS_PER_PASS];
    for (int t = 0; t < KEYS_PER_PASS; t++) k[t] = k_pool + (row[t < real ? j + t : j] * kv_heads + h) * d;
    for (int64_t t = j + KEYS_PER_PASS; t < keys && t < j + 2 * KEYS_PER_PASS; t++) {
      const float* p = k_pool + (row[t] * kv_heads + h) * d;
      for (int64_t e = 0; e < d; e += 16) __builtin_prefetch(p + e);
    }
    __m256 a0[KEYS_PER_PASS], a1[KEYS_PER_PASS];
    for (int t = 0; t < KEYS_PER_PASS; t++) a0[t] = a1[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i++) {
      __m256 q0 = _mm256_loadu_ps(qt + i * LANES), q1 = _mm256_loadu_ps(qt + i * LANES + 8);
      for (int t = 0; t < KEYS_PER_PASS; t++) {
        __m256 kb = _mm256_broadcast_ss(k[t] + i);
        a0[t] = _mm256_fmadd_ps(q0, kb, a0[t]);
        a1[t] = _mm256_fmadd_ps(q1, kb, a1[t]);
      }
    }
    /* a constant trip count: a runtime one would make the accumulator arrays memory, stored on every step
     * of the loop above (20% of this function's time on Zen 1) */
#pragma GCC unroll 6
    for (int t = 0; t < KEYS_PER_PASS; t++) {
      if (t >= real) break;
      __m256i jt = _mm256_set1_epi32((int32_t)(j + t));
      __m256 v0 = _mm256_blendv_ps(ninf, _mm256_mul_ps(a0[t], sc), _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen0, jt)));
      __m256 v1 = _mm256_blendv_ps(ninf, _mm256_mul_ps(a1[t], sc), _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen1, jt)));
      _mm256_storeu_ps(s + (j + t) * LANES, v0);
      _mm256_storeu_ps(s + (j + t) * LANES + 8, v1);
      mx0 = _mm256_max_ps(mx0, v0);
      mx1 = _mm256_max_ps(mx1, v1);
    }
  }
  _mm256_storeu_ps(mx, mx0);
  _mm256_storeu_ps(mx + 8, mx1);
}

/* s[j * 16 + u] = e^(s - mx[u]) (0 where j >= seen[u]); l[u] their sums. */
static void lane_exponentials(float* s, int64_t keys, const int32_t* seen, const float* mx, float* l) {
  const __m256i seen0 = _mm256_loadu_si256((const __m256i*)seen);
  const __m256i seen1 = _mm256_loadu_si256((const __m256i*)(seen + 8));
  const __m256 m0 = _mm256_loadu_ps(mx), m1 = _mm256_loadu_ps(mx + 8);
  __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
  for (int64_t j = 0; j < keys; j++) {
    __m256i jt = _mm256_set1_epi32((int32_t)j);
    float* sj = s + j * LANES;
    __m256 e0 = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(sj), m0)),
                              _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen0, jt)));
    __m256 e1 = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(sj + 8), m1)),
                              _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen1, jt)));
    _mm256_storeu_ps(sj, e0);
    _mm256_storeu_ps(sj + 8, e1);
    sum0 = _mm256_add_ps(sum0, e0);
    sum1 = _mm256_add_ps(sum1, e1);
  }
  _mm256_storeu_ps(l, sum0);
  _mm256_storeu_ps(l + 8, sum1);
}

/* o[u0 + c][e0 .. e0 + 16) = sum_j p[j * 16 + u0 + c] v_j[e0 ..] for c < cnt (a constant where inlined). */
static inline __attribute__((always_inline)) void lane_values16(const float* p, const float* v_pool,
                                                                const int64_t* row, int64_t keys, int64_t kv_heads,
                                                                int64_t h, int64_t dv, int64_t e0, int u0, int cnt,
                                                                float* const* o) {
  __m256 a0[6], a1[6];
  for (int c = 0; c < cnt; c++) a0[c] = a1[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < keys; j++) {
    if (j + 4 < keys) __builtin_prefetch(v_pool + (row[j + 4] * kv_heads + h) * dv + e0);
    const float* vj = v_pool + (row[j] * kv_heads + h) * dv + e0;
    __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
    const float* pj = p + j * LANES + u0;
    for (int c = 0; c < cnt; c++) {
      __m256 pb = _mm256_broadcast_ss(pj + c);
      a0[c] = _mm256_fmadd_ps(pb, v0, a0[c]);
      a1[c] = _mm256_fmadd_ps(pb, v1, a1[c]);
    }
  }
  for (int c = 0; c < cnt; c++) {
    _mm256_storeu_ps(o[u0 + c] + e0, a0[c]);
    _mm256_storeu_ps(o[u0 + c] + e0 + 8, a1[c]);
  }
}

/* Up to sixteen query rows q[u] (u < lanes, d floats each) of KV head h over slots row[], lane u seeing the
 * first visible[u] of them: per lane its sum of exponentials l[u] and its unnormalised output
 * o[u] (dv floats, written). d % 8 == 0, dv % 16 == 0. Scratch: qt of 16 * d floats, s of 16 * max(visible)
 * floats. */
static void attend_lanes_f32(const float* const* q, int lanes, const int64_t* visible, const float* k_pool,
                             const float* v_pool, const int64_t* row, int64_t kv_heads, int64_t h,
                             int64_t d, int64_t dv, float scale, float* qt, float* s, float* l,
                             float* const* o) {
  int32_t seen[LANES];
  float m[LANES];
  int64_t keys = 0;
  for (int u = 0; u < LANES; u++) { /* padding lanes repeat lane 0: computed, never stored */
    seen[u] = (int32_t)visible[u < lanes ? u : 0];
    keys = seen[u] > keys ? seen[u] : keys;
  }
  for (int64_t i = 0; i < d; i++)
    for (int u = 0; u < LANES; u++) qt[i * LANES + u] = q[u < lanes ? u : 0][i];
  lane_scores(qt, k_pool, row, keys, kv_heads, h, d, scale, seen, s, m);
  lane_exponentials(s, keys, seen, m, l);
  for (int64_t e0 = 0; e0 < dv; e0 += 16)
    for (int u0 = 0; u0 < lanes; u0 += 6) {
      switch (lanes - u0 < 6 ? lanes - u0 : 6) {
        case 6: lane_values16(s, v_pool, row, keys, kv_heads, h, dv, e0, u0, 6, o); break;
        case 5: lane_values16(s, v_pool, row, keys, kv_heads, h, dv, e0, u0, 5, o); break;
        case 4: lane_values16(s, v_pool, row, keys, kv_heads, h, dv, e0, u0, 4, o); break;
        case 3: lane_values16(s, v_pool, row, keys, kv_heads, h, dv, e0, u0, 3, o); break;
        case 2: lane_values16(s, v_pool, row, keys, kv_heads, h, dv, e0, u0, 2, o); break;
        default: lane_values16(s, v_pool, row, keys, kv_heads, h, dv, e0, u0, 1, o);
      }
    }
}
#endif

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
  if (d % 8 == 0) j = tile_key_quads(qh, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
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

/* Causal attention of a prompt chunk over a float32 pool in place: q [T, H, D], slots [prefix + T] (the chunk's
 * own K/V, already written, last), token t seeing slots [0, prefix + t]; out [T, H, Dv]. Returns -1 where this
 * build cannot (no AVX2/FMA, d % 8 or dv % 16 not 0, out of memory): the caller attends another way. */
int prefill_attention_f32(const float* q, const float* k_pool, const float* v_pool, const int64_t* slots,
                          int64_t prefix, int64_t tokens, float* out, int64_t heads, int64_t kv_heads, int64_t d,
                          int64_t dv, float scale, int threads) {
#ifdef VRIKSHA_AVX2
  if (d % 8 != 0 || dv % 16 != 0 || tokens < 1 || heads % kv_heads != 0) return -1;
  int64_t group = heads / kv_heads, n = prefix + tokens, lanes_per_head = tokens * group;
  int64_t blocks = (lanes_per_head + LANES - 1) / LANES;
  int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
  {
    float* qt = (float*)malloc(sizeof(float) * LANES * d);
    float* s = (float*)malloc(sizeof(float) * LANES * n);
    failed = qt == NULL || s == NULL;
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t h = 0; h < kv_heads; h++)
      for (int64_t blk = blocks - 1; blk >= 0; blk--) { /* the longest (latest tokens) first */
        if (failed) continue;
        int64_t l0 = blk * LANES;
        int lanes = lanes_per_head - l0 < LANES ? (int)(lanes_per_head - l0) : LANES;
        const float* qs[LANES];
        float* os[LANES];
        int64_t visible[LANES] = {0};
        float l[LANES];
        for (int u = 0; u < lanes; u++) {
          int64_t t = (l0 + u) / group, head = h * group + (l0 + u) % group;
          qs[u] = q + (t * heads + head) * d;
          os[u] = out + (t * heads + head) * dv;
          visible[u] = prefix + t + 1;
        }
        attend_lanes_f32(qs, lanes, visible, k_pool, v_pool, slots, kv_heads, h, d, dv, scale, qt, s, l, os);
        for (int u = 0; u < lanes; u++) {
          float inv = 1.f / l[u];
          for (int64_t e = 0; e < dv; e++) os[u][e] *= inv;
        }
      }
    free(qt);
    free(s);
  }
  return failed ? -1 : 0;
#else
  (void)q, (void)k_pool, (void)v_pool, (void)slots, (void)prefix, (void)tokens, (void)out, (void)heads;
  (void)kv_heads, (void)d, (void)dv, (void)scale, (void)threads;
  return -1;
#endif
}
