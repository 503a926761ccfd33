/* The 5-bit and K-quant GGUF blocks (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), read 32 weights at a time.
 *
 * Layouts (GGML's; `f16` an IEEE half, multi-byte fields little-endian):
 *   Q5_0   22 bytes / 32:  f16 d, u32 high bits, 16 bytes of low nibbles;            w = d * (q - 16)
 *   Q5_1   24 bytes / 32:  f16 d, f16 m, u32 high bits, 16 bytes of low nibbles;     w = d * q + m
 *   Q4_K  144 bytes / 256: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
 *                          sub-block j (32 weights): w = (d * sc[j]) * q - dmin * mn[j]
 *   Q5_K  176 bytes / 256: as Q4_K with 32 bytes of high bits before the nibbles (bit j of byte l: weight l of
 *                          sub-block j)
 *   Q6_K  210 bytes / 256: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 scales, f16 d;
 *                          16-weight group g: w = (d * sc[g]) * (q - 32)
 * In Q5_0 / Q5_1, byte j holds weight j in its low nibble and j + 16 in its high one, bit j of the u32 the
 * fifth bit of weight j. In Q4_K / Q5_K, sub-block j's nibbles are bytes 32 * (j / 2) .. + 32, low nibbles for
 * even j, high for odd. In Q6_K, sub-block j = 4h + t (h the 128-weight half) takes low nibble bytes
 * 64h + 32 (t % 2) + l shifted by 4 (t / 2), and high bit pair 2t of byte 32h + l.
 *
 * Every block of 32 is `w = (q - bias) * d[half] + m[half]` over its two halves of 16 (`BlockScales`): one
 * scale for all of Q5_0 / Q5_1 / Q4_K / Q5_K's block, two for Q6_K's. */
#ifndef VQ_KQUANT_H
#define VQ_KQUANT_H

#include <stdint.h>
#include <string.h>

#define QK_K 256

typedef struct {
  float d[2], m[2]; /* per half of the block of 32; m is 0 where the format has no offset */
} BlockScales;

/* Bytes a super-block (K-quants) or block (Q5_0, Q5_1), and the weights it holds. */
static inline int64_t kq_block_bytes(int kind) {
  return kind == Q5_0 ? 22 : kind == Q5_1 ? 24 : kind == Q4_K ? 144 : kind == Q5_K ? 176 : 210;
}
static inline int64_t kq_block_weights(int kind) { return kind == Q5_0 || kind == Q5_1 ? QK : QK_K; }
/* The code each format subtracts before scaling. */
static inline int kq_bias(int kind) { return kind == Q5_0 ? 16 : kind == Q6_K ? 32 : 0; }
static inline int kq_has_min(int kind) { return kind == Q5_1 || kind == Q4_K || kind == Q5_K; }

static inline float kq_half(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

static inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Scale and min of sub-block j (0-7) from the 12 packed bytes of a Q4_K / Q5_K super-block. */
static inline void scale_min_k4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Where block b (32 weights) of a row starts: its own block (Q5_0, Q5_1) or its super-block (K-quants). */
static inline const uint8_t* kq_block(int kind, const uint8_t* w, int64_t b) {
  return w + (b / (kq_block_weights(kind) / QK)) * kq_block_bytes(kind);
}

/* The scales of block b, as the reference computes them: d * sc and dmin * mn each one fp32 product. */
static inline BlockScales kq_scales(int kind, const uint8_t* w, int64_t b) {
  const uint8_t* blk = kq_block(kind, w, b);
  int j = (int)(b % 8);
  BlockScales s;
  if (kind == Q5_0 || kind == Q5_1) {
    s.d[0] = s.d[1] = kq_half(load_u16(blk));
    s.m[0] = s.m[1] = kind == Q5_1 ? kq_half(load_u16(blk + 2)) : 0.f;
  } else if (kind == Q6_K) {
    float d = kq_half(load_u16(blk + 208));
    s.d[0] = d * (float)(int8_t)blk[192 + 2 * j];
    s.d[1] = d * (float)(int8_t)blk[192 + 2 * j + 1];
    s.m[0] = s.m[1] = 0.f;
  } else {
    int sc, mn;
    scale_min_k4(j, blk + 4, &sc, &mn);
    s.d[0] = s.d[1] = kq_half(load_u16(blk)) * (float)sc;
    s.m[0] = s.m[1] = -(kq_half(load_u16(blk + 2)) * (float)mn);
  }
  return s;
}

/* The 32 unsigned codes of block b (bias not yet subtracted): the reference the vector decoders follow. */
static inline void kq_codes(int kind, const uint8_t* w, int64_t b, int* q) {
  const uint8_t* blk = kq_block(kind, w, b);
  int j = (int)(b % 8);
  if (kind == Q5_0 || kind == Q5_1) {
    uint32_t qh = load_u32(blk + (kind == Q5_0 ? 2 : 4));
    const uint8_t* qs = blk + (kind == Q5_0 ? 6 : 8);
    for (int l = 0; l < 16; l++) {
      q[l] = (qs[l] & 0x0f) | (int)(((qh >> l) & 1) << 4);
      q[l + 16] = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1) << 4);
    }
  } else if (kind == Q6_K) {
    int h = j / 4, t = j % 4;
    const uint8_t* ql = blk + 64 * h + 32 * (t % 2);
    const uint8_t* qh = blk + 128 + 32 * h;
    for (int l = 0; l < 32; l++) q[l] = ((ql[l] >> (4 * (t / 2))) & 0x0f) | (((qh[l] >> (2 * t)) & 3) << 4);
  } else {
    const uint8_t* qs = blk + (kind == Q5_K ? 48 : 16) + 32 * (j / 2);
    for (int l = 0; l < 32; l++) {
      q[l] = (qs[l] >> (4 * (j % 2))) & 0x0f;
      if (kind == Q5_K) q[l] |= ((blk[16 + l] >> j) & 1) << 4;
    }
  }
}

/* Block b dequantized with the reference's roundings (each product and sum its own: contraction off). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static void kq_dequant_block(int kind, const uint8_t* w, int64_t b, float* out) {
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
  int q[QK];
  kq_codes(kind, w, b, q);
  BlockScales s = kq_scales(kind, w, b);
  int bias = kq_bias(kind), min = kq_has_min(kind);
  for (int l = 0; l < QK; l++) {
    float v = s.d[l / 16] * (float)(q[l] - bias);
    out[l] = min ? v + s.m[l / 16] : v;
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static inline __m256i kq_bits8(__m256i bytes, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi32(bytes, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(mask));
}

/* Codes k * 8 .. k * 8 + 7 of block b as int32 lanes, bias subtracted (AVX2). */
static inline __attribute__((always_inline)) void kq_codes8x4(int kind, const uint8_t* w, int64_t b, __m256i* q) {
  const uint8_t* blk = kq_block(kind, w, b);
  int j = (int)(b % 8);
  if (kind == Q5_0 || kind == Q5_1) {
    __m256i qh = _mm256_set1_epi32((int)load_u32(blk + (kind == Q5_0 ? 2 : 4)));
    const uint8_t* qs = blk + (kind == Q5_0 ? 6 : 8);
    __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)qs));
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 8)));
    __m256i low[4] = {kq_bits8(a, 0, 15), kq_bits8(c, 0, 15), kq_bits8(a, 4, 15), kq_bits8(c, 4, 15)};
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), one = _mm256_set1_epi32(1);
    for (int k = 0; k < 4; k++) {
      __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * k))), one);
      q[k] = _mm256_sub_epi32(_mm256_or_si256(low[k], _mm256_slli_epi32(bit, 4)), _mm256_set1_epi32(kq_bias(kind)));
    }
    return;
  }
  for (int k = 0; k < 4; k++) {
    __m256i v;
    if (kind == Q6_K) {
      int h = j / 4, t = j % 4;
      __m256i ql = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 64 * h + 32 * (t % 2) + 8 * k)));
      __m256i qh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 128 + 32 * h + 8 * k)));
      v = _mm256_or_si256(kq_bits8(ql, 4 * (t / 2), 15), _mm256_slli_epi32(kq_bits8(qh, 2 * t, 3), 4));
      v = _mm256_sub_epi32(v, _mm256_set1_epi32(32));
    } else {
      const uint8_t* qs = blk + (kind == Q5_K ? 48 : 16) + 32 * (j / 2) + 8 * k;
      v = kq_bits8(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)qs)), 4 * (j % 2), 15);
      if (kind == Q5_K) {
        __m256i qh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 16 + 8 * k)));
        v = _mm256_or_si256(v, _mm256_slli_epi32(kq_bits8(qh, j, 1), 4));
      }
    }
    q[k] = v;
  }
}

/* The 32 weights of block b as four vectors of eight: (q - bias) * d (+ m, fused into one rounding). */
static inline __attribute__((always_inline)) void kq_decode8x4(int kind, const uint8_t* w, int64_t b, __m256* v) {
  __m256i q[4];
  kq_codes8x4(kind, w, b, q);
  BlockScales s = kq_scales(kind, w, b);
  for (int k = 0; k < 4; k++) {
    __m256 d = _mm256_set1_ps(s.d[k / 2]);
    v[k] = kq_has_min(kind) ? _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, _mm256_set1_ps(s.m[k / 2]))
                            : _mm256_mul_ps(_mm256_cvtepi32_ps(q[k]), d);
  }
}
#endif

#if defined(__AVX512F__)
static inline __m512i kq_bits16(__m512i bytes, int shift, int mask) {
  return _mm512_and_si512(_mm512_srl_epi32(bytes, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(mask));
}

static inline __m512i kq_load16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }

/* The 32 weights of block b as two vectors of sixteen (AVX-512). */
static inline __attribute__((always_inline)) void kq_decode16x2(int kind, const uint8_t* w, int64_t b, __m512* v) {
  const uint8_t* blk = kq_block(kind, w, b);
  int j = (int)(b % 8);
  __m512i q[2];
  if (kind == Q5_0 || kind == Q5_1) {
    __m512i qh = _mm512_set1_epi32((int)load_u32(blk + (kind == Q5_0 ? 2 : 4)));
    __m512i a = kq_load16(blk + (kind == Q5_0 ? 6 : 8));
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int k = 0; k < 2; k++) {
      __m512i bit = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * k))),
                                     _mm512_set1_epi32(1));
      q[k] = _mm512_or_si512(kq_bits16(a, 4 * k, 15), _mm512_slli_epi32(bit, 4));
    }
  } else {
    for (int k = 0; k < 2; k++) {
      if (kind == Q6_K) {
        int h = j / 4, t = j % 4;
        __m512i ql = kq_load16(blk + 64 * h + 32 * (t % 2) + 16 * k), qh = kq_load16(blk + 128 + 32 * h + 16 * k);
        q[k] = _mm512_or_si512(kq_bits16(ql, 4 * (t / 2), 15), _mm512_slli_epi32(kq_bits16(qh, 2 * t, 3), 4));
      } else {
        q[k] = kq_bits16(kq_load16(blk + (kind == Q5_K ? 48 : 16) + 32 * (j / 2) + 16 * k), 4 * (j % 2), 15);
        if (kind == Q5_K) q[k] = _mm512_or_si512(q[k], _mm512_slli_epi32(kq_bits16(kq_load16(blk + 16 + 16 * k), j, 1), 4));
      }
    }
  }
  BlockScales s = kq_scales(kind, w, b);
  for (int k = 0; k < 2; k++) {
    __m512 qf = _mm512_cvtepi32_ps(_mm512_sub_epi32(q[k], _mm512_set1_epi32(kq_bias(kind))));
    __m512 d = _mm512_set1_ps(s.d[k]);
    v[k] = kq_has_min(kind) ? _mm512_fmadd_ps(qf, d, _mm512_set1_ps(s.m[k])) : _mm512_mul_ps(qf, d);
  }
}
#endif

#endif
