/* Grammar token masks applied to logits in place: the packed words llguidance writes, never unpacked.
 *
 * vb_apply_bitmask_f32: for each of `n` masked rows, logits[row][t] = -inf where bit (t % 32) of word t / 32 of
 *   that row's mask is 0 (little-endian bits: bit j of word w is token 32 w + j); tokens at or past 32 * words
 *   are blocked too. A word of all ones (every token allowed, most words inside a JSON string) is skipped
 *   without reading the logits; a zero word is stored as -inf without reading them.
 *   `rows` names each mask's logits row (NULL: row i for mask i); rows are `row_stride` floats apart.
 * Compiled once per instruction set (simd.h): AVX-512 masked stores, AVX2 blends, or the scalar loop.
 * Threads: OpenMP over rows, sharing the runtime torch already loaded.
 */
#include <stdint.h>

#include "simd.h"

static void mask_row(float* x, const int32_t* mask, int64_t words, int64_t vocab) {
  const float ninf = -INFINITY;
  int64_t full = vocab / 32 < words ? vocab / 32 : words; /* words whose 32 tokens are all in the vocabulary */
  for (int64_t w = 0; w < full; w++) {
    uint32_t bits = (uint32_t)mask[w];
    float* p = x + 32 * w;
    if (bits == 0xffffffffu) continue;
#if defined(VRIKSHA_AVX512)
    __m512 v = _mm512_set1_ps(ninf);
    _mm512_mask_storeu_ps(p, (__mmask16)~bits, v);
    _mm512_mask_storeu_ps(p + 16, (__mmask16)~(bits >> 16), v);
#elif defined(VRIKSHA_AVX2)
    __m256 v = _mm256_set1_ps(ninf);
    if (bits == 0) {
      _mm256_storeu_ps(p, v);
      _mm256_storeu_ps(p + 8, v);
      _mm256_storeu_ps(p + 16, v);
      _mm256_storeu_ps(p + 24, v);
      continue;
    }
    const __m256i lanes = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    for (int g = 0; g < 4; g++) {
      uint32_t byte = (bits >> (8 * g)) & 0xffu;
      if (byte == 0xffu) continue;
      __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)byte), lanes);
      __m256 keep = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lanes));
      _mm256_storeu_ps(p + 8 * g, _mm256_blendv_ps(v, _mm256_loadu_ps(p + 8 * g), keep));
    }
#else
    for (int j = 0; j < 32; j++)
      if (!((bits >> j) & 1u)) p[j] = ninf;
#endif
  }
  /* the tail: a last word only partly inside the vocabulary, then tokens no word covers */
  for (int64_t t = 32 * full; t < vocab; t++) {
    int64_t w = t / 32;
    if (w >= words || !(((uint32_t)mask[w] >> (t % 32)) & 1u)) x[t] = ninf;
  }
}

void vb_apply_bitmask_f32(float* logits, int64_t row_stride, const int64_t* rows, int64_t n, const int32_t* mask,
                          int64_t mask_stride, int64_t words, int64_t vocab, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n > 1)
  for (int64_t i = 0; i < n; i++) {
    int64_t r = rows ? rows[i] : i;
    mask_row(logits + r * row_stride, mask + i * mask_stride, words, vocab);
  }
}

/* Which code path this build runs: 1 scalar, 2 AVX2, 4 AVX-512. */
int vb_variant(void) {
#if defined(VRIKSHA_AVX512)
  return 4;
#elif defined(VRIKSHA_AVX2)
  return 2;
#else
  return 1;
#endif
}
