/* The LoRA weights the native decode step reads (`lora_delta.c`, `runner/native_decode.py`). */
#ifndef VRIKSHA_LORA_DELTA_H
#define VRIKSHA_LORA_DELTA_H

#include <stdint.h>

typedef struct {
  const float* a; /* A^T [in, rank]; NULL: the adapter leaves this linear layer alone */
  const float* b; /* scaling * B^T [rank, out] */
  int64_t rank;
} vl_lora;

enum { VL_Q, VL_K, VL_V, VL_O, VL_GATE, VL_UP, VL_DOWN, VL_LINEARS };

/* One adapter's weights for one decoder layer; an adapter is an array of these, one per layer. */
typedef struct {
  vl_lora w[VL_LINEARS];
} vl_lora_layer;

/* y [batch, out] += each adapted row's delta. `lora` [batch]: each row's adapter (NULL: the base model's row);
 * `scratch`: `scratch_row` (>= rank + out) floats per row. */
void vl_lora_delta(const vl_lora_layer* const* lora, int64_t layer, int which, const float* x, float* y,
                   int64_t batch, int64_t in, int64_t out, float* scratch, int64_t scratch_row, int threads);

#endif
