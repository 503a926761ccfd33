/* Every decoder layer of a decode step in one call: the engine's own kernels, sequenced in C.
 *
 * A decode step of a Llama-shaped stack (Llama, Qwen2, Qwen3) runs per layer: RMSNorm (the previous MLP output
 * added first), the q/k/v projections, Qwen3's per-head q/k norms, rotary embedding, the new token's K/V written
 * into the pool, decode attention over the pool in place, o_proj, the residual add and RMSNorm, gate and up,
 * SiLU * up, down. This file does no arithmetic of its own (beyond copying K/V into their slots and the last
 * residual add): it calls the very kernels the engine's Python forward calls (`kernels.c` and
 * `quant_kernels.c`, through function pointers taken from their loaded libraries), in the same order on the
 * same buffers, so its results equal that forward's bit for bit where it picks the same linear kernels. What it
 * removes is the per-operation cost around them: ctypes calls, tensor views and allocations, dispatch.
 * The weights' pointers are prepared once per model (`native_decode.py`); every buffer is float32 but the KV
 * pool, which may hold bf16 (a float32 engine's `kv_cache_dtype`). Rows on a LoRA adapter get its delta added
 * after each adapted linear layer's base matmul (`lora_delta.c`), the adapters' pointers prepared once per load.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lora_delta.h"

typedef void (*linear_fn)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int);
typedef int (*vq_linear_fn)(int, int, const void*, const float*, const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int);
typedef void (*rms_norm_fn)(float*, const float*, const float*, float*, int64_t, int64_t, float, int);
typedef void (*rope_fn)(float*, const float*, const float*, int64_t, int64_t, int64_t, int);
typedef void (*silu_mul_fn)(const float*, const float*, float*, int64_t, int);
/* the pools' element type is the model's `kv_bf16`: float32, or bf16 (uint16_t) */
typedef void (*attention_fn)(const float*, const void*, const void*, const int64_t*, const int64_t*, float*,
                             int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t, int);

typedef struct {
  int64_t kind; /* -1: a float32 weight [out, in] (linear_f32); else the quantized kernels' format */
  const void* weight;
  const float* scale; /* int8: one per output row */
  const float* bias;
  int64_t out, in;
  int64_t path; /* the quantized kernels' code path (vq_variants' bit) for this weight at this batch size */
} vl_linear;

typedef struct {
  vl_linear q, k, v, o, gate, up, down;
  const float *input_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm: NULL unless per-head norms */
  float input_eps, post_eps, q_eps, k_eps, scale;
  int64_t window; /* 0: none */
  void *k_pool, *v_pool; /* [slots, kv_heads, head_dim], [slots, kv_heads, v_dim]: float32 or bf16 */
} vl_layer;

typedef struct {
  linear_fn linear;
  vq_linear_fn vq_linear;
  rms_norm_fn rms_norm;
  rope_fn rope;
  silu_mul_fn silu_mul;
  attention_fn attention;
  int64_t num_layers, hidden, heads, kv_heads, head_dim, v_dim, intermediate;
  const vl_layer* layers;
  int64_t kv_bf16; /* the KV pool holds bf16: new K/V are rounded to it (nearest even) as they are written */
} vl_model;

static void store_kv(void* pool, int64_t slot, const float* src, int64_t n, int64_t bf16) {
  if (!bf16) {
    memcpy((float*)pool + slot * n, src, sizeof(float) * n);
    return;
  }
  uint16_t* dst = (uint16_t*)pool + slot * n;
  for (int64_t e = 0; e < n; e++) {
    uint32_t u;
    memcpy(&u, src + e, 4);
    dst[e] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40)
                                              : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

static int run_linear(const vl_model* m, const vl_linear* l, const float* x, float* y, int64_t rows, int threads) {
  if (l->kind < 0) {
    m->linear((const float*)l->weight, l->bias, x, y, l->out, l->in, rows, threads);
    return 0;
  }
  return m->vq_linear((int)l->path, (int)l->kind, l->weight, l->scale, l->bias, x, y, l->out, l->in, rows,
                      threads);
}

typedef struct { /* a step's LoRA rows; lora NULL: none */
  const vl_lora_layer* const* lora;
  float* scratch;
  int64_t scratch_row;
} lora_rows;

/* The base matmul, then the LoRA delta of every adapted row. */
static int adapted_linear(const vl_model* m, const vl_linear* l, const lora_rows* r, int64_t layer, int which,
                          const float* x, float* y, int64_t rows, int threads) {
  int failed = run_linear(m, l, x, y, rows, threads);
  if (r->lora != NULL && !failed)
    vl_lora_delta(r->lora, layer, which, x, y, rows, l->in, l->out, r->scratch, r->scratch_row, threads);
  return failed;
}

/* h [batch, hidden]: the embedded tokens in, the last layer's output (residual included) out. One decode token
 * per request: cos, sin [batch, head_dim]; slot_mapping [batch] where each token's K/V go; kv_slots
 * [batch, max_len], kv_lens [batch] what each attends to. lora [batch]: each row's adapter (NULL: a base
 * row), or NULL when no row has one; lora_rank: the largest rank among them. Returns 0, -1 when out of
 * memory, -2 when a quantized kernel refused its weight. */
int vl_decode(const vl_model* m, float* h, int64_t batch, const float* cos, const float* sin,
              const int64_t* slot_mapping, const int64_t* kv_slots, const int64_t* kv_lens, int64_t max_len,
              const vl_lora_layer* const* lora, int64_t lora_rank, int threads) {
  const int64_t hid = m->hidden, qd = m->heads * m->head_dim, kd = m->kv_heads * m->head_dim;
  const int64_t vd = m->kv_heads * m->v_dim, od = m->heads * m->v_dim, inter = m->intermediate;
  int64_t widest = hid > inter ? hid : inter;
  widest = widest > qd ? widest : qd;
  widest = widest > kd ? widest : kd;
  widest = widest > vd ? widest : vd;
  const int64_t scratch_row = lora != NULL ? lora_rank + widest : 0;
  float* work =
      (float*)malloc(sizeof(float) * batch * (2 * hid + qd + kd + vd + od + hid + 3 * inter + scratch_row));
  if (work == NULL) return -1;
  float *x = work, *delta = x + batch * hid, *q = delta + batch * hid, *k = q + batch * qd, *v = k + batch * kd;
  float *attn = v + batch * vd, *o = attn + batch * od, *gate = o + batch * hid, *up = gate + batch * inter;
  float* act = up + batch * inter;
  const lora_rows r = {lora, act + batch * inter, scratch_row};
  int failed = 0;
  for (int64_t i = 0; i < m->num_layers && !failed; i++) {
    const vl_layer* L = m->layers + i;
    m->rms_norm(h, i > 0 ? delta : NULL, L->input_norm, x, batch, hid, L->input_eps, threads);
    failed |= adapted_linear(m, &L->q, &r, i, VL_Q, x, q, batch, threads);
    failed |= adapted_linear(m, &L->k, &r, i, VL_K, x, k, batch, threads);
    failed |= adapted_linear(m, &L->v, &r, i, VL_V, x, v, batch, threads);
    if (L->q_norm != NULL) { /* in place: each row's sum of squares is taken before it is written */
      m->rms_norm(q, NULL, L->q_norm, q, batch * m->heads, m->head_dim, L->q_eps, threads);
      m->rms_norm(k, NULL, L->k_norm, k, batch * m->kv_heads, m->head_dim, L->k_eps, threads);
    }
    m->rope(q, cos, sin, batch, m->heads, m->head_dim, threads);
    m->rope(k, cos, sin, batch, m->kv_heads, m->head_dim, threads);
    for (int64_t t = 0; t < batch; t++) {
      store_kv(L->k_pool, slot_mapping[t], k + t * kd, kd, m->kv_bf16);
      store_kv(L->v_pool, slot_mapping[t], v + t * vd, vd, m->kv_bf16);
    }
    m->attention(q, L->k_pool, L->v_pool, kv_slots, kv_lens, attn, batch, m->heads, m->kv_heads, m->head_dim,
                 m->v_dim, max_len, L->scale, L->window, threads);
    failed |= adapted_linear(m, &L->o, &r, i, VL_O, attn, o, batch, threads);
    m->rms_norm(h, o, L->post_norm, x, batch, hid, L->post_eps, threads);
    failed |= adapted_linear(m, &L->gate, &r, i, VL_GATE, x, gate, batch, threads);
    failed |= adapted_linear(m, &L->up, &r, i, VL_UP, x, up, batch, threads);
    m->silu_mul(gate, up, act, batch * inter, threads);
    failed |= adapted_linear(m, &L->down, &r, i, VL_DOWN, act, delta, batch, threads);
  }
  if (!failed && m->num_layers > 0)
    for (int64_t e = 0; e < batch * hid; e++) h[e] += delta[e];
  free(work);
  return failed ? -2 : 0;
}
