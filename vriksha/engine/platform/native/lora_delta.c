/* LoRA deltas inside the native decode step (`layers.c`): after a linear layer's base matmul, each row on an
 * adapter gets that adapter's low-rank product added,
 *
 *     y[t] += (x[t] A^T) (s B^T)
 *
 * with A^T [in, rank] and s B^T [rank, out] as `platform/lora_linear.py` holds them (row-major, contiguous):
 * both products run over the contiguous axis (rank, then out), so each is a broadcast-multiply-add that the
 * compiler vectorizes without reassociating a sum. The delta is summed apart and then added, as the torch path
 * does. Threads: OpenMP over the rows on an adapter.
 */
#include <stddef.h>
#include <stdint.h>

#include "lora_delta.h"

void vl_lora_delta(const vl_lora_layer* const* lora, int64_t layer, int which, const float* x, float* y,
                   int64_t batch, int64_t in, int64_t out, float* scratch, int64_t scratch_row, int threads) {
  int64_t adapted = 0;
  for (int64_t t = 0; t < batch; t++) adapted += lora[t] != NULL && lora[t][layer].w[which].a != NULL;
  if (adapted == 0) return;
#pragma omp parallel for schedule(static) num_threads(threads) if (adapted > 1)
  for (int64_t t = 0; t < batch; t++) {
    if (lora[t] == NULL) continue;
    const vl_lora* w = &lora[t][layer].w[which];
    if (w->a == NULL) continue; /* this adapter leaves the layer alone */
    const int64_t rank = w->rank;
    float* low = scratch + t * scratch_row; /* [rank] */
    float* d = low + rank;                  /* [out] */
    const float* xt = x + t * in;
    for (int64_t j = 0; j < rank; j++) low[j] = 0.f;
    for (int64_t i = 0; i < in; i++) {
      const float xi = xt[i];
      const float* a = w->a + i * rank;
      for (int64_t j = 0; j < rank; j++) low[j] += xi * a[j];
    }
    for (int64_t o = 0; o < out; o++) d[o] = 0.f;
    for (int64_t j = 0; j < rank; j++) {
      const float lj = low[j];
      const float* b = w->b + j * out;
      for (int64_t o = 0; o < out; o++) d[o] += lj * b[o];
    }
    float* yt = y + t * out;
    for (int64_t o = 0; o < out; o++) yt[o] += d[o];
  }
}
