/* Vector helpers shared by the kernel sources, per instruction set.
 *
 * Each source is compiled once per instruction-set variant (native/isa.py): without flags (scalar loops),
 * with -mavx2 -mfma, with AVX-512 F/BW/VL/DQ added, and with AVX-512 BF16 added. The code below selects
 * its paths with the compiler's feature macros, so one source serves every variant.
 */
#ifndef VRIKSHA_SIMD_H
#define VRIKSHA_SIMD_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VRIKSHA_AVX2 1
#endif
#if defined(VRIKSHA_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VRIKSHA_AVX512 1
#endif
#if defined(VRIKSHA_AVX512) && defined(__AVX512BF16__)
#define VRIKSHA_AVX512_BF16 1
#endif

typedef uint16_t bf16;

static inline float bf16_to_f32(bf16 h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even, as torch converts float32 to bfloat16 (NaN kept a quiet NaN). */
static inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}

static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

#ifdef VRIKSHA_AVX2
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/* The four horizontal sums of a0..a3, in order. */
static inline __m128 hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* e^x, Cephes-style range reduction and polynomial: relative error about 2e-7 over the float range. */
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

#ifdef VRIKSHA_AVX512
/* exp8 sixteen lanes at a time. */
static inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  __m512i n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(n));
}
#endif

/* Eight bfloat16 values widened to float32: the bits shifted into the high half. */
static inline __m256 load8_bf16(const bf16* p) {
  __m128i h = _mm_loadu_si128((const __m128i*)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Eight float32 values rounded (nearest even) to bfloat16 and stored; inputs are finite. */
static inline void store8_bf16(bf16* p, __m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0xD8);
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(packed));
}

/* Eight float32 values rounded (nearest even) to bfloat16 precision, kept as float32. */
static inline __m256 round8_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
}
#endif

#ifdef VRIKSHA_AVX512
static inline __m512 load16_bf16(const bf16* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Half of each lane group of a and half of b's, then the other halves, added: `a` and `b` each hold 16 / w
 * groups of w partial sums (w = 16, 8, 4, 2); the result holds a's groups then b's, each summed to w / 2. */
static inline __m512 fold_pair(__m512 a, __m512 b, __m512i first, __m512i second) {
  return _mm512_add_ps(_mm512_permutex2var_ps(a, first, b), _mm512_permutex2var_ps(a, second, b));
}

/* The sixteen horizontal sums of acc[0..15], in order, in one vector (acc is overwritten). */
static inline __m512 hsum16x16(__m512* acc) {
  const __m512i lo8 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i hi8 = _mm512_add_epi32(lo8, _mm512_set1_epi32(8));
  const __m512i lo4 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i hi4 = _mm512_add_epi32(lo4, _mm512_set1_epi32(4));
  const __m512i lo2 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
  const __m512i hi2 = _mm512_add_epi32(lo2, _mm512_set1_epi32(2));
  const __m512i lo1 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i hi1 = _mm512_add_epi32(lo1, _mm512_set1_epi32(1));
  for (int t = 0; t < 8; t++) acc[t] = fold_pair(acc[2 * t], acc[2 * t + 1], lo8, hi8);
  for (int t = 0; t < 4; t++) acc[t] = fold_pair(acc[2 * t], acc[2 * t + 1], lo4, hi4);
  for (int t = 0; t < 2; t++) acc[t] = fold_pair(acc[2 * t], acc[2 * t + 1], lo2, hi2);
  return fold_pair(acc[0], acc[1], lo1, hi1);
}
#endif

/* The cache lines of n floats at p, fetched ahead of use. */
static inline void prefetch_row(const float* p, int64_t n) {
  for (int64_t e = 0; e < n; e += 16) __builtin_prefetch(p + e);
}

/* sum a[i] * b[i], float32. */
static inline float dot_f32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#ifdef VRIKSHA_AVX512
  __m512 z0 = _mm512_setzero_ps(), z1 = _mm512_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    z0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), z0);
    z1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), z1);
  }
  s = _mm512_reduce_add_ps(_mm512_add_ps(z0, z1));
#endif
#ifdef VRIKSHA_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
  s += hsum8(_mm256_add_ps(a0, a1));
#endif
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

/* dst[i] = float(src[i]) for i < n. */
static inline void widen_bf16(float* dst, const bf16* src, int64_t n) {
  int64_t i = 0;
#ifdef VRIKSHA_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_bf16(src + i));
#endif
  for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

/* acc[i] += p * v[i], float32. */
static inline void axpy_f32(float* acc, float p, const float* v, int64_t n) {
  int64_t e = 0;
#ifdef VRIKSHA_AVX2
  __m256 pv = _mm256_set1_ps(p);
  for (; e + 8 <= n; e += 8)
    _mm256_storeu_ps(acc + e, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + e), _mm256_loadu_ps(acc + e)));
#endif
  for (; e < n; e++) acc[e] += p * v[e];
}

/* x[i] = e^(x[i] - shift) for i < n; returns their sum. */
static inline float exp_shifted_sum(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float total = 0.f;
#ifdef VRIKSHA_AVX2
  __m256 acc = _mm256_setzero_ps(), sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  total = hsum8(acc);
#endif
  for (; i < n; i++) {
    x[i] = expf(x[i] - shift);
    total += x[i];
  }
  return total;
}

/* scores[0..n) turned into softmax probabilities in place. */
static inline void softmax_inplace(float* scores, int64_t n) {
  float mx = -INFINITY;
  int64_t j = 0;
#ifdef VRIKSHA_AVX2
  /* eight running maxima: the maximum is exact in any order, and one serial chain of compares is slow */
  if (n >= 8) {
    __m256 m8 = _mm256_loadu_ps(scores);
    for (j = 8; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(scores + j));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    mx = _mm_cvtss_f32(m4);
  }
#endif
  for (; j < n; j++) mx = scores[j] > mx ? scores[j] : mx;
  float inv = 1.f / exp_shifted_sum(scores, n, mx);
  j = 0;
#ifdef VRIKSHA_AVX2
  __m256 inv8 = _mm256_set1_ps(inv);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(scores + j, _mm256_mul_ps(_mm256_loadu_ps(scores + j), inv8));
#endif
  for (; j < n; j++) scores[j] *= inv;
}

#if defined(__GNUC__) && !defined(__clang__)
/* auto-vectorising the loops over KV positions turns them into gathers, several times slower than these */
#define NO_AUTO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#else
#define NO_AUTO_VECTORIZE
#endif

#endif
