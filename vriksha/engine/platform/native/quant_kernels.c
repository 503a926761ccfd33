/* Linear layers on quantized weights, dequantized in registers: y[m, o] = sum_i W[o, i] x[m, i] (+ b[o]).
 *
 * Weight formats (rows of W as stored, blocks of 32 along the input dimension):
 *   Q4_0  18 bytes a block: fp16 d, 16 bytes of nibbles; w = (q - 8) * d
 *   Q4_1  20 bytes a block: fp16 d, fp16 m, 16 bytes of nibbles; w = q * d + m
 *   Q8_0  34 bytes a block: fp16 d, 32 int8; w = q * d
 *   I8    int8 per weight, one fp32 scale per output row; w = q * scale[o]
 *   Q5_0, Q5_1 (32-weight blocks), Q4_K, Q5_K, Q6_K (256-weight super-blocks): kquant.h, decoded 32 weights at a
 *         time on the float paths; Q5_0's tiled copy is a Q8_0 one (below), the others have none (every other
 *         code path hands them to its float path)
 * In a nibble block, byte j holds element j in its low nibble and element j + 16 in its high one (GGML's order).
 * Activations and outputs are fp32 (`vq_linear`) or bf16 (`vq_linear_bf16`, widened on entry and rounded once
 * on exit); every product and sum is fp32, so the result equals a matmul on the dequantized weights up to the
 * order of the additions (and one rounding of q * d + m, fused here).
 *
 * Each output row is decoded once per tile of up to 8 input rows, so at decode batch sizes the weights are read
 * from memory once per call at 1/8 (Q4) or 1/4 (int8) of the fp32 bytes. Variants by instruction set: `avx2`
 * (AVX2 + FMA + F16C) and `avx512` (AVX-512F), each compiled only when the compiler targets those flags
 * (-march=native); `vq_variants()` says which ones this build has.
 */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define QK 32
#define VQ_SCALAR 1
#define VQ_AVX2 2
#define VQ_AVX512 4
#define VQ_AVX512_VNNI 8
#define VQ_AVX2_I16 16
#define VQ_AMX_BF16 32
#define VQ_AVX512_VNNI_I8 64
#define VQ_AVX2_I8 128
#define TILE 8

enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, I8 = 3, Q5_0 = 4, Q5_1 = 5, Q4_K = 6, Q5_K = 7, Q6_K = 8 };

static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; exp--; }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

#include "kquant.h"

/* Formats with a tiled copy and integer paths; the others take the float path on every code path. Q5_0's
 * tiled copy is a Q8_0 one (the same d, each code less 16 as an int8: the same weights), read as Q8_0. */
static inline int tiled_kind(int kind) { return kind == Q4_0 || kind == Q4_1 || kind == Q8_0 || kind == Q5_0; }
static inline int tile_kind(int kind) { return kind == Q5_0 ? Q8_0 : kind; }
static inline int block_kind(int kind) { return kind >= Q5_0 && kind <= Q6_K; } /* kquant.h's */

static int64_t row_bytes(int kind, int64_t in) {
  switch (kind) {
    case Q4_0: return in / QK * 18;
    case Q4_1: return in / QK * 20;
    case Q8_0: return in / QK * 34;
    case I8: return in;
    default: return in / kq_block_weights(kind) * kq_block_bytes(kind);
  }
}

/* Whether `in` inputs make whole blocks of `kind` (any width for int8). */
static int whole_blocks(int kind, int64_t in) {
  if (kind == I8) return 1;
  return in % (block_kind(kind) ? kq_block_weights(kind) : QK) == 0;
}

/* ---- scalar: every build has it; the reference the vector variants are tested against -------------------- */
static void dequant_row(int kind, const uint8_t* w, float scale, int64_t in, float* out) {
  if (kind == I8) {
    for (int64_t i = 0; i < in; i++) out[i] = (float)((const int8_t*)w)[i] * scale;
    return;
  }
  for (int64_t b = 0; b < in / QK; b++) {
    float* o = out + b * QK;
    if (block_kind(kind)) {
      kq_dequant_block(kind, w, b, o);
      continue;
    }
    if (kind == Q8_0) {
      const uint8_t* blk = w + b * 34;
      float d = f16_to_f32(load_u16(blk));
      for (int j = 0; j < QK; j++) o[j] = (float)((const int8_t*)(blk + 2))[j] * d;
      continue;
    }
    const uint8_t* blk = w + b * (kind == Q4_0 ? 18 : 20);
    float d = f16_to_f32(load_u16(blk)), m = kind == Q4_1 ? f16_to_f32(load_u16(blk + 2)) : -8.f * d;
    const uint8_t* qs = blk + (kind == Q4_0 ? 2 : 4);
    for (int j = 0; j < 16; j++) {
      o[j] = (float)(qs[j] & 0x0f) * d + m;
      o[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
  }
}

static void linear_scalar(int kind, const uint8_t* w, const float* scale, const float* bias, const float* x,
                          float* y, int64_t out, int64_t in, int64_t m, int threads) {
  int64_t rb = row_bytes(kind, in);
#pragma omp parallel num_threads(threads)
  {
    float buf[16384];
    float* row = in <= 16384 ? buf : NULL;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; o++) {
      if (row == NULL) continue; /* rows wider than the buffer are refused by the caller */
      dequant_row(kind, w + o * rb, scale ? scale[o] : 1.f, in, row);
      for (int64_t r = 0; r < m; r++) {
        const float* xr = x + r * in;
        float s = 0.f;
        for (int64_t i = 0; i < in; i++) s += row[i] * xr[i];
        y[r * out + o] = s + (bias ? bias[o] : 0.f);
      }
    }
  }
}

/* One function per weight format, so that each inner loop is compiled for its format alone. */
#define DEFINE_LINEAR(ISA, KIND, TAIL)                                                                        \
  static void linear_##ISA##_##KIND(const uint8_t* w, const float* scale, const float* bias, const float* x,  \
                                    float* y, int64_t out, int64_t in, int64_t m, int threads) {              \
    int64_t rb = row_bytes(KIND, in);                                                                         \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                                         \
    for (int64_t o = 0; o < out; o++) {                                                                       \
      const uint8_t* wo = w + o * rb;                                                                         \
      float s = scale ? scale[o] : 1.f;                                                                       \
      int64_t r = 0;                                                                                          \
      for (; r + 8 <= m; r += 8) row_##ISA(KIND, wo, s, in, x + r * in, y + r * out + o, out, 8, 1);          \
      if (m - r >= 4) { row_##ISA(KIND, wo, s, in, x + r * in, y + r * out + o, out, 4, 2); r += 4; }         \
      TAIL                                                                                                    \
      if (bias)                                                                                               \
        for (int64_t k = 0; k < m; k++) y[k * out + o] += bias[o];                                            \
    }                                                                                                         \
  }

/* ---- AVX2 + FMA + F16C ------------------------------------------------------------------------------------ */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HAVE_AVX2 1
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/* The 32 weights of block b of row w as four vectors of eight (elements 0-7, 8-15, 16-23, 24-31). */
static inline __attribute__((always_inline)) void decode8x4(int kind, const uint8_t* w, int64_t b, __m256* v) {
  if (block_kind(kind)) {
    kq_decode8x4(kind, w, b, v);
    return;
  }
  if (kind == I8) {
    const int8_t* q = (const int8_t*)w + b * QK;
    for (int k = 0; k < 4; k++) v[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 8 * k))));
    return;
  }
  if (kind == Q8_0) {
    const uint8_t* blk = w + b * 34;
    __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
    for (int k = 0; k < 4; k++)
      v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 2 + 8 * k)))), d);
    return;
  }
  const uint8_t* blk = w + b * (kind == Q4_0 ? 18 : 20);
  float df = _cvtsh_ss(load_u16(blk));
  __m256 d = _mm256_set1_ps(df);
  __m256 mv = _mm256_set1_ps(kind == Q4_1 ? _cvtsh_ss(load_u16(blk + 2)) : -8.f * df);
  /* bytes 0-7 widened to 32-bit lanes hold elements 0-7 (low nibbles) and 16-23 (high); bytes 8-15 the rest */
  const uint8_t* qs = blk + (kind == Q4_0 ? 2 : 4);
  __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)qs));
  __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 8)));
  __m256i mask = _mm256_set1_epi32(0x0f);
  v[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), d, mv);
  v[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, mask)), d, mv);
  v[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, mv);
  v[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)), d, mv);
}

/* One output row against R input rows, NA accumulators per input row (enough independent chains to keep
 * the FMA units busy at every R). Elements past the last whole block (int8 only) are added in scalar. */
static inline __attribute__((always_inline)) void row_avx2(int kind, const uint8_t* w, float scale, int64_t in,
                                                           const float* x, float* y, int64_t out, int R, int NA) {
  __m256 acc[TILE][4];
  for (int r = 0; r < R; r++)
    for (int a = 0; a < NA; a++) acc[r][a] = _mm256_setzero_ps();
  int64_t blocks = in / QK;
  for (int64_t b = 0; b < blocks; b++) {
    __m256 v[4];
    decode8x4(kind, w, b, v);
    for (int r = 0; r < R; r++) {
      const float* xr = x + r * in + b * QK;
      for (int k = 0; k < 4; k++) acc[r][k % NA] = _mm256_fmadd_ps(v[k], _mm256_loadu_ps(xr + 8 * k), acc[r][k % NA]);
    }
  }
  for (int r = 0; r < R; r++) {
    __m256 s = acc[r][0];
    for (int a = 1; a < NA; a++) s = _mm256_add_ps(s, acc[r][a]);
    float t = hsum8(s);
    for (int64_t i = blocks * QK; i < in; i++) t += (float)((const int8_t*)w)[i] * x[r * in + i];
    y[r * out] = kind == I8 ? t * scale : t;
  }
}

#define AVX2_TAIL(KIND)                                                                                       \
  if (m - r >= 2) { row_avx2(KIND, wo, s, in, x + r * in, y + r * out + o, out, 2, 4); r += 2; }              \
  if (m - r >= 1) row_avx2(KIND, wo, s, in, x + r * in, y + r * out + o, out, 1, 4);
DEFINE_LINEAR(avx2, Q4_0, AVX2_TAIL(Q4_0))
DEFINE_LINEAR(avx2, Q4_1, AVX2_TAIL(Q4_1))
DEFINE_LINEAR(avx2, Q8_0, AVX2_TAIL(Q8_0))
DEFINE_LINEAR(avx2, I8, AVX2_TAIL(I8))
DEFINE_LINEAR(avx2, Q5_0, AVX2_TAIL(Q5_0))
DEFINE_LINEAR(avx2, Q5_1, AVX2_TAIL(Q5_1))
DEFINE_LINEAR(avx2, Q4_K, AVX2_TAIL(Q4_K))
DEFINE_LINEAR(avx2, Q5_K, AVX2_TAIL(Q5_K))
DEFINE_LINEAR(avx2, Q6_K, AVX2_TAIL(Q6_K))

static void linear_avx2(int kind, const uint8_t* w, const float* scale, const float* bias, const float* x,
                        float* y, int64_t out, int64_t in, int64_t m, int threads) {
  switch (kind) {
    case Q4_0: linear_avx2_Q4_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q4_1: linear_avx2_Q4_1(w, scale, bias, x, y, out, in, m, threads); break;
    case Q8_0: linear_avx2_Q8_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q5_0: linear_avx2_Q5_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q5_1: linear_avx2_Q5_1(w, scale, bias, x, y, out, in, m, threads); break;
    case Q4_K: linear_avx2_Q4_K(w, scale, bias, x, y, out, in, m, threads); break;
    case Q5_K: linear_avx2_Q5_K(w, scale, bias, x, y, out, in, m, threads); break;
    case Q6_K: linear_avx2_Q6_K(w, scale, bias, x, y, out, in, m, threads); break;
    default: linear_avx2_I8(w, scale, bias, x, y, out, in, m, threads);
  }
}
#endif

/* ---- AVX-512F ----------------------------------------------------------------------------------------------- */
#if defined(__AVX512F__)
#define HAVE_AVX512 1
/* The 32 weights of block b as two vectors of sixteen (elements 0-15, 16-31). */
static inline __attribute__((always_inline)) void decode16x2(int kind, const uint8_t* w, int64_t b, __m512* v) {
  if (block_kind(kind)) {
    kq_decode16x2(kind, w, b, v);
    return;
  }
  if (kind == I8) {
    const int8_t* q = (const int8_t*)w + b * QK;
    for (int k = 0; k < 2; k++) v[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + 16 * k))));
    return;
  }
  if (kind == Q8_0) {
    const uint8_t* blk = w + b * 34;
    __m512 d = _mm512_set1_ps(f16_to_f32(load_u16(blk)));
    for (int k = 0; k < 2; k++)
      v[k] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 2 + 16 * k)))), d);
    return;
  }
  const uint8_t* blk = w + b * (kind == Q4_0 ? 18 : 20);
  float df = f16_to_f32(load_u16(blk));
  __m512 d = _mm512_set1_ps(df);
  __m512 mv = _mm512_set1_ps(kind == Q4_1 ? f16_to_f32(load_u16(blk + 2)) : -8.f * df);
  __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + (kind == Q4_0 ? 2 : 4))));
  v[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(a, _mm512_set1_epi32(0x0f))), d, mv);
  v[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(a, 4)), d, mv);
}

static inline __attribute__((always_inline)) void row_avx512(int kind, const uint8_t* w, float scale, int64_t in,
                                                             const float* x, float* y, int64_t out, int R, int NA) {
  __m512 acc[TILE][2];
  for (int r = 0; r < R; r++)
    for (int a = 0; a < NA; a++) acc[r][a] = _mm512_setzero_ps();
  int64_t blocks = in / QK;
  for (int64_t b = 0; b < blocks; b++) {
    __m512 v[2];
    decode16x2(kind, w, b, v);
    for (int r = 0; r < R; r++) {
      const float* xr = x + r * in + b * QK;
      for (int k = 0; k < 2; k++) acc[r][k % NA] = _mm512_fmadd_ps(v[k], _mm512_loadu_ps(xr + 16 * k), acc[r][k % NA]);
    }
  }
  for (int r = 0; r < R; r++) {
    __m512 s = NA > 1 ? _mm512_add_ps(acc[r][0], acc[r][1]) : acc[r][0];
    float t = _mm512_reduce_add_ps(s);
    for (int64_t i = blocks * QK; i < in; i++) t += (float)((const int8_t*)w)[i] * x[r * in + i];
    y[r * out] = kind == I8 ? t * scale : t;
  }
}

#define AVX512_TAIL(KIND)                                                                                     \
  for (; r < m; r++) row_avx512(KIND, wo, s, in, x + r * in, y + r * out + o, out, 1, 2);
DEFINE_LINEAR(avx512, Q4_0, AVX512_TAIL(Q4_0))
DEFINE_LINEAR(avx512, Q4_1, AVX512_TAIL(Q4_1))
DEFINE_LINEAR(avx512, Q8_0, AVX512_TAIL(Q8_0))
DEFINE_LINEAR(avx512, I8, AVX512_TAIL(I8))
DEFINE_LINEAR(avx512, Q5_0, AVX512_TAIL(Q5_0))
DEFINE_LINEAR(avx512, Q5_1, AVX512_TAIL(Q5_1))
DEFINE_LINEAR(avx512, Q4_K, AVX512_TAIL(Q4_K))
DEFINE_LINEAR(avx512, Q5_K, AVX512_TAIL(Q5_K))
DEFINE_LINEAR(avx512, Q6_K, AVX512_TAIL(Q6_K))

static void linear_avx512(int kind, const uint8_t* w, const float* scale, const float* bias, const float* x,
                          float* y, int64_t out, int64_t in, int64_t m, int threads) {
  switch (kind) {
    case Q4_0: linear_avx512_Q4_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q4_1: linear_avx512_Q4_1(w, scale, bias, x, y, out, in, m, threads); break;
    case Q8_0: linear_avx512_Q8_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q5_0: linear_avx512_Q5_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q5_1: linear_avx512_Q5_1(w, scale, bias, x, y, out, in, m, threads); break;
    case Q4_K: linear_avx512_Q4_K(w, scale, bias, x, y, out, in, m, threads); break;
    case Q5_K: linear_avx512_Q5_K(w, scale, bias, x, y, out, in, m, threads); break;
    case Q6_K: linear_avx512_Q6_K(w, scale, bias, x, y, out, in, m, threads); break;
    default: linear_avx512_I8(w, scale, bias, x, y, out, in, m, threads);
  }
}
#endif


/* ---- Integer paths: activations quantized to int16 per block, integer dot products -------------------------
 * Each input row is quantized once per call: per block of 32, dx = max|x| / 32767, xq = round(x / dx) (int16),
 * and sx = dx * sum(xq). A weight block, widened to int16 (Q4_0: q - 8; Q4_1: q; Q8_0: q), is dotted with xq
 * in integers (AVX-512 VNNI vpdpwssd, or AVX2 vpmaddwd), so its contribution is d * dx * sum(w * xq), plus
 * min * sx for Q4_1. The weights are exact; each activation carries a rounding of at most dx / 2 (1/65534 of its
 * block's largest), and a block costs one or two integer instructions per input row instead of a dozen float
 * ones. The quantization of the rows is scalar: it is O(rows * in) against the dot products' O(rows * in * out).
 * The int8 paths (avx2_i8, avx512_vnni_i8) round each block to int8 instead (dx = max|x| / 127, llama.cpp's
 * Q8 numerics) and read a copy tiled in quads (below): only where the engine allows int8 activations. */
#ifdef HAVE_AVX2 /* every integer path needs AVX2 and F16C */
typedef struct {
  int16_t* q; /* [m, in], int16 rows */
  int8_t* q8; /* [m, in], int8 rows (the i8 paths) */
  float* d;   /* [m, in / 32] */
  float* s;   /* [m, in / 32] */
  void* buf;
} QuantRows;

/* A block of 32 activations into v[0..3]; returns max |x| over it. */
static inline float load_block(const float* xb, __m256* v) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; k++) {
    v[k] = _mm256_loadu_ps(xb + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

static inline int32_t hsum_epi32(__m256i sum) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
  return _mm_cvtsi128_si32(t);
}

/* One block of 32 activations to int16 (round to nearest even, as lrintf), its dx and its dx * sum(xq). */
static inline void quantize_block(const float* xb, int16_t* qb, float* d, float* s) {
  __m256 v[4];
  float top = load_block(xb, v);
  float id = top > 0.f ? 32767.f / top : 0.f;
  __m256 scale = _mm256_set1_ps(id);
  __m256i sum = _mm256_setzero_si256();
  for (int k = 0; k < 4; k += 2) {
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], scale));
    __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v[k + 1], scale));
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(a, c));
    /* packs works per 128-bit lane: [a0-3 c0-3 a4-7 c4-7]; the permute puts a0-7 before c0-7 */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xd8);
    _mm256_storeu_si256((__m256i*)(qb + 8 * k), packed);
  }
  *d = top / 32767.f;
  *s = *d * (float)hsum_epi32(sum);
}

/* One block of 32 activations to int8 (dx = max|x| / 127, round to nearest even), its dx and dx * sum(xq). */
static inline void quantize_block8(const float* xb, int8_t* qb, float* d, float* s) {
  __m256 v[4];
  float top = load_block(xb, v);
  __m256 scale = _mm256_set1_ps(top > 0.f ? 127.f / top : 0.f);
  __m256i q[4], sum = _mm256_setzero_si256();
  for (int k = 0; k < 4; k++) {
    q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], scale));
    sum = _mm256_add_epi32(sum, q[k]);
  }
  /* packs work per 128-bit lane: the bytes come out as 4-element groups a0 b0 c0 e0 a1 b1 c1 e1 (a = q[0]
   * elements 0-3 then 4-7 ...); the permute restores the order */
  __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i*)qb, packed);
  *d = top / 127.f;
  *s = *d * (float)hsum_epi32(sum);
}

/* Room for the rows as int16 (`bits` 16) or int8 (`bits` 8) blocks; -1 when out of memory. */
static int stage_rows(int64_t m, int64_t in, QuantRows* qr, int bits) {
  int64_t nb = in / QK;
  qr->buf = malloc((size_t)(m * in * (int64_t)(bits / 8) + 2 * m * nb * (int64_t)sizeof(float)) + 64);
  if (qr->buf == NULL) return -1;
  qr->d = (float*)qr->buf;
  qr->s = qr->d + m * nb;
  qr->q = bits == 16 ? (int16_t*)(qr->s + m * nb) : NULL;
  qr->q8 = bits == 8 ? (int8_t*)(qr->s + m * nb) : NULL;
  return 0;
}

/* Rows shared among the threads from here up; fewer are quantized by one thread before the products start,
 * cheaper than the threads' meeting after a split. */
#define SPLIT_ROWS 8

/* The rows quantized into the staged blocks: with SPLIT_ROWS or more, a worksharing loop among the threads of
 * the enclosing parallel region (the linear's own: no second wake-up); else by the calling thread alone. */
static void quantize_rows(const float* x, int64_t m, int64_t in, QuantRows* qr, int bits) {
  int64_t nb = in / QK;
  _Pragma("omp for schedule(static)")
  for (int64_t i = 0; i < m * nb; i++) {
    int64_t r = i / nb, b = i % nb;
    if (bits == 16)
      quantize_block(x + r * in + b * QK, qr->q + r * in + b * QK, qr->d + i, qr->s + i);
    else
      quantize_block8(x + r * in + b * QK, qr->q8 + r * in + b * QK, qr->d + i, qr->s + i);
  }
}

/* Tiled weights (`vq_tile`): T output rows at a time (T = 8 for AVX2, 16 for AVX-512), one vector lane per
 * row. A tile holds block b of rows [Tg, Tg + T): their T fp16 d, (Q4_1) their T fp16 min, then the weights,
 * laid out so that a vector of 2T int16 holds element pair (2k, 2k + 1) of all T rows, and one vpmaddwd (or
 * VNNI's vpdpwssd) against the broadcast activation pair k advances T dot products by two elements: the
 * weights are decoded once per tile and shared by up to four input rows. Nibble bodies (Q4_0, Q4_1): 4
 * chunks of 4T bytes, chunk c holding pairs 4c..4c+3: byte 2j + p of its first half holds element 2(4c) + p of
 * row j in its low nibble and 2(4c + 1) + p in its high one, the second half pairs 4c + 2 and 4c + 3 alike.
 * Q8_0 bodies: 16 runs of 2T int8, run k holding element 2k + p of row j at byte 2j + p. */
static inline int64_t tile_head(int kind, int64_t t) { return (kind == Q4_1 ? 4 : 2) * t; }
static inline int64_t tile_bytes(int kind, int64_t t) { return (kind == Q8_0 ? 34 : kind == Q4_1 ? 20 : 18) * t; }

/* One thread's share of a tiled linear, inside the entry's parallel region: the rows quantized, then the
 * tile groups. */
#define DEFINE_LINEAR_TILED(ISA, KIND, T, BITS)                                                               \
  static void linear_##ISA##_##KIND(const uint8_t* w, const float* bias, const float* x, QuantRows* qr,       \
                                    float* y, int64_t out, int64_t in, int64_t m) {                           \
    int64_t group_bytes = in / QK * tile_bytes(KIND, T);                                                      \
    if (m >= SPLIT_ROWS) quantize_rows(x, m, in, qr, BITS);                                                   \
    _Pragma("omp for schedule(static)")                                                                       \
    for (int64_t g = 0; g < out / T; g++) {                                                                   \
      const uint8_t* tg = w + g * group_bytes;                                                                \
      int64_t r = 0, o0 = g * T;                                                                              \
      for (; r + 4 <= m; r += 4) tile_rows_##ISA(KIND, tg, in, qr, r, 4, y, out, o0);                         \
      if (m - r >= 2) { tile_rows_##ISA(KIND, tg, in, qr, r, 2, y, out, o0); r += 2; }                        \
      if (m - r >= 1) tile_rows_##ISA(KIND, tg, in, qr, r, 1, y, out, o0);                                    \
      if (bias)                                                                                               \
        for (int64_t k = 0; k < m; k++)                                                                       \
          for (int64_t j = 0; j < T; j++) y[k * out + o0 + j] += bias[o0 + j];                                \
    }                                                                                                         \
  }

/* Returns -1 where the rows do not tile or the activations cannot be staged (out of memory). One parallel
 * region for the quantization and the products alike. */
#define DEFINE_LINEAR_TILED_ENTRY(ISA, T, BITS)                                                               \
  DEFINE_LINEAR_TILED(ISA, Q4_0, T, BITS)                                                                     \
  DEFINE_LINEAR_TILED(ISA, Q4_1, T, BITS)                                                                     \
  DEFINE_LINEAR_TILED(ISA, Q8_0, T, BITS)                                                                     \
  static int linear_##ISA(int kind, const uint8_t* w, const float* bias, const float* x, float* y,            \
                          int64_t out, int64_t in, int64_t m, int threads) {                                  \
    if (out % T != 0) return -1;                                                                              \
    QuantRows qr;                                                                                             \
    if (stage_rows(m, in, &qr, BITS) != 0) return -1;                                                         \
    if (m < SPLIT_ROWS) quantize_rows(x, m, in, &qr, BITS); /* outside a parallel region: this thread alone */ \
    _Pragma("omp parallel num_threads(threads)")                                                              \
    switch (kind) {                                                                                           \
      case Q4_0: linear_##ISA##_Q4_0(w, bias, x, &qr, y, out, in, m); break;                                  \
      case Q4_1: linear_##ISA##_Q4_1(w, bias, x, &qr, y, out, in, m); break;                                  \
      default: linear_##ISA##_Q8_0(w, bias, x, &qr, y, out, in, m);                                           \
    }                                                                                                         \
    free(qr.buf);                                                                                             \
    return 0;                                                                                                 \
  }

/* ---- AVX2: 8-row tiles, vpmaddwd ---- */
#define HAVE_AVX2_I16 1

static inline __attribute__((always_inline)) void tile_dots_avx2(int kind, const uint8_t* q, const QuantRows* qr,
                                                                 int64_t r0, int R, int64_t in, int64_t b,
                                                                 __m256i* dots) {
  for (int r = 0; r < R; r++) dots[r] = _mm256_setzero_si256();
  if (kind == Q8_0) {
    for (int k = 0; k < 16; k++) {
      __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(q + 16 * k)));
      for (int r = 0; r < R; r++) {
        const int32_t* xp = (const int32_t*)(qr->q + (r0 + r) * in + b * QK);
        dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(w, _mm256_set1_epi32(xp[k])));
      }
    }
    return;
  }
  const __m256i nib = _mm256_set1_epi8(0x0f);
  for (int c = 0; c < 4; c++) {
    __m256i raw = _mm256_loadu_si256((const __m256i*)(q + 32 * c));
    __m256i lo = _mm256_and_si256(raw, nib), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
    __m256i w[4] = {
        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(lo)),
        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(hi)),
        _mm256_cvtepu8_epi16(_mm256_extracti128_si256(lo, 1)),
        _mm256_cvtepu8_epi16(_mm256_extracti128_si256(hi, 1)),
    };
    for (int r = 0; r < R; r++) {
      const int32_t* xp = (const int32_t*)(qr->q + (r0 + r) * in + b * QK) + 4 * c;
      for (int k = 0; k < 4; k++)
        dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(w[k], _mm256_set1_epi32(xp[k])));
    }
  }
}

/* Quad tiles on AVX2 (8 rows: a register holds inputs 4k..4k + 3 of the 8 rows), int8 activations: vpmaddubsw
 * multiplies the unsigned weight bytes by the signed activation bytes and adds pairs into int16. A nibble's
 * pair stays below 2 * 15 * 127 = 3810, so a block's 8 quads sum in int16 (30480 at most) and one vpmaddwd by
 * ones widens them. Q8_0 bytes are signed again (the copy's +128 taken off) and multiplied as |w| by x with
 * w's sign; a pair then reaches 2 * 128 * 127, so each quad is widened to int32 on its own. */
static inline __attribute__((always_inline)) void tile_dots_avx2_i8(int kind, const uint8_t* q, const QuantRows* qr,
                                                                    int64_t r0, int R, int64_t in, int64_t b,
                                                                    __m256i* dots) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; r++) dots[r] = _mm256_setzero_si256();
  if (kind == Q8_0) {
    for (int k = 0; k < 8; k++) {
      __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(q + 32 * k)), _mm256_set1_epi8(-128));
      __m256i aw = _mm256_abs_epi8(w);
      for (int r = 0; r < R; r++) {
        const int32_t* xp = (const int32_t*)(qr->q8 + (r0 + r) * in + b * QK);
        __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(xp[k]), w);
        dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x), ones));
      }
    }
    return;
  }
  const __m256i nib = _mm256_set1_epi8(0x0f);
  __m256i sums[4];
  for (int r = 0; r < R; r++) sums[r] = _mm256_setzero_si256();
  for (int c = 0; c < 4; c++) {
    __m256i raw = _mm256_loadu_si256((const __m256i*)(q + 32 * c));
    __m256i lo = _mm256_and_si256(raw, nib), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
    for (int r = 0; r < R; r++) {
      const int32_t* xp = (const int32_t*)(qr->q8 + (r0 + r) * in + b * QK) + 2 * c;
      __m256i pair = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xp[0])),
                                      _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xp[1])));
      sums[r] = _mm256_add_epi16(sums[r], pair);
    }
  }
  for (int r = 0; r < R; r++) dots[r] = _mm256_madd_epi16(sums[r], ones);
}

/* Rows r0..r0 + R of one 8-row tile group: int16 activations on pair tiles (`i8` 0) or int8 ones on quad
 * tiles (`i8` 1); a block adds d * dx * dot + offset * sx (Q4_1's min, Q4_0's -8d). */
static inline __attribute__((always_inline)) void tile_rows_avx2(int kind, int i8, const uint8_t* t, int64_t in,
                                                                 const QuantRows* qr, int64_t r0, int R,
                                                                 float* y, int64_t out, int64_t o0) {
  __m256 acc[4];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  int64_t nb = in / QK, tb = tile_bytes(kind, 8);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* tile = t + b * tb;
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)tile));
    __m256 mn = kind == Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(tile + 16)))
                             : _mm256_mul_ps(d, _mm256_set1_ps(kind == Q4_0 ? -8.f : 0.f));
    __m256i dots[4];
    if (i8)
      tile_dots_avx2_i8(kind, tile + tile_head(kind, 8), qr, r0, R, in, b, dots);
    else
      tile_dots_avx2(kind, tile + tile_head(kind, 8), qr, r0, R, in, b, dots);
    for (int r = 0; r < R; r++) {
      int64_t i = (r0 + r) * nb + b;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]), _mm256_mul_ps(d, _mm256_set1_ps(qr->d[i])), acc[r]);
      if (kind != Q8_0) acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(qr->s[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (r0 + r) * out + o0, acc[r]);
}

/* The values named in an empty asm are held in registers at that point and nothing is moved across it. */
#define PIN4(a, b, c, e) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(e))

/* Four rows of int8 activations on one 8-row nibble tile group (Q4_0, Q4_1), as tile_rows_avx2 computes them
 * with every running value in a register. Left to itself the compiler reassociates the int16 sums of a block,
 * holds all 32 products at once and keeps the accumulators on the stack: about 40 spills and reloads a block,
 * 13-15% of the time of the whole linear on an AVX2-only Zen 1. The pins after each chunk keep the four sums
 * in the order written. */
static inline __attribute__((always_inline)) void tile_rows4_avx2_i8_nibbles(int kind, const uint8_t* t,
                                                                             int64_t in, const QuantRows* qr,
                                                                             int64_t r0, float* y, int64_t out,
                                                                             int64_t o0) {
  const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t nb = in / QK, tb = tile_bytes(kind, 8);
  const int32_t* x0 = (const int32_t*)(qr->q8 + r0 * in); /* quad k of row r0 + r: x0[r * in / 4 + k] */
  const int32_t *x1 = x0 + in / 4, *x2 = x1 + in / 4, *x3 = x2 + in / 4;
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* tile = t + b * tb;
    const uint8_t* q = tile + tile_head(kind, 8);
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (int c = 0; c < 4; c++) {
      __m256i raw = _mm256_loadu_si256((const __m256i*)(q + 32 * c));
      __m256i lo = _mm256_and_si256(raw, nib), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
      int64_t k = b * 8 + 2 * c;
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x0[k])));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x1[k])));
      s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x2[k])));
      s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x3[k])));
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x0[k + 1])));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x1[k + 1])));
      s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x2[k + 1])));
      s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x3[k + 1])));
      PIN4(s0, s1, s2, s3);
    }
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)tile));
    __m256 mn = kind == Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(tile + 16)))
                             : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
    const float *dx = qr->d + r0 * nb + b, *sx = qr->s + r0 * nb + b;
#define ADD_BLOCK(acc, s, r)                                                                                  \
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s, ones)),                                       \
                        _mm256_mul_ps(d, _mm256_set1_ps(dx[(r) * nb])), acc);                                 \
  acc = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx[(r) * nb]), acc)
    ADD_BLOCK(acc0, s0, 0);
    ADD_BLOCK(acc1, s1, 1);
    ADD_BLOCK(acc2, s2, 2);
    ADD_BLOCK(acc3, s3, 3);
#undef ADD_BLOCK
    PIN4(acc0, acc1, acc2, acc3);
  }
  _mm256_storeu_ps(y + r0 * out + o0, acc0);
  _mm256_storeu_ps(y + (r0 + 1) * out + o0, acc1);
  _mm256_storeu_ps(y + (r0 + 2) * out + o0, acc2);
  _mm256_storeu_ps(y + (r0 + 3) * out + o0, acc3);
}

#define tile_rows_avx2_i16(kind, ...) tile_rows_avx2(kind, 0, __VA_ARGS__)
#define tile_rows_avx2_i8(kind, t, in, qr, r0, R, y, out, o0)                                                 \
  ((R) == 4 && (kind) != Q8_0 ? tile_rows4_avx2_i8_nibbles(kind, t, in, qr, r0, y, out, o0)                   \
                              : tile_rows_avx2(kind, 1, t, in, qr, r0, R, y, out, o0))
DEFINE_LINEAR_TILED_ENTRY(avx2_i16, 8, 16)
DEFINE_LINEAR_TILED_ENTRY(avx2_i8, 8, 8)

/* ---- AVX-512 VNNI: 16-row tiles, vpdpwssd ---- */
#if defined(HAVE_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HAVE_AVX512_VNNI 1

static inline __attribute__((always_inline)) void tile_dots_avx512(int kind, const uint8_t* q, const QuantRows* qr,
                                                                   int64_t r0, int R, int64_t in, int64_t b,
                                                                   __m512i* dots) {
  for (int r = 0; r < R; r++) dots[r] = _mm512_setzero_si512();
  if (kind == Q8_0) {
    for (int k = 0; k < 16; k++) {
      __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(q + 32 * k)));
      for (int r = 0; r < R; r++) {
        const int32_t* xp = (const int32_t*)(qr->q + (r0 + r) * in + b * QK);
        dots[r] = _mm512_dpwssd_epi32(dots[r], w, _mm512_set1_epi32(xp[k]));
      }
    }
    return;
  }
  const __m512i nib = _mm512_set1_epi8(0x0f);
  for (int c = 0; c < 4; c++) {
    __m512i raw = _mm512_loadu_si512((const void*)(q + 64 * c));
    __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    __m512i w[4] = {
        _mm512_cvtepu8_epi16(_mm512_castsi512_si256(lo)),
        _mm512_cvtepu8_epi16(_mm512_castsi512_si256(hi)),
        _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(lo, 1)),
        _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(hi, 1)),
    };
    for (int r = 0; r < R; r++) {
      const int32_t* xp = (const int32_t*)(qr->q + (r0 + r) * in + b * QK) + 4 * c;
      for (int k = 0; k < 4; k++) dots[r] = _mm512_dpwssd_epi32(dots[r], w[k], _mm512_set1_epi32(xp[k]));
    }
  }
}

/* Quad tiles, int8 activations: a vector of 64 bytes holds elements 4k..4k + 3 of all 16 rows as unsigned bytes
 * (nibbles as they are; Q8_0 offset by 128), so one vpdpbusd against the broadcast activation quad k advances
 * 16 dot products by four elements, twice the elements of vpdpwssd; the offsets come back through sx. */
static inline __attribute__((always_inline)) void tile_dots_avx512_i8(int kind, const uint8_t* q,
                                                                      const QuantRows* qr, int64_t r0, int R,
                                                                      int64_t in, int64_t b, __m512i* dots) {
  for (int r = 0; r < R; r++) dots[r] = _mm512_setzero_si512();
  if (kind == Q8_0) {
    for (int k = 0; k < 8; k++) {
      __m512i w = _mm512_loadu_si512((const void*)(q + 64 * k));
      for (int r = 0; r < R; r++) {
        const int32_t* xp = (const int32_t*)(qr->q8 + (r0 + r) * in + b * QK);
        dots[r] = _mm512_dpbusd_epi32(dots[r], w, _mm512_set1_epi32(xp[k]));
      }
    }
    return;
  }
  const __m512i nib = _mm512_set1_epi8(0x0f);
  for (int c = 0; c < 4; c++) {
    __m512i raw = _mm512_loadu_si512((const void*)(q + 64 * c));
    __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    for (int r = 0; r < R; r++) {
      const int32_t* xp = (const int32_t*)(qr->q8 + (r0 + r) * in + b * QK) + 2 * c;
      dots[r] = _mm512_dpbusd_epi32(dots[r], lo, _mm512_set1_epi32(xp[0]));
      dots[r] = _mm512_dpbusd_epi32(dots[r], hi, _mm512_set1_epi32(xp[1]));
    }
  }
}

/* Rows r0..r0 + R of one 16-row tile group: int16 activations on pair tiles (`i8` 0) or int8 ones on quad
 * tiles (`i8` 1); a block adds d * dx * dot + offset * sx, the offset being Q4_1's min, Q4_0's -8d, and on quad
 * tiles Q8_0's -128d. */
static inline __attribute__((always_inline)) void tile_rows_avx512(int kind, int i8, const uint8_t* t,
                                                                   int64_t in, const QuantRows* qr, int64_t r0,
                                                                   int R, float* y, int64_t out, int64_t o0) {
  __m512 acc[4];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  int64_t nb = in / QK, tb = tile_bytes(kind, 16);
  const float q8_offset = i8 ? -128.f : 0.f;
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* tile = t + b * tb;
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)tile));
    __m512 mn = kind == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(tile + 32)))
                             : _mm512_mul_ps(d, _mm512_set1_ps(kind == Q4_0 ? -8.f : q8_offset));
    __m512i dots[4];
    if (i8)
      tile_dots_avx512_i8(kind, tile + tile_head(kind, 16), qr, r0, R, in, b, dots);
    else
      tile_dots_avx512(kind, tile + tile_head(kind, 16), qr, r0, R, in, b, dots);
    for (int r = 0; r < R; r++) {
      int64_t i = (r0 + r) * nb + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), _mm512_mul_ps(d, _mm512_set1_ps(qr->d[i])), acc[r]);
      if (kind != Q8_0 || i8) acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(qr->s[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (r0 + r) * out + o0, acc[r]);
}

#define tile_rows_avx512_vnni(kind, ...) tile_rows_avx512(kind, 0, __VA_ARGS__)
#define tile_rows_avx512_vnni_i8(kind, ...) tile_rows_avx512(kind, 1, __VA_ARGS__)
DEFINE_LINEAR_TILED_ENTRY(avx512_vnni, 16, 16)
DEFINE_LINEAR_TILED_ENTRY(avx512_vnni_i8, 16, 8)
#endif
#endif /* HAVE_AVX2 */

/* ---- AMX-BF16: 16-row tiles expanded to bf16, TDPBF16PS ---------------------------------------------------
 * bf16 arithmetic (the engine's fp32_precision=bf16): on the same 16-row tiled copy as avx512_vnni, each block
 * of 16 output rows is decoded in registers to fp32 (q * d + min), rounded once to bf16 and stored as one AMX
 * B tile (16 rows of 64 bytes: row k holds element pair (2k, 2k + 1) of the 16 output rows, which is how the
 * tiled copy already orders its pairs); the activations, rounded to bf16 once per call, are A tiles read in
 * place (16 rows of one block's 32 values); C tiles hold 16 x 16 fp32 sums across the whole input row, so
 * no per-block scaling follows the tile products. Up to four C tiles (64 activation rows) share one decoded
 * B tile. Linux grants a process the AMX tile state on request (arch_prctl); `vq_variants` asks once and
 * lists the path only where that succeeded. */
#if defined(HAVE_AVX512) && defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__)
#include "amx.h"
#define HAVE_AMX_BF16 1

/* One block of 16 output rows decoded to the B tile layout in `bt` (16 rows of 32 bf16). */
static inline __attribute__((always_inline)) void amx_decode_block(int kind, const uint8_t* tile, uint16_t* bt) {
  __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)tile));
  __m512 mn = kind == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(tile + 32)))
                           : _mm512_mul_ps(d, _mm512_set1_ps(kind == Q4_0 ? -8.f : 0.f));
  /* lane 2j + p of a pair vector is row j: rows 0-7 in its low 16 lanes, rows 8-15 in its high ones */
  const __m512i lo_rows = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_rows = _mm512_add_epi32(lo_rows, _mm512_set1_epi32(8));
  __m512 d_lo = _mm512_permutexvar_ps(lo_rows, d), d_hi = _mm512_permutexvar_ps(hi_rows, d);
  __m512 m_lo = _mm512_permutexvar_ps(lo_rows, mn), m_hi = _mm512_permutexvar_ps(hi_rows, mn);
  const uint8_t* q = tile + tile_head(kind, 16);
  __m512i pairs[16];
  if (kind == Q8_0) {
    for (int k = 0; k < 16; k++) pairs[k] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(q + 32 * k)));
  } else {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
      __m512i raw = _mm512_loadu_si512((const void*)(q + 64 * c));
      __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
      pairs[4 * c] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(lo));
      pairs[4 * c + 1] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(hi));
      pairs[4 * c + 2] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(lo, 1));
      pairs[4 * c + 3] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(hi, 1));
    }
  }
  for (int k = 0; k < 16; k++) {
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(pairs[k])));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(pairs[k], 1)));
    lo = _mm512_fmadd_ps(lo, d_lo, m_lo);
    hi = _mm512_fmadd_ps(hi, d_hi, m_hi);
    _mm512_store_si512((void*)(bt + 32 * k), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

#define AMX_TILE_PRODUCT(T)                                                                                   \
  do {                                                                                                        \
    _tile_loadd(5, xb + (m0 + 16 * (T)) * in + b * QK, in * (int64_t)sizeof(uint16_t));                       \
    _tile_dpbf16ps(T, 5, 4);                                                                                  \
  } while (0)
#define AMX_TILE_STORE(T) _tile_stored(T, yt + 16 * 16 * (T), 16 * (int64_t)sizeof(float))

/* xb: the activations in bf16, [mp, in] with mp a multiple of 16 (padding rows zero); y [m, out] fp32.
 * Tiles 0-3: C (16 x 16 fp32), 4: B (the decoded weights), 5: A (16 activation rows of one block). */
AMX_TARGET static void linear_amx_groups(int kind, const uint8_t* w, const float* bias, const uint16_t* xb, float* y,
                                         int64_t out, int64_t in, int64_t m, int64_t mp, int threads) {
  int64_t nb = in / QK, tb = tile_bytes(kind, 16), group_bytes = nb * tb;
  _Pragma("omp parallel num_threads(threads)")
  {
    amx_configure();
    _Alignas(64) uint16_t bt[16 * 32];
    _Alignas(64) float yt[4 * 16 * 16];
    _Pragma("omp for schedule(static)")
    for (int64_t g = 0; g < out / 16; g++) {
      const uint8_t* tg = w + g * group_bytes;
      for (int64_t m0 = 0; m0 < mp; m0 += 64) {
        int tiles = (int)((mp - m0) / 16 < 4 ? (mp - m0) / 16 : 4);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t b = 0; b < nb; b++) {
          amx_decode_block(kind, tg + b * tb, bt);
          _tile_loadd(4, bt, 64);
          AMX_TILE_PRODUCT(0);
          if (tiles > 1) AMX_TILE_PRODUCT(1);
          if (tiles > 2) AMX_TILE_PRODUCT(2);
          if (tiles > 3) AMX_TILE_PRODUCT(3);
        }
        AMX_TILE_STORE(0); AMX_TILE_STORE(1); AMX_TILE_STORE(2); AMX_TILE_STORE(3);
        for (int t = 0; t < tiles; t++)
          for (int r = 0; r < 16 && m0 + 16 * t + r < m; r++) {
            float* dst = y + (m0 + 16 * t + r) * out + g * 16;
            const float* src = yt + 16 * 16 * t + 16 * r;
            for (int j = 0; j < 16; j++) dst[j] = src[j] + (bias ? bias[g * 16 + j] : 0.f);
          }
      }
    }
    _tile_release();
  }
}

static int linear_amx_bf16(int kind, const uint8_t* w, const float* bias, const float* x, float* y, int64_t out,
                           int64_t in, int64_t m, int threads) {
  if (!tiled_kind(kind) || out % 16 != 0 || !amx_usable()) return -1;
  int64_t mp = (m + 15) / 16 * 16;
  uint16_t* xb = (uint16_t*)aligned_alloc(64, (size_t)((mp * in * 2 + 63) / 64 * 64));
  if (xb == NULL) return -1;
  int64_t i = 0;
  for (; i + 16 <= m * in; i += 16)
    _mm256_storeu_si256((__m256i*)(xb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  for (; i < m * in; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    xb[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  memset(xb + m * in, 0, (size_t)((mp - m) * in * 2));
  linear_amx_groups(kind, w, bias, xb, y, out, in, m, mp, threads);
  free(xb);
  return 0;
}
#endif

int vq_variants(void) {
  int v = VQ_SCALAR;
#ifdef HAVE_AVX2
  v |= VQ_AVX2;
#endif
#ifdef HAVE_AVX512
  v |= VQ_AVX512;
#endif
#ifdef HAVE_AVX2_I16
  v |= VQ_AVX2_I16 | VQ_AVX2_I8;
#endif
#ifdef HAVE_AVX512_VNNI
  v |= VQ_AVX512_VNNI | VQ_AVX512_VNNI_I8;
#endif
#ifdef HAVE_AMX_BF16
  if (amx_usable()) v |= VQ_AMX_BF16;
#endif
  return v;
}

/* Returns 0, or -1 when the variant is not in this build or the shape is unsupported. */
int vq_linear(int variant, int kind, const void* w, const float* scale, const float* bias, const float* x,
              float* y, int64_t out, int64_t in, int64_t m, int threads) {
  if (kind < Q4_0 || kind > Q6_K || !whole_blocks(kind, in)) return -1;
  const uint8_t* wb = (const uint8_t*)w;
  int tk = tile_kind(kind); /* the format of the tiled copy the integer and bf16 paths read */
  switch (variant) {
    case VQ_SCALAR:
      if (in > 16384) return -1;
      linear_scalar(kind, wb, scale, bias, x, y, out, in, m, threads);
      return 0;
#ifdef HAVE_AVX2
    case VQ_AVX2:
      linear_avx2(kind, wb, scale, bias, x, y, out, in, m, threads);
      return 0;
#endif
#ifdef HAVE_AVX512
    case VQ_AVX512:
      linear_avx512(kind, wb, scale, bias, x, y, out, in, m, threads);
      return 0;
#endif
#ifdef HAVE_AVX2_I16
    case VQ_AVX2_I16: /* int8 rows and the kquant.h blocks have no tiled copy: the float path serves them */
      if (!tiled_kind(kind)) { linear_avx2(kind, wb, scale, bias, x, y, out, in, m, threads); return 0; }
      return linear_avx2_i16(tk, wb, bias, x, y, out, in, m, threads);
    case VQ_AVX2_I8: /* int8 activations on the quad-tiled copy */
      if (!tiled_kind(kind)) { linear_avx2(kind, wb, scale, bias, x, y, out, in, m, threads); return 0; }
      return linear_avx2_i8(tk, wb, bias, x, y, out, in, m, threads);
#endif
#ifdef HAVE_AVX512_VNNI
    case VQ_AVX512_VNNI:
      if (!tiled_kind(kind)) { linear_avx512(kind, wb, scale, bias, x, y, out, in, m, threads); return 0; }
      return linear_avx512_vnni(tk, wb, bias, x, y, out, in, m, threads);
    case VQ_AVX512_VNNI_I8: /* int8 activations on the quad-tiled copy */
      if (!tiled_kind(kind)) { linear_avx512(kind, wb, scale, bias, x, y, out, in, m, threads); return 0; }
      return linear_avx512_vnni_i8(tk, wb, bias, x, y, out, in, m, threads);
#endif
#ifdef HAVE_AMX_BF16
    case VQ_AMX_BF16: /* bf16 arithmetic on the 16-row tiled copy; untiled formats take the float path */
      if (!tiled_kind(kind)) { linear_avx512(kind, wb, scale, bias, x, y, out, in, m, threads); return 0; }
      return linear_amx_bf16(tk, wb, bias, x, y, out, in, m, threads);
#endif
    default:
      return -1;
  }
}

/* W dequantized to fp32, rows [row0, row0 + rows). */
int vq_dequantize(int kind, const void* w, const float* scale, float* out, int64_t row0, int64_t rows, int64_t in) {
  if (kind < Q4_0 || kind > Q6_K || !whole_blocks(kind, in)) return -1;
  int64_t rb = row_bytes(kind, in);
  for (int64_t o = row0; o < row0 + rows; o++)
    dequant_row(kind, (const uint8_t*)w + o * rb, scale ? scale[o] : 1.f, in, out + (o - row0) * in);
  return 0;
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, NaN kept quiet */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* vq_linear with bf16 activations and outputs (bias bf16 too): the rows are widened to fp32, the products and
 * sums stay fp32 as in vq_linear, and each output is rounded once to bf16. `work` holds m * (in + out) floats. */
int vq_linear_bf16(int variant, int kind, const void* w, const float* scale, const uint16_t* bias,
                   const uint16_t* x, uint16_t* y, float* work, int64_t out, int64_t in, int64_t m, int threads) {
  float* xf = work;
  float* yf = work + m * in;
  for (int64_t i = 0; i < m * in; i++) xf[i] = bf16_to_f32(x[i]);
  int done = vq_linear(variant, kind, w, scale, NULL, xf, yf, out, in, m, threads);
  if (done != 0) return done;
  for (int64_t r = 0; r < m; r++)
    for (int64_t o = 0; o < out; o++)
      y[r * out + o] = f32_to_bf16(yf[r * out + o] + (bias ? bf16_to_f32(bias[o]) : 0.f));
  return 0;
}

/* The copy of a GGUF weight tiled `t` rows at a time (8 or 16; the layout above the tiled kernels), in pairs
 * (`quads` 0: the int16 paths) or in quads (`quads` 1: the int8 paths; a Q8_0 body offset by 128);
 * `dst` holds out / t * (in / 32) tiles. Returns 0, or -1 for int8 weights or rows that do not tile. */
int vq_tile(int kind, int64_t t, int quads, const void* src, void* dst, int64_t out, int64_t in) {
  if (!tiled_kind(kind) || (t != 8 && t != 16) || out % t != 0 || in % QK != 0) return -1;
  const uint8_t* w = (const uint8_t*)src;
  uint8_t* tile = (uint8_t*)dst;
  int64_t rb = row_bytes(kind, in), nb = in / QK, block = rb / nb;
  int from = kind;
  kind = tile_kind(kind);
  int64_t tb = (kind == Q8_0 ? 34 : kind == Q4_1 ? 20 : 18) * t, head = (kind == Q4_1 ? 4 : 2) * t;
  int64_t qs = kind == Q4_1 ? 4 : 2; /* where a GGML block's weights start */
  for (int64_t g = 0; g < out / t; g++)
    for (int64_t b = 0; b < nb; b++, tile += tb) {
      memset(tile, 0, (size_t)tb);
      uint8_t* body = tile + head;
      for (int64_t j = 0; j < t; j++) {
        const uint8_t* blk = w + (g * t + j) * rb + b * block;
        uint8_t as_q8[34];
        if (from == Q5_0) { /* the block as Q8_0: d, then each code less 16 */
          int codes[QK];
          kq_codes(Q5_0, w + (g * t + j) * rb, b, codes);
          memcpy(as_q8, blk, 2);
          for (int e = 0; e < QK; e++) as_q8[2 + e] = (uint8_t)(int8_t)(codes[e] - 16);
          blk = as_q8;
        }
        memcpy(tile + 2 * j, blk, 2);                              /* d */
        if (kind == Q4_1) memcpy(tile + 2 * t + 2 * j, blk + 2, 2); /* min */
        const uint8_t* q = blk + qs;
        for (int e = 0; e < QK; e++) {
          uint8_t v = kind == Q8_0 ? q[e] : e < 16 ? (q[e] & 0x0f) : (q[e - 16] >> 4);
          if (quads) { /* chunk c: quad 2c in the low nibbles, quad 2c + 1 in the high ones */
            int k = e / 4, p = e % 4;
            if (kind == Q8_0)
              body[4 * t * k + 4 * j + p] = (uint8_t)(v ^ 0x80);
            else
              body[4 * t * (k / 2) + 4 * j + p] |= (uint8_t)(k % 2 ? v << 4 : v);
            continue;
          }
          int k = e / 2, p = e % 2;
          if (kind == Q8_0) {
            body[2 * t * k + 2 * j + p] = v;
          } else {
            int c = k / 4, half = (k % 4) / 2, high = k % 2;
            body[4 * t * c + 2 * t * half + 2 * j + p] |= (uint8_t)(high ? v << 4 : v);
          }
        }
      }
    }
  return 0;
}

int64_t vq_tile_bytes(int kind, int64_t t, int64_t out, int64_t in) {
  if (!tiled_kind(kind) || (t != 8 && t != 16) || out % t != 0 || in % QK != 0) return -1;
  kind = tile_kind(kind);
  return out / t * (in / QK) * (kind == Q8_0 ? 34 : kind == Q4_1 ? 20 : 18) * t;
}
