/* Linear layers on quantized weights, dequantized in registers: y[m, o] = sum_i W[o, i] x[m, i] (+ b[o]).
 *
 * Weight formats (rows of W as stored, blocks of 32 along the input dimension):
 *   Q4_0  18 bytes a block: fp16 d, 16 bytes of nibbles; w = (q - 8) * d
 *   Q4_1  20 bytes a block: fp16 d, fp16 m, 16 bytes of nibbles; w = q * d + m
 *   Q8_0  34 bytes a block: fp16 d, 32 int8; w = q * d
 *   I8    int8 per weight, one fp32 scale per output row; w = q * scale[o]
 * In a nibble block, byte j holds element j in its low nibble and element j + 16 in its high one (GGML's order).
 * Activations and outputs are fp32; every product and sum is fp32, so the result equals a matmul on the
 * dequantized weights up to the order of the additions (and one rounding of q * d + m, fused here).
 *
 * Each output row is decoded once per tile of up to 8 input rows, so at decode batch sizes the weights are read
 * from memory once per call at 1/8 (Q4) or 1/4 (int8) of the fp32 bytes. Variants by instruction set: `avx2`
 * (AVX2 + FMA + F16C) and `avx512` (AVX-512F), each compiled only when the compiler targets those flags
 * (-march=native); `vq_variants()` says which ones this build has.
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define QK 32
#define VQ_SCALAR 1
#define VQ_AVX2 2
#define VQ_AVX512 4
#define TILE 8

enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, I8 = 3 };

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

static int64_t row_bytes(int kind, int64_t in) {
  switch (kind) {
    case Q4_0: return in / QK * 18;
    case Q4_1: return in / QK * 20;
    case Q8_0: return in / QK * 34;
    default: return in;
  }
}

/* ---- scalar: every build has it; the reference the vector variants are tested against -------------------- */
static void dequant_row(int kind, const uint8_t* w, float scale, int64_t in, float* out) {
  if (kind == I8) {
    for (int64_t i = 0; i < in; i++) out[i] = (float)((const int8_t*)w)[i] * scale;
    return;
  }
  for (int64_t b = 0; b < in / QK; b++) {
    float* o = out + b * QK;
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

static void linear_avx2(int kind, const uint8_t* w, const float* scale, const float* bias, const float* x,
                        float* y, int64_t out, int64_t in, int64_t m, int threads) {
  switch (kind) {
    case Q4_0: linear_avx2_Q4_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q4_1: linear_avx2_Q4_1(w, scale, bias, x, y, out, in, m, threads); break;
    case Q8_0: linear_avx2_Q8_0(w, scale, bias, x, y, out, in, m, threads); break;
    default: linear_avx2_I8(w, scale, bias, x, y, out, in, m, threads);
  }
}
#endif

/* ---- AVX-512F ----------------------------------------------------------------------------------------------- */
#if defined(__AVX512F__)
#define HAVE_AVX512 1
/* The 32 weights of block b as two vectors of sixteen (elements 0-15, 16-31). */
static inline __attribute__((always_inline)) void decode16x2(int kind, const uint8_t* w, int64_t b, __m512* v) {
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

#define AVX512_TAIL(KIND) \
  for (; r < m; r++) row_avx512(KIND, wo, s, in, x + r * in, y + r * out + o, out, 1, 2);
DEFINE_LINEAR(avx512, Q4_0, AVX512_TAIL(Q4_0))
DEFINE_LINEAR(avx512, Q4_1, AVX512_TAIL(Q4_1))
DEFINE_LINEAR(avx512, Q8_0, AVX512_TAIL(Q8_0))
DEFINE_LINEAR(avx512, I8, AVX512_TAIL(I8))

static void linear_avx512(int kind, const uint8_t* w, const float* scale, const float* bias, const float* x,
                          float* y, int64_t out, int64_t in, int64_t m, int threads) {
  switch (kind) {
    case Q4_0: linear_avx512_Q4_0(w, scale, bias, x, y, out, in, m, threads); break;
    case Q4_1: linear_avx512_Q4_1(w, scale, bias, x, y, out, in, m, threads); break;
    case Q8_0: linear_avx512_Q8_0(w, scale, bias, x, y, out, in, m, threads); break;
    default: linear_avx512_I8(w, scale, bias, x, y, out, in, m, threads);
  }
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
  return v;
}

/* Returns 0, or -1 when the variant is not in this build or the shape is unsupported. */
int vq_linear(int variant, int kind, const void* w, const float* scale, const float* bias, const float* x,
              float* y, int64_t out, int64_t in, int64_t m, int threads) {
  if (kind < Q4_0 || kind > I8 || (kind != I8 && in % QK != 0)) return -1;
  const uint8_t* wb = (const uint8_t*)w;
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
    default:
      return -1;
  }
}

/* W dequantized to fp32, rows [row0, row0 + rows). */
int vq_dequantize(int kind, const void* w, const float* scale, float* out, int64_t row0, int64_t rows, int64_t in) {
  if (kind < Q4_0 || kind > I8 || (kind != I8 && in % QK != 0)) return -1;
  int64_t rb = row_bytes(kind, in);
  for (int64_t o = row0; o < row0 + rows; o++)
    dequant_row(kind, (const uint8_t*)w + o * rb, scale ? scale[o] : 1.f, in, out + (o - row0) * in);
  return 0;
}
