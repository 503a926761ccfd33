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
#include "amx.h"

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

#ifdef VRIKSHA_AVX512_BF16
/* The key rows of slots j..j + 15 of KV head h (slots past n repeat slot j: computed, never stored), and a
 * prefetch of the sixteen after them. Returns how many are real. */
static inline int key_rows16(const bf16* k_pool, const int64_t* row, int64_t j, int64_t n, int64_t kv_heads,
                             int64_t h, int64_t d, const bf16** k) {
  int real = n - j < 16 ? (int)(n - j) : 16;
  for (int t = 0; t < 16; t++) k[t] = k_pool + (row[t < real ? j + t : j] * kv_heads + h) * d;
  for (int64_t t = j + 16; t < n && t < j + 32; t++) {
    const char* p = (const char*)(k_pool + (row[t] * kv_heads + h) * d);
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
  }
  return real;
}

/* The scaled scores of every key slot (d % 32 == 0) for the `group` query heads qb [group, d] (bf16) of KV
 * head h, into scores [group, n]: sixteen key rows a pass for one head at a time on bf16 pairs (each product
 * exact in float32 and summed there), their sixteen-wide partial sums folded into one vector of sixteen
 * scores (hsum16x16), so no horizontal sum is paid per key. */
static inline void keys16_bf16_pairs(const bf16* qb, const bf16* k_pool, const int64_t* row, int64_t n,
                                     int64_t kv_heads, int64_t h, int64_t d, int64_t group, float scale,
                                     float* scores) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 16) {
    const bf16* k[16];
    int real = key_rows16(k_pool, row, j, n, kv_heads, h, d, k);
    for (int64_t g = 0; g < group; g++) {
      __m512 acc[16];
      for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 32) {
        __m512bh x = (__m512bh)_mm512_loadu_si512((const void*)(qb + g * d + i));
        for (int t = 0; t < 16; t++)
          acc[t] = _mm512_dpbf16_ps(acc[t], x, (__m512bh)_mm512_loadu_si512((const void*)(k[t] + i)));
      }
      _mm512_mask_storeu_ps(scores + g * n + j, (__mmask16)((1u << real) - 1),
                            _mm512_mul_ps(hsum16x16(acc), scale16));
    }
  }
}

#endif

/* ---- Shared prefixes (cascade attention) ------------------------------------------------------------------
 * Requests that share a cached prompt prefix hold the same pool slots for it (the radix cache hands them
 * out once). Attending row by row reads that prefix's keys and values once per request; here each group of
 * requests sharing at least SHARED_MIN slots attends to them once, all its query heads together (sixteen
 * to a vector: the keys are broadcast pairs against the queries transposed, so every bf16 pair product fills
 * sixteen lanes and no horizontal sum is needed), leaving per query head its running maximum m, its sum of
 * exponentials l and its unnormalised output o; each row then attends to its own slots after the prefix and
 * merges: out = (o e^(m - M) + sum_j e^(s_j - M) v_j) / (l e^(m - M) + sum_j e^(s_j - M)), M the maximum of
 * both. The same sums as one softmax over all the slots, in another order. */
#define SHARED_MIN 64

typedef struct {
  int64_t groups;
  int64_t* members; /* [batch]: the rows of group 0, then of group 1, ... */
  int64_t* first;   /* [groups + 1]: group i is members[first[i]..first[i + 1]) */
  int64_t* shared;  /* [groups]: the slots its rows share */
  int64_t* of_row;  /* [batch]: a row's group, or -1 */
} PrefixGroups;

#ifdef VRIKSHA_AVX512_BF16
/* Rows with the same first slot whose common prefix (at most each row's length minus one) reaches SHARED_MIN. */
static void find_prefix_groups(const int64_t* slots, const int64_t* lens, int64_t batch, int64_t max_len,
                               PrefixGroups* pg) {
  int64_t* order = pg->members;
  pg->groups = 0;
  pg->first[0] = 0;
  for (int64_t b = 0; b < batch; b++) pg->of_row[b] = -1;
  int64_t m = 0;
  for (int64_t b = 0; b < batch; b++) /* insertion sort of the rows of length > SHARED_MIN by first slot */
    if (lens[b] > SHARED_MIN) {
      int64_t i = m++;
      for (; i > 0 && slots[order[i - 1] * max_len] > slots[b * max_len]; i--) order[i] = order[i - 1];
      order[i] = b;
    }
  int64_t kept = 0;
  for (int64_t a = 0; a < m;) {
    int64_t e = a + 1, r0 = order[a];
    while (e < m && slots[order[e] * max_len] == slots[r0 * max_len]) e++;
    int64_t shared = lens[r0] - 1;
    for (int64_t i = a + 1; i < e; i++) {
      const int64_t *x = slots + r0 * max_len, *y = slots + order[i] * max_len;
      int64_t limit = shared < lens[order[i]] - 1 ? shared : lens[order[i]] - 1, k = 0;
      while (k < limit && x[k] == y[k]) k++;
      shared = k;
    }
    if (e - a >= 2 && shared >= SHARED_MIN) {
      for (int64_t i = a; i < e; i++) {
        order[kept++] = order[i];
        pg->of_row[order[i]] = pg->groups;
      }
      pg->shared[pg->groups++] = shared;
      pg->first[pg->groups] = kept;
    }
    a = e;
  }
}

/* The value rows of slots row[0..keys) (KV head h) in key pairs: vi[jp * 2dv + 2e + p] = v[row[2jp + p]][e]; an odd
 * count's last pair repeats its key (weighed by a zero probability). */
static inline void interleave_value_pairs(const bf16* v_pool, const int64_t* row, int64_t keys, int64_t kv_heads,
                                          int64_t h, int64_t dv, bf16* vi) {
  static const uint16_t pairs[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i first = _mm512_loadu_si512((const void*)pairs); /* element e of a, then of b, e < 16 */
  const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
  for (int64_t j = 0; j < keys; j += 2) {
    const bf16* a = v_pool + (row[j] * kv_heads + h) * dv;
    const bf16* b = v_pool + (row[j + 1 < keys ? j + 1 : j] * kv_heads + h) * dv;
    if (j + 8 < keys) {
      __builtin_prefetch(v_pool + (row[j + 8] * kv_heads + h) * dv);
      __builtin_prefetch(v_pool + (row[j + 9 < keys ? j + 9 : j + 8] * kv_heads + h) * dv);
    }
    bf16* out = vi + j * dv;
    for (int64_t e = 0; e < dv; e += 32) {
      __m512i x = _mm512_loadu_si512((const void*)(a + e)), y = _mm512_loadu_si512((const void*)(b + e));
      _mm512_storeu_si512((void*)(out + 2 * e), _mm512_permutex2var_epi16(x, first, y));
      _mm512_storeu_si512((void*)(out + 2 * e + 32), _mm512_permutex2var_epi16(x, second, y));
    }
  }
}

/* Keys of scratch the attention lanes need for n slots: the AMX version works in chunks of 32 keys. */
#define LANE_SCRATCH_KEYS(n) (((n) + 31) / 32 * 32)

/* The value rows of all n slots for the attention lanes (interleave_value_pairs), zeros past them up to
 * LANE_SCRATCH_KEYS(n) keys: interleaved once and read by every pass of lanes over these slots, whatever
 * number of them a pass sees (its probabilities past them are zero, and the values there finite). */
static inline void lane_values(const bf16* v_pool, const int64_t* row, int64_t n, int64_t kv_heads, int64_t h,
                               int64_t dv, bf16* vi) {
  interleave_value_pairs(v_pool, row, n, kv_heads, h, dv, vi);
  int64_t written = (n + 1) / 2 * 2;
  memset(vi + written * dv, 0, (size_t)(LANE_SCRATCH_KEYS(n) - written) * dv * sizeof(bf16));
}

/* o[u0 + c][e0 .. e0 + 64) = sum over key pairs of lane u0 + c's probability pair against the value pair, for
 * c < C (a constant where inlined: C x 4 float32 accumulators). */
static inline __attribute__((always_inline)) void weigh_values(const uint32_t* pp, const bf16* vi, int64_t pairs,
                                                               int64_t dv, int64_t e0, int u0, int C,
                                                               float* const* o) {
  __m512 a[6][4];
  for (int c = 0; c < C; c++)
    for (int t = 0; t < 4; t++) a[c][t] = _mm512_setzero_ps();
  for (int64_t jp = 0; jp < pairs; jp++) {
    const bf16* w = vi + jp * 2 * dv + 2 * e0;
    __m512bh v[4];
    for (int t = 0; t < 4; t++) v[t] = (__m512bh)_mm512_loadu_si512((const void*)(w + 32 * t));
    const uint32_t* p = pp + jp * 16 + u0;
    for (int c = 0; c < C; c++) {
      __m512bh pc = (__m512bh)_mm512_set1_epi32((int32_t)p[c]);
      for (int t = 0; t < 4; t++) a[c][t] = _mm512_dpbf16_ps(a[c][t], pc, v[t]);
    }
  }
  for (int c = 0; c < C; c++)
    for (int t = 0; t < 4; t++) _mm512_storeu_ps(o[u0 + c] + e0 + 16 * t, a[c][t]);
}

/* The lanes' common set-up: seen[u], how many keys lane u sees (lanes past `lanes` copy lane 0), the most any
 * lane sees (returned), and qt[i][u], element pair i of lane u's query. */
static inline int64_t lanes_setup(const bf16* const* q, int lanes, const int64_t* visible, int64_t n, int64_t d,
                                  uint32_t* qt, int32_t* seen) {
  for (int u = 0; u < 16; u++) seen[u] = (int32_t)(visible ? visible[u < lanes ? u : 0] : n);
  int64_t keys = 0;
  for (int u = 0; u < lanes; u++) keys = seen[u] > keys ? seen[u] : keys;
  for (int64_t i = 0; i < d / 2; i++)
    for (int u = 0; u < 16; u++) memcpy(qt + i * 16 + u, q[u < lanes ? u : 0] + 2 * i, 4);
  return keys;
}

/* The scaled raw scores of key j's row of sixteen lanes, masked to the keys each lane sees, stored at s[j * 16];
 * returns the running maximum. */
static inline __m512 lanes_store_scores(__m512 raw, int64_t j, __m512i seen16, __m512 scale16, float* s, __m512 mx) {
  __mmask16 sees = _mm512_cmpgt_epi32_mask(seen16, _mm512_set1_epi32((int32_t)j));
  __m512 v = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), sees, raw, scale16);
  _mm512_storeu_ps(s + j * 16, v);
  return _mm512_max_ps(mx, v);
}

/* The softmax down the key axis of the scores s [keys][16 lanes]: pp[jp * 16 + u], lane u's probabilities of
 * keys 2jp and 2jp + 1 rounded to bf16, written over s (row jp is written after rows 2jp and 2jp + 1 are read);
 * m[u] and l[u] the maximum and the sum of the rounded probabilities. Returns the number of pairs. */
static inline int64_t lanes_softmax(float* s, int64_t keys, __m512i seen16, __m512 mx, float* m, float* l) {
  uint32_t* pp = (uint32_t*)s;
  int64_t pairs = (keys + 1) / 2;
  __m512 sum = _mm512_setzero_ps();
  for (int64_t jp = 0; jp < pairs; jp++) {
    __m512i half[2];
    for (int p = 0; p < 2; p++) {
      int64_t j = 2 * jp + p;
      __m256i b = _mm256_setzero_si256();
      if (j < keys) { /* an unseen key's exponential is 0, not exp16's floor */
        __mmask16 sees = _mm512_cmpgt_epi32_mask(seen16, _mm512_set1_epi32((int32_t)j));
        __m512 e = _mm512_maskz_mov_ps(sees, exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j * 16), mx)));
        b = (__m256i)_mm512_cvtneps_pbh(e);
      }
      half[p] = _mm512_cvtepu16_epi32(b);
      sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(half[p], 16)));
    }
    _mm512_storeu_si512((void*)(pp + jp * 16), _mm512_or_si512(half[0], _mm512_slli_epi32(half[1], 16)));
  }
  _mm512_storeu_ps(m, mx);
  _mm512_storeu_ps(l, sum);
  return pairs;
}

/* Up to sixteen query vectors ("lanes": q[u], d bf16 values, of KV head h's group) against the key and value
 * rows of slots row[0..n), lane u seeing the first visible[u] of them (visible NULL: all n; at least one):
 * leaves per lane its maximum score m[u], its sum of exponentials l[u] and its unnormalised output o[u]
 * (dv floats). The queries are transposed into bf16 pairs sixteen to a vector and each key pair broadcast
 * against them, so one instruction advances sixteen scores with no horizontal sum; the softmax runs down the
 * key axis; each probability is rounded to bf16 (the precision of the values it weighs) and paired with the
 * next key's, so that one bf16-pair instruction against the value rows interleaved in pairs advances sixteen
 * outputs by two keys, in float32 sums, up to six lanes at a time; l sums the rounded probabilities, so the
 * weights stay normalised. Lanes past `lanes` are padding: their scores are computed, never stored. vi: the
 * value rows of the n slots as lane_values leaves them (shared by every pass over these slots). Scratch
 * (LANE_SCRATCH_KEYS(n) keys, for either this or the AMX version): qt of d / 2 * 16 pairs, s of 16 floats a key.
 * d % 32 == 0, dv % 64 == 0. */
static void attend_lanes_pairs(const bf16* const* q, int lanes, const int64_t* visible, const bf16* k_pool,
                               const int64_t* row, int64_t n, int64_t kv_heads, int64_t h, int64_t d, int64_t dv,
                               float scale, uint32_t* qt, float* s, const bf16* vi, float* m, float* l,
                               float* const* o) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  int32_t seen[16];
  int64_t keys = lanes_setup(q, lanes, visible, n, d, qt, seen);
  const __m512i seen16 = _mm512_loadu_si512((const void*)seen);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < keys; j += 8) {
    int real = keys - j < 8 ? (int)(keys - j) : 8;
    const bf16* k[8];
    for (int t = 0; t < 8; t++) k[t] = k_pool + (row[t < real ? j + t : j] * kv_heads + h) * d;
    for (int64_t t = j + 16; t < keys && t < j + 24; t++) {
      const char* p = (const char*)(k_pool + (row[t] * kv_heads + h) * d);
      __builtin_prefetch(p);
      __builtin_prefetch(p + 64);
    }
    __m512 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d / 2; i++) {
      __m512bh x = (__m512bh)_mm512_loadu_si512((const void*)(qt + i * 16));
      for (int t = 0; t < 8; t++) {
        int32_t pair;
        memcpy(&pair, k[t] + 2 * i, 4);
        acc[t] = _mm512_dpbf16_ps(acc[t], x, (__m512bh)_mm512_set1_epi32(pair));
      }
    }
    for (int t = 0; t < real; t++) mx = lanes_store_scores(acc[t], j + t, seen16, scale16, s, mx);
  }
  uint32_t* pp = (uint32_t*)s;
  int64_t pairs = lanes_softmax(s, keys, seen16, mx, m, l);
  for (int64_t e0 = 0; e0 < dv; e0 += 64)
    for (int u0 = 0; u0 < lanes; u0 += 6) {
      switch (lanes - u0 < 6 ? lanes - u0 : 6) {
        case 6: weigh_values(pp, vi, pairs, dv, e0, u0, 6, o); break;
        case 5: weigh_values(pp, vi, pairs, dv, e0, u0, 5, o); break;
        case 4: weigh_values(pp, vi, pairs, dv, e0, u0, 4, o); break;
        case 3: weigh_values(pp, vi, pairs, dv, e0, u0, 3, o); break;
        case 2: weigh_values(pp, vi, pairs, dv, e0, u0, 2, o); break;
        default: weigh_values(pp, vi, pairs, dv, e0, u0, 1, o);
      }
    }
}

#ifdef VRIKSHA_AMX
/* m [16][16] uint32, transposed in place. */
static inline void transpose16_epi32(uint32_t* m) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void*)(m + 16 * i));
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < 16; i++) _mm512_storeu_si512((void*)(m + 16 * i), r[i]);
}

#define AMX_LANES_MAX_D 256
#define AMX_VALUE_TILE(T, B)                                                                                  \
  do {                                                                                                        \
    _tile_loadd(B, vi + c * 32 * dv + 2 * (e0 + 16 * (T)), 4 * dv);                                            \
    _tile_dpbf16ps(T, 4, B);                                                                                  \
  } while (0)

/* attend_lanes_pairs on AMX tiles, the same arithmetic (bf16 products, float32 sums; the tiles sum in
 * another order): the scores of sixteen keys at a time are one tile product per 32 query elements, the key
 * rows (A: 16 keys x 32 values, read in place where the sixteen slots are consecutive, else gathered) against
 * the transposed queries (B: qt as it is), giving the scores tile keys x lanes as the softmax reads them; the
 * values of 32 keys are one tile product per 16 output values, the probabilities (A: lanes x 32 keys, pp's
 * 16 x 16 pair blocks transposed) against the value rows interleaved in pairs (B: vi as it is), summed into
 * four output tiles (64 values) across all the keys. Scratch as attend_lanes_pairs; d <= AMX_LANES_MAX_D. */
AMX_TARGET static void attend_lanes_amx(const bf16* const* q, int lanes, const int64_t* visible,
                                        const bf16* k_pool, const int64_t* row, int64_t n, int64_t kv_heads,
                                        int64_t h, int64_t d, int64_t dv, float scale, uint32_t* qt, float* s,
                                        const bf16* vi, float* m, float* l, float* const* o) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  int32_t seen[16];
  int64_t keys = lanes_setup(q, lanes, visible, n, d, qt, seen);
  const __m512i seen16 = _mm512_loadu_si512((const void*)seen);
  _Alignas(64) bf16 kb[16 * AMX_LANES_MAX_D];
  amx_configure();
  __m512 mx = _mm512_set1_ps(-INFINITY);
  const int64_t pool_stride = kv_heads * d * (int64_t)sizeof(bf16);
  for (int64_t j = 0; j < keys; j += 16) {
    int real = keys - j < 16 ? (int)(keys - j) : 16;
    int consecutive = real == 16;
    for (int t = 1; t < 16 && consecutive; t++) consecutive = row[j + t] == row[j] + t;
    for (int64_t t = j + 16; t < keys && t < j + 32; t++) {
      const char* p = (const char*)(k_pool + (row[t] * kv_heads + h) * d);
      for (int64_t b = 0; b < d * (int64_t)sizeof(bf16); b += 64) __builtin_prefetch(p + b);
    }
    const bf16* base = kb;
    int64_t stride = d * (int64_t)sizeof(bf16);
    if (consecutive) {
      base = k_pool + (row[j] * kv_heads + h) * d;
      stride = pool_stride;
    } else {
      for (int t = 0; t < 16; t++)
        memcpy(kb + t * d, k_pool + (row[t < real ? j + t : j] * kv_heads + h) * d, (size_t)d * sizeof(bf16));
    }
    _tile_zero(6);
    for (int64_t c = 0; c < d / 32; c++) {
      _tile_loadd(4, base + 32 * c, stride);
      _tile_loadd(5, qt + c * 16 * 16, 64);
      _tile_dpbf16ps(6, 4, 5);
    }
    _tile_stored(6, s + j * 16, 64); /* raw scores, masked and scaled in place (rows past `real` unread) */
    for (int t = 0; t < real; t++)
      mx = lanes_store_scores(_mm512_loadu_ps(s + (j + t) * 16), j + t, seen16, scale16, s, mx);
  }
  uint32_t* pp = (uint32_t*)s;
  int64_t pairs = lanes_softmax(s, keys, seen16, mx, m, l);
  int64_t chunks = (pairs + 15) / 16; /* of 16 pairs (32 keys); past `pairs`, zero probabilities */
  memset(pp + pairs * 16, 0, (size_t)(chunks * 16 - pairs) * 16 * sizeof(uint32_t));
  for (int64_t c = 0; c < chunks; c++) transpose16_epi32(pp + c * 256); /* now [lane][pair] per chunk */
  _Alignas(64) float ot[4][16 * 16];
  for (int64_t e0 = 0; e0 < dv; e0 += 64) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < chunks; c++) {
      _tile_loadd(4, pp + c * 256, 64);
      AMX_VALUE_TILE(0, 5);
      AMX_VALUE_TILE(1, 7);
      AMX_VALUE_TILE(2, 5);
      AMX_VALUE_TILE(3, 7);
    }
    _tile_stored(0, ot[0], 64);
    _tile_stored(1, ot[1], 64);
    _tile_stored(2, ot[2], 64);
    _tile_stored(3, ot[3], 64);
    for (int u = 0; u < lanes; u++)
      for (int t = 0; t < 4; t++) _mm512_storeu_ps(o[u] + e0 + 16 * t, _mm512_load_ps(ot[t] + 16 * u));
  }
  _tile_release();
}
#endif

/* Whether attend_lanes runs on AMX tiles: -1 until first asked, then 1 where this library may use them; set
 * with attention_amx(). */
static int lanes_on_amx = -1;

/* request 1: use AMX tiles for the attention lanes where this process may (0: never); -1 asks. Returns
 * whether they are used. Called outside the kernels' parallel regions. */
int attention_amx(int request) {
#ifdef VRIKSHA_AMX
  if (request >= 0 || lanes_on_amx < 0) lanes_on_amx = request != 0 && amx_usable();
#else
  (void)request;
  lanes_on_amx = 0;
#endif
  return lanes_on_amx;
}

/* attend_lanes_pairs, or its AMX version where attention_amx() allows (decided before the parallel region). */
static void attend_lanes(const bf16* const* q, int lanes, const int64_t* visible, const bf16* k_pool,
                         const int64_t* row, int64_t n, int64_t kv_heads, int64_t h, int64_t d, int64_t dv,
                         float scale, uint32_t* qt, float* s, const bf16* vi, float* m, float* l, float* const* o) {
#ifdef VRIKSHA_AMX
  if (lanes_on_amx > 0 && d <= AMX_LANES_MAX_D) {
    attend_lanes_amx(q, lanes, visible, k_pool, row, n, kv_heads, h, d, dv, scale, qt, s, vi, m, l, o);
    return;
  }
#endif
  attend_lanes_pairs(q, lanes, visible, k_pool, row, n, kv_heads, h, d, dv, scale, qt, s, vi, m, l, o);
}

/* One group's shared slots `row` [n] (n >= 1), KV head h: for its `rows` members' query heads (q [B, H, D],
 * bf16), m, l [B, H] and o [B, H, Dv] (unnormalised) at each member's query heads of h. */
static void attend_prefix(const bf16* q, const bf16* k_pool, const bf16* v_pool, const int64_t* row, int64_t n,
                          const int64_t* members, int64_t rows, int64_t heads, int64_t kv_heads, int64_t h,
                          int64_t d, int64_t dv, int64_t group, float scale, uint32_t* qt, float* s, bf16* vi, float* m,
                          float* l, float* o) {
  int64_t queries = rows * group;
  lane_values(v_pool, row, n, kv_heads, h, dv, vi);
  for (int64_t q0 = 0; q0 < queries; q0 += 16) {
    int lanes = queries - q0 < 16 ? (int)(queries - q0) : 16;
    const bf16* qs[16];
    float* os[16];
    float ms[16], ls[16];
    int64_t at[16]; /* each lane's query head: member row * heads + head */
    for (int u = 0; u < lanes; u++) {
      at[u] = members[(q0 + u) / group] * heads + h * group + (q0 + u) % group;
      qs[u] = q + at[u] * d;
      os[u] = o + at[u] * dv;
    }
    attend_lanes(qs, lanes, NULL, k_pool, row, n, kv_heads, h, d, dv, scale, qt, s, vi, ms, ls, os);
    for (int u = 0; u < lanes; u++) {
      m[at[u]] = ms[u];
      l[at[u]] = ls[u];
    }
  }
}
#else
int attention_amx(int request) {
  (void)request;
  return 0;
}
#endif

/* out [group, dv] = sum_j scores[g, j] v_j over n slots (n may be 0). vrow: scratch of dv floats. */
NO_AUTO_VECTORIZE
static void values_bf16(const float* scores, const bf16* v_pool, const int64_t* row, int64_t n, int64_t kv_heads,
                        int64_t h, int64_t dv, int64_t group, float* vrow, float* out) {
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

/* scores [group, n] of one row's slots after a shared prefix whose state for the group's heads is m, l [group],
 * o [group, dv]: each head's scores become the weights of the merged softmax (see above), and carry[g] the
 * weight of o. n may be 0. */
static void softmax_after_prefix(float* scores, int64_t n, int64_t group, const float* m, const float* l,
                                 float* carry) {
  for (int64_t g = 0; g < group; g++) {
    float* sg = scores + g * n;
    float mx = m[g];
    for (int64_t j = 0; j < n; j++) mx = sg[j] > mx ? sg[j] : mx;
    float shift = expf(m[g] - mx);
    float inv = 1.f / (shift * l[g] + exp_shifted_sum(sg, n, mx));
    for (int64_t j = 0; j < n; j++) sg[j] *= inv;
    carry[g] = shift * inv;
  }
}

/* One request, one KV head: `group` query heads (qf float32, qb bf16) over n KV slots; with `prefix` (m, l, o
 * of a shared prefix before these slots, as attend_prefix leaves them) merged into the same softmax. */
NO_AUTO_VECTORIZE
static void attend_bf16(const float* qf, const bf16* qb, const bf16* k_pool, const bf16* v_pool,
                        const int64_t* row, int64_t n, int64_t kv_heads, int64_t h, int64_t d, int64_t dv,
                        int64_t group, float scale, float* scores, float* vrow, float* out,
                        const float* prefix_m, const float* prefix_l, const float* prefix_o) {
  /* vrow: scratch of max(d, dv) floats, and `group` more */
  (void)qb;
  int64_t j = 0;
#ifdef VRIKSHA_AVX512_BF16
  if (d % 32 == 0) {
    keys16_bf16_pairs(qb, k_pool, row, n, kv_heads, h, d, group, scale, scores);
    j = n;
  }
#endif
#ifdef VRIKSHA_AVX512
  /* four key rows widened once each for up to three query heads */
  if (d % 16 == 0) j = keys4_avx512(qf, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
#endif
#ifdef VRIKSHA_AVX2
  /* four, then two key rows against up to three query heads per pass: each key element widened once, used
   * thrice */
  if (d % 8 == 0) j = tile_key_quads(qf, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
  if (d % 8 == 0) j = tile_key_pairs(qf, k_pool, row, j, n, kv_heads, h, d, group, scale, scores);
#endif
  for (; j < n; j++) {
    const bf16* kj = k_pool + (row[j] * kv_heads + h) * d;
    widen_bf16(vrow, kj, d);  /* once per key row, for every query head of the group */
    for (int64_t g = 0; g < group; g++) scores[g * n + j] = dot_f32(qf + g * d, vrow, d) * scale;
  }
  float* carry = vrow + (dv > d ? dv : d);
  if (prefix_m)
    softmax_after_prefix(scores, n, group, prefix_m, prefix_l, carry);
  else
    for (int64_t g = 0; g < group; g++) softmax_inplace(scores + g * n, n);
  values_bf16(scores, v_pool, row, n, kv_heads, h, dv, group, vrow, out);
  if (prefix_m)
    for (int64_t g = 0; g < group; g++) axpy_f32(out + g * dv, carry[g], prefix_o + g * dv, dv);
}

/* Decode attention over a bf16 pool for a query given in bf16 (`q16`) or in float32 (`q32`, rounded to bf16
 * first, as the engine's Python path rounds it before calling decode_attention_bf16): one of the two is NULL.
 * Rows sharing a long prefix attend to it together first (attend_prefix), where the kernels allow. */
static void attend_bf16_pool(const bf16* q16, const float* q32, const bf16* k_pool, const bf16* v_pool,
                             const int64_t* slots, const int64_t* lens, float* out, int64_t batch, int64_t heads,
                             int64_t kv_heads, int64_t d, int64_t dv, int64_t max_len, float scale,
                             int64_t window, int threads) {
  int64_t group = heads / kv_heads;
  bf16* rounded = q32 ? (bf16*)malloc(sizeof(bf16) * (batch * heads * d > 0 ? batch * heads * d : 1)) : NULL;
  const bf16* q = q16 ? q16 : rounded;
  PrefixGroups pg = {0};
  float *pm = NULL, *pl = NULL, *po = NULL;
#ifdef VRIKSHA_AVX512_BF16
  int64_t* index = NULL;
  if (window <= 0 && d % 32 == 0 && dv % 64 == 0 && batch >= 2) {
    index = (int64_t*)malloc(sizeof(int64_t) * (4 * batch + 1));
    pg.members = index;
    pg.of_row = index + batch;
    pg.shared = index + 2 * batch;
    pg.first = index + 3 * batch;
    find_prefix_groups(slots, lens, batch, max_len, &pg);
  }
  if (pg.groups > 0) {
    attention_amx(-1);
    pm = (float*)malloc(sizeof(float) * batch * heads * (2 + dv));
    pl = pm + batch * heads;
    po = pl + batch * heads;
  }
#endif
#pragma omp parallel num_threads(threads)
  {
    if (q32) { /* rounded once, before either pass reads it */
#pragma omp for schedule(static)
      for (int64_t e = 0; e < batch * heads * d; e++) rounded[e] = f32_to_bf16(q32[e]);
    }
#ifdef VRIKSHA_AVX512_BF16
    if (pg.groups > 0) {
      uint32_t* qt = (uint32_t*)malloc(sizeof(uint32_t) * 16 * (d / 2));
      float* s = (float*)malloc(sizeof(float) * 16 * LANE_SCRATCH_KEYS(max_len));
      bf16* vi = (bf16*)malloc(sizeof(bf16) * dv * LANE_SCRATCH_KEYS(max_len));
#pragma omp for schedule(dynamic, 1) collapse(2)
      for (int64_t i = 0; i < pg.groups; i++)
        for (int64_t h = 0; h < kv_heads; h++) {
          const int64_t* members = pg.members + pg.first[i];
          attend_prefix(q, k_pool, v_pool, slots + members[0] * max_len, pg.shared[i], members,
                        pg.first[i + 1] - pg.first[i], heads, kv_heads, h, d, dv, group, scale, qt, s, vi, pm, pl,
                        po);
        }
      free(qt);
      free(s);
      free(vi);
    }
#endif
    float* scores = (float*)malloc(sizeof(float) * group * (max_len > 0 ? max_len : 1));
    float* qf = (float*)malloc(sizeof(float) * group * d);
    float* vrow = (float*)malloc(sizeof(float) * ((dv > d ? dv : d) + group));
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t h = 0; h < kv_heads; h++) {
      for (int64_t b = 0; b < batch; b++) {
        int64_t len = lens[b];
        int64_t start = (window > 0 && len > window) ? len - window : 0;
        int64_t head = b * heads + h * group;
        const float *m = NULL, *l = NULL, *o = NULL;
        if (pg.groups > 0 && pg.of_row[b] >= 0) {
          start = pg.shared[pg.of_row[b]];
          m = pm + head;
          l = pl + head;
          o = po + head * dv;
        }
        widen_bf16(qf, q + head * d, group * d);
        attend_bf16(qf, q + head * d, k_pool, v_pool, slots + b * max_len + start, len - start, kv_heads, h, d,
                    dv, group, scale, scores, vrow, out + head * dv, m, l, o);
      }
    }
    free(scores);
    free(qf);
    free(vrow);
  }
  free(rounded);
#ifdef VRIKSHA_AVX512_BF16
  free(index);
  free(pm);
#endif
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

/* Causal attention of a prompt chunk over a bf16 pool in place: q [T, H, D] float32 (rounded to bf16, as the
 * engine rounds a query for a bf16 pool), slots [prefix + T] the chunk's slots (its own K/V written last),
 * token t seeing slots [0, prefix + t]; out [T, H, Dv] float32. Sixteen (token, query head) lanes a pass
 * (attend_lanes), each KV row read once per pass for all of them. Returns -1 where this build cannot
 * (no AVX-512 BF16, d % 32 or dv % 64 not 0): the caller attends another way. */
int prefill_attention_bf16(const float* q, const bf16* k_pool, const bf16* v_pool, const int64_t* slots,
                           int64_t prefix, int64_t tokens, float* out, int64_t heads, int64_t kv_heads, int64_t d,
                           int64_t dv, float scale, int threads) {
#ifdef VRIKSHA_AVX512_BF16
  if (d % 32 != 0 || dv % 64 != 0 || tokens < 1) return -1;
  int64_t group = heads / kv_heads, n = prefix + tokens, lanes_per_head = tokens * group;
  int64_t blocks = (lanes_per_head + 15) / 16;
  int64_t per_head = LANE_SCRATCH_KEYS(n) * dv; /* each KV head's interleaved values, read by all its passes */
  bf16* qb = (bf16*)malloc(sizeof(bf16) * tokens * heads * d);
  bf16* vi = (bf16*)malloc(sizeof(bf16) * kv_heads * per_head);
  if (qb == NULL || vi == NULL) {
    free(qb);
    free(vi);
    return -1;
  }
  attention_amx(-1);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t e = 0; e < tokens * heads * d; e++) qb[e] = f32_to_bf16(q[e]);
#pragma omp for schedule(static) collapse(2)
    for (int64_t h = 0; h < kv_heads; h++)
      for (int64_t j0 = 0; j0 < LANE_SCRATCH_KEYS(n); j0 += 32) {
        bf16* at = vi + h * per_head + j0 * dv;
        if (j0 + 32 < n)
          interleave_value_pairs(v_pool, slots + j0, 32, kv_heads, h, dv, at);
        else
          lane_values(v_pool, slots + j0, n - j0, kv_heads, h, dv, at); /* the last 32, zeros past n */
      }
    uint32_t* qt = (uint32_t*)malloc(sizeof(uint32_t) * 16 * (d / 2));
    float* s = (float*)malloc(sizeof(float) * 16 * LANE_SCRATCH_KEYS(n));
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t h = 0; h < kv_heads; h++)
      for (int64_t blk = blocks - 1; blk >= 0; blk--) { /* the longest (latest tokens) first */
        int64_t l0 = blk * 16;
        int lanes = lanes_per_head - l0 < 16 ? (int)(lanes_per_head - l0) : 16;
        const bf16* qs[16];
        float* os[16];
        int64_t visible[16];
        float m[16], l[16];
        for (int u = 0; u < lanes; u++) {
          int64_t t = (l0 + u) / group, head = h * group + (l0 + u) % group;
          qs[u] = qb + (t * heads + head) * d;
          os[u] = out + (t * heads + head) * dv;
          visible[u] = prefix + t + 1;
        }
        attend_lanes(qs, lanes, visible, k_pool, slots, n, kv_heads, h, d, dv, scale, qt, s, vi + h * per_head, m,
                     l, os);
        for (int u = 0; u < lanes; u++) {
          float inv = 1.f / l[u];
          for (int64_t e = 0; e < dv; e++) os[u][e] *= inv;
        }
      }
    free(qt);
    free(s);
  }
  free(qb);
  free(vi);
  return 0;
#else
  (void)q, (void)k_pool, (void)v_pool, (void)slots, (void)prefix, (void)tokens, (void)out, (void)heads;
  (void)kv_heads, (void)d, (void)dv, (void)scale, (void)threads;
  return -1;
#endif
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
