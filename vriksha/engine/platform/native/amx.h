/* AMX tiles for the kernels that use them (the quantized linears' bf16 tile path, bf16 attention lanes).
 *
 * Built where the compiler targets AVX512-BF16 on x86-64 Linux; the AMX code itself carries its own target
 * attribute, so the rest of a source keeps its variant's flags. Linux grants a process the tile state on
 * request (arch_prctl); `amx_usable` asks once per library and says whether that succeeded (a CPU or VM
 * without AMX, or a kernel that refuses, gives 0). Every kernel here uses one tile shape, 16 rows of 64 bytes
 * (16 x 16 float32, or 16 x 32 bf16 as 16 x 16 pairs), so one configuration serves them all; a kernel loads
 * it on each thread before its first tile instruction and releases the tiles when done. */
#ifndef VRIKSHA_AMX_H
#define VRIKSHA_AMX_H
#if defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define VRIKSHA_AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_usable(void) {
  static int usable = -1;
  if (usable < 0) {
    unsigned int eax, ebx, ecx, edx;
    __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
    int has = (edx >> 22) & 1 && (edx >> 24) & 1; /* AMX-BF16, AMX-TILE */
    usable = has && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }
  return usable;
}

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} AmxConfig;

/* all eight tiles 16 rows of 64 bytes */
AMX_TARGET static inline void amx_configure(void) {
  AmxConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
#endif
#endif
