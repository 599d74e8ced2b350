/* What a plain AVX2 int8 GEMV does on the machine that runs it: the evidence for (or against) a custom onnxruntime op.

     cc -O3 -mavx2 -mfma -pthread benchmarks/int8_gemv_probe.c -o /tmp/int8_gemv_probe && /tmp/int8_gemv_probe

   Not part of edgelm: a measurement. It streams distilgpt2's int8 weight products for one token (6 blocks of
   768x2304, 768x768, 768x3072, 3072x768, and the 768x50257 LM head; 81.1 M weights) the way a custom op would:
   weights as [N, K] rows of 7-bit signed values (onnxruntime's reduce-range values), the activation as K
   unsigned bytes, _mm256_maddubs_epi16 then _mm256_madd_epi16, four rows at a time, and one float per output
   (int32 sum times the row's scale). Two threads split every product's rows and meet at a spin barrier after
   each product, as onnxruntime's thread pool does after each op. Beside it, in alternating rounds: the same
   bytes summed by the same two threads (the read ceiling), on the same pages.

   Prints the median ms per token and GB/s of each, and their ratio. Argument "huge" (default) puts the
   buffer on transparent huge pages (madvise), "small" keeps 4 KiB pages. */

#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define THREADS 2
#define ROUNDS 15
#define TOKENS 40

typedef struct { int k, n; const int8_t *w; const float *scale; } Product;

static Product products[6 * 4 + 1];
static int n_products;
static uint8_t act[3072] __attribute__((aligned(32)));
float out[50257 + 64];  /* external and read after every product: the compiler must compute it */
static const uint8_t *buffer;
static size_t buffer_bytes;

static atomic_int arrived, generation;
static atomic_int job;  /* 0: GEMV, 1: read, -1: stop */
static volatile int64_t sinks[THREADS];

static void barrier(void) {
  int g = atomic_load(&generation);
  if (atomic_fetch_add(&arrived, 1) == THREADS - 1) {
    atomic_store(&arrived, 0);
    atomic_fetch_add(&generation, 1);
  } else {
    while (atomic_load(&generation) == g) _mm_pause();
  }
}

static inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_hadd_epi32(s, s);
  s = _mm_hadd_epi32(s, s);
  return _mm_cvtsi128_si32(s);
}

static void gemv_rows(const Product *p, int from, int to) {
  const __m256i ones = _mm256_set1_epi16(1);
  int n = from;
  for (; n + 4 <= to; n += 4) {
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int k = 0; k < p->k; k += 32) {
      __m256i a = _mm256_load_si256((const __m256i *)(act + k));
      const int8_t *chunk = p->w + (size_t)n * p->k + (size_t)k * 4;  /* packed: 4 rows' 32 bytes back to back */
      for (int r = 0; r < 4; r++) {
        __m256i w = _mm256_load_si256((const __m256i *)(chunk + 32 * r));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), ones));
      }
    }
    for (int r = 0; r < 4; r++) out[n + r] = (float)hsum(acc[r]) * p->scale[n + r];
  }
  for (; n < to; n++) {
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < p->k; k += 32) {
      __m256i a = _mm256_load_si256((const __m256i *)(act + k));
      __m256i w = _mm256_loadu_si256((const __m256i *)(p->w + (size_t)n * p->k + k));  /* rows past the last block of 4: plain */
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), ones));
    }
    out[n] = (float)hsum(acc) * p->scale[n];
  }
}

static void read_part(int t) {
  size_t part = buffer_bytes / THREADS / 32 * 32, start = part * t;
  __m256i acc = _mm256_setzero_si256();
  for (size_t i = start; i < start + part; i += 128) {
    acc = _mm256_max_epu8(acc, _mm256_load_si256((const __m256i *)(buffer + i)));
    acc = _mm256_max_epu8(acc, _mm256_load_si256((const __m256i *)(buffer + i + 32)));
    acc = _mm256_max_epu8(acc, _mm256_load_si256((const __m256i *)(buffer + i + 64)));
    acc = _mm256_max_epu8(acc, _mm256_load_si256((const __m256i *)(buffer + i + 96)));
  }
  sinks[t] += _mm256_extract_epi64(acc, 0);
}

static void token(int t) {
  for (int i = 0; i < n_products; i++) {
    const Product *p = &products[i];
    int rows = (p->n + 4 * THREADS - 1) / (4 * THREADS) * 4;  /* whole blocks of 4 rows per thread */
    int from = t * rows, to = from + rows < p->n ? from + rows : p->n;
    gemv_rows(p, from, to);
    sinks[t] += (int64_t)out[from];
    barrier();
  }
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  for (;;) {
    barrier();  /* wait for a job */
    int j = atomic_load(&job);
    if (j < 0) return NULL;
    if (j == 0) token(t); else read_part(t);
    barrier();
  }
}

/* Weight (row n, column k) in the packed layout: blocks of 4 rows, 32 columns of each row back to back. */
static int8_t weight(const Product *p, int n, int k) {
  if (n >= p->n / 4 * 4) return p->w[(size_t)n * p->k + k];
  return p->w[(size_t)(n / 4 * 4) * p->k + (size_t)(k / 32) * 128 + (n % 4) * 32 + k % 32];
}

/* The kernel against a plain loop on one product: every output, exactly (integer sums, one scale). */
static int check(const Product *p) {
  gemv_rows(p, 0, p->n);
  for (int n = 0; n < p->n; n++) {
    int32_t sum = 0;
    for (int k = 0; k < p->k; k++) sum += (int32_t)act[k] * weight(p, n, k);
    if ((float)sum * p->scale[n] != out[n]) {
      fprintf(stderr, "row %d of a %dx%d product: %f, expected %f\n", n, p->k, p->n, out[n], (float)sum * p->scale[n]);
      return 0;
    }
  }
  return 1;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double run(int j) {
  double started = now();
  atomic_store(&job, j);
  barrier();
  if (j == 0) token(0); else read_part(0);
  barrier();
  return now() - started;
}

static int compare(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int huge = !(argc > 1 && strcmp(argv[1], "small") == 0);
  int shapes[5][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50257}};
  size_t total = 0;
  for (int s = 0; s < 4; s++) total += (size_t)6 * shapes[s][0] * shapes[s][1];
  total += (size_t)shapes[4][0] * shapes[4][1];
  buffer_bytes = (total + 4095) / 4096 * 4096;
  int8_t *w = aligned_alloc(2 << 20, (buffer_bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  if (madvise(w, buffer_bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) perror("madvise");
  for (size_t i = 0; i < buffer_bytes; i++) w[i] = (int8_t)((i * 2654435761u >> 13) % 127) - 63;  /* 7-bit values */
  buffer = (const uint8_t *)w;
  static float scale[50257 + 64];
  for (int i = 0; i < 50257 + 64; i++) scale[i] = 0.01f;
  for (int i = 0; i < 3072; i++) act[i] = (uint8_t)(i * 7);
  size_t offset = 0;
  for (int layer = 0; layer < 6; layer++)
    for (int s = 0; s < 4; s++) {
      products[n_products++] = (Product){shapes[s][0], shapes[s][1], w + offset, scale};
      offset += (size_t)shapes[s][0] * shapes[s][1];
    }
  products[n_products++] = (Product){shapes[4][0], shapes[4][1], w + offset, scale};

  for (int i = 0; i < n_products; i++)  /* the first block's four products and the LM head */
    if ((i < 4 || i == n_products - 1) && !check(&products[i])) return 1;
  pthread_t threads[THREADS];
  for (int t = 1; t < THREADS; t++) pthread_create(&threads[t], NULL, worker, (void *)(intptr_t)t);
  run(0);
  run(1);  /* warm-up */
  double gemv[ROUNDS], reads[ROUNDS], ratio[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double times[TOKENS];
    for (int i = 0; i < TOKENS; i++) times[i] = run(0);
    qsort(times, TOKENS, sizeof(double), compare);
    gemv[r] = times[TOKENS / 2];
    for (int i = 0; i < 5; i++) times[i] = run(1);
    qsort(times, 5, sizeof(double), compare);
    reads[r] = times[2];
    ratio[r] = reads[r] / gemv[r];
  }
  qsort(gemv, ROUNDS, sizeof(double), compare);
  qsort(reads, ROUNDS, sizeof(double), compare);
  qsort(ratio, ROUNDS, sizeof(double), compare);
  double g = gemv[ROUNDS / 2], rd = reads[ROUNDS / 2];
  printf("%s pages, %d threads, %.1f MB of int8 weights per token\n", huge ? "huge" : "4 KiB", THREADS, total / 1e6);
  printf("int8 GEMV (AVX2 maddubs), all products of a token: %.3f ms  %.1f GB/s  %.0f tok/s\n", g * 1e3, total / g / 1e9, 1 / g);
  printf("read of the same bytes (ceiling):                  %.3f ms  %.1f GB/s  %.0f tok/s\n", rd * 1e3, total / rd / 1e9, 1 / rd);
  printf("GEMV / ceiling, same rounds: %.2f\n", ratio[ROUNDS / 2]);
  atomic_store(&job, -1);
  barrier();
  return (int)(sinks[0] & 0);
}
