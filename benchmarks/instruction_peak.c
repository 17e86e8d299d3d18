// This core's peak int8 multiply-adds per second for each instruction mix tr's matmuls use, from a
// tight loop of the instruction alone (independent accumulators, operands in registers/tiles):
// AVX2 vpmaddubsw + vpmaddwd + vpaddd (int8 levels to 127), vpmaddubsw + vpaddw (int4's and narrow
// int8 levels, whose products add up in int16 over a group before one widening), AVX512-VNNI
// vpdpbusd (ymm and zmm), AMX tdpbssd on the tile shapes quantized_matmul.cpp uses (rows x one group
// of 32 x 8 columns) and the full 16x64x16.
// Built and run by benchmarks/kernel_rows.py: cc -O2; each mix is compiled for its own instruction set
// (target attributes) and run only where the CPU has it (built with every -m flag at once, the
// compiler put AVX-512 instructions into the AVX2 code too: SIGILL on AVX2-only EPYCs). Prints one
// "name GMAC/s" line per mix, the best of 7 runs.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);  // this thread's own time: others' load left out
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define BEST_OF(macs, body)                                   \
  do {                                                        \
    double best = 1e30;                                       \
    for (int run = 0; run < 7; ++run) {                       \
      double t0 = now();                                      \
      body;                                                   \
      double t = now() - t0;                                  \
      if (t < best) best = t;                                 \
    }                                                         \
    rate = (macs) / best / 1e9;                               \
  } while (0)

// Twelve independent accumulators in named registers (an array would be kept in memory).
#define DECLARE12(type, init) type a0 = init, a1 = init, a2 = init, a3 = init, a4 = init, a5 = init, a6 = init, \
                                   a7 = init, a8 = init, a9 = init, a10 = init, a11 = init
#define EACH12(step) step(a0); step(a1); step(a2); step(a3); step(a4); step(a5); \
                     step(a6); step(a7); step(a8); step(a9); step(a10); step(a11)
#define KEEP(reg, v) __asm__ volatile("" : "+" reg(v))
#define KEEP12(reg) do { EACH12(KEEP_##reg); } while (0)
#define KEEP_x(v) KEEP("x", v)
#define KEEP_v(v) KEEP("v", v)

static const long kLoops = 4000000;

__attribute__((target("avx2"))) static double avx2_mix(void) {
  const __m256i x = _mm256_set1_epi32(0x01010101), one = _mm256_set1_epi16(1);
  DECLARE12(__m256i, _mm256_setzero_si256());
  double rate;
// The products read the accumulator (as bytes) so that they cannot be hoisted out of the loop.
#define STEP(v) v = _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(x, v), one))
  BEST_OF(12.0 * kLoops * 32, for (long i = 0; i < kLoops; ++i) {
    EACH12(STEP);
    KEEP12(x);
  });
#undef STEP
  return rate;
}

// The int16 path: vpmaddubsw products summed with vpaddw, the widening (one vpmaddwd per 8 or more
// products) left out: the ceiling of int4's and Q5_0's tiles: 1.4x the mix above on a Zen 1, 1.5x
// on a Zen 4 (vpmaddubsw and vpmaddwd share the multiply pipes).
__attribute__((target("avx2"))) static double avx2_int16(void) {
  const __m256i x = _mm256_set1_epi32(0x01010101);
  DECLARE12(__m256i, _mm256_setzero_si256());
  double rate;
#define STEP(v) v = _mm256_add_epi16(v, _mm256_maddubs_epi16(x, v))
  BEST_OF(12.0 * kLoops * 32, for (long i = 0; i < kLoops; ++i) {
    EACH12(STEP);
    KEEP12(x);
  });
#undef STEP
  return rate;
}

__attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))) static double vnni_ymm(void) {
  const __m256i x = _mm256_set1_epi32(0x01010101), y = _mm256_set1_epi32(0x02020202);
  DECLARE12(__m256i, _mm256_setzero_si256());
  double rate;
#define STEP(v) v = _mm256_dpbusd_epi32(v, x, y)
  BEST_OF(12.0 * kLoops * 32, for (long i = 0; i < kLoops; ++i) {
    EACH12(STEP);
    KEEP12(x);
  });
#undef STEP
  return rate;
}

__attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))) static double vnni_zmm(void) {
  const __m512i x = _mm512_set1_epi32(0x01010101), y = _mm512_set1_epi32(0x02020202);
  DECLARE12(__m512i, _mm512_setzero_si512());
  double rate;
#define STEP(v) v = _mm512_dpbusd_epi32(v, x, y)
  BEST_OF(12.0 * kLoops * 64, for (long i = 0; i < kLoops; ++i) {
    EACH12(STEP);
    KEEP12(v);
  });
#undef STEP
  return rate;
}

struct tile_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

static int8_t tile_a[16 * 64] __attribute__((aligned(64))), tile_b[16 * 64] __attribute__((aligned(64)));

// Four independent sums (tiles 0-3) of an A tile rows x k bytes times a B tile k/4 x 4n bytes.
__attribute__((target("amx-tile,amx-int8"))) static double amx(int rows, int k, int n) {
  struct tile_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 4; ++t) c.rows[t] = rows, c.colsb[t] = 4 * n;
  c.rows[4] = rows, c.colsb[4] = k;
  c.rows[5] = k / 4, c.colsb[5] = 4 * n;
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
  _tile_loadd(4, tile_a, 64);
  _tile_loadd(5, tile_b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  double rate;
  BEST_OF(4.0 * kLoops / 4 * rows * k * n, for (long i = 0; i < kLoops / 4; ++i) {
    _tile_dpbssd(0, 4, 5);
    _tile_dpbssd(1, 4, 5);
    _tile_dpbssd(2, 4, 5);
    _tile_dpbssd(3, 4, 5);
  });
  _tile_release();
  return rate;
}

int main(void) {
  printf("avx2_maddubs %.1f\n", avx2_mix());
  printf("avx2_int16 %.1f\n", avx2_int16());
  if (!__builtin_cpu_supports("avx512vnni")) return 0;
  printf("vnni_ymm %.1f\n", vnni_ymm());
  printf("vnni_zmm %.1f\n", vnni_zmm());
  if (!__builtin_cpu_supports("amx-int8") || syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 0;  // no AMX tiles granted here
  const int rows[] = {1, 2, 4, 8, 16};
  for (int i = 0; i < 5; ++i) printf("amx_%dx32x8 %.1f\n", rows[i], amx(rows[i], 32, 8));
  printf("amx_16x64x16 %.1f\n", amx(16, 64, 16));
  return 0;
}
