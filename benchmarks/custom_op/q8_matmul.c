/* edgelm.Q8MatMul: the int8 recipe's weight product (onnxruntime's MatMulNBits, bits 8, blocks of 32, no zero
   points) as an onnxruntime custom op, to measure what a kernel of our own would change. Not part of edgelm.

     benchmarks/custom_op/build.sh ORT_INCLUDE_DIR      # -> benchmarks/out/custom_op/libedgelm_q8.so

   Inputs, as MatMulNBits takes them (attributes K, N, bits 8, block_size 32):
     A       float  [..., K]          the activations
     B       uint8  [N, K/32, 32]     the weights: code + 128 (zero point 128), row n is output n
     scales  float  [N * K/32]        one per output and block
   Output:   float  [..., N]          Y = A B^T with B dequantized

   Kernel (as MatMulNBits at accuracy_level 4 and llama.cpp's q8_0 do): each row of A is quantized per block of
   32 to int8 (scale = max|a| / 127, round to nearest even), then each block's dot product is vpdpbusd with the
   weights as the unsigned operand and the activations as the signed one. The accumulator starts at
   -128 * sum(a codes) in its first lane, which removes the zero point exactly in integers; the block's 8 int32
   lanes are converted to float and accumulated with the product of the two scales, two blocks per 512-bit
   register; one horizontal sum per output at the end. At its first call a kernel copies its weights onto
   transparent huge pages, packed so that four outputs' rows are one sequential stream (pack, below), and runs
   four outputs at a time over them: onnxruntime's own copy stays, so the weights take their memory twice.
   The outputs are split in chunks over onnxruntime's intra-op threads (KernelContext_ParallelFor), or over the
   library's own (EDGELM_Q8_THREADS).

   Built for a CPU without AVX-512 VNNI, the kernel is a scalar loop (the same arithmetic, for correctness
   only); built with it, the library refuses to register on a CPU that lacks it.

   To measure, read when the library registers: EDGELM_Q8_CHUNK (outputs per parallel task, default 64),
   EDGELM_Q8_SCALAR=1 (the scalar loop), EDGELM_Q8_PACK=0 (no packed copy: one output at a time over the
   weights where onnxruntime holds them, or with EDGELM_Q8_COPY=1 over a plain copy on huge pages) and
   EDGELM_Q8_THREADS (below). */

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "onnxruntime_c_api.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define Q8_VNNI 1
#else
#define Q8_VNNI 0
#endif

#define BLOCK 32
#define API_VERSION 17 /* KernelContext_ParallelFor is in the API since 1.17 */

static const OrtApi *ort;
static long chunk_outputs = 64;
static int use_scalar = 0;

typedef struct {
  int64_t k, n;
  const void *source;  /* the B input the copy was made from */
  uint8_t *copy;       /* B then the scales, on transparent huge pages: packed, or copied (EDGELM_Q8_COPY=1) */
} Q8Kernel;

static int copy_weights = 0, pack_weights = 1;
static pthread_mutex_t copy_lock = PTHREAD_MUTEX_INITIALIZER; /* two runs of one session may reach a kernel at once */

/* One call's work, shared by the parallel tasks. Per row m of A and pair p of blocks (2p, 2p+1):
   codes[m][K]: int8 activations; start[m][p]: 16 int32, lane 0 = -128 * sum(codes of block 2p), lane 8 the
   same for block 2p+1, the rest 0; ascale[m][p]: 16 floats, block 2p's scale in lanes 0-7, 2p+1's in 8-15. */
typedef struct {
  const float *a;
  const uint8_t *w;
  const float *wscale;
  float *y;
  int64_t m, k, n, blocks, pairs;
  int8_t *codes;
  int32_t *start;
  float *ascale;
  int packed; /* w and wscale in groups of 4 outputs (pack, below) */
} Q8Call;

/* The packed layout: outputs in groups of 4 (N padded with zero rows), for group g and block pair p the 4 rows'
   64 bytes one after the other (an odd last block padded with 32 zero bytes), and their scales as 4 pairs of
   floats (0 for a padding block): one sequential stream for 4 outputs that share the activation loads. */
static void pack(const uint8_t *w, const float *s, int64_t k, int64_t n, uint8_t *pw, float *ps) {
  int64_t blocks = k / BLOCK, pairs = (blocks + 1) / 2, groups = (n + 3) / 4;
  memset(pw, 0, (size_t)groups * pairs * 4 * 64);
  memset(ps, 0, sizeof(float) * groups * pairs * 8);
  for (int64_t row = 0; row < n; row++) {
    int64_t g = row / 4, r = row % 4;
    for (int64_t b = 0; b < blocks; b++) {
      int64_t p = b / 2, at = (g * pairs + p) * 4 + r;
      memcpy(pw + at * 64 + (b % 2) * BLOCK, w + row * k + b * BLOCK, BLOCK);
      ps[at * 2 + b % 2] = s[row * blocks + b];
    }
  }
}

/* Rows [first, last) of A quantized (codes, start and ascale, as Q8Call says). */
static void quantize_rows(const Q8Call *c, int64_t first, int64_t last) {
  for (int64_t m = first; m < last; m++) {
    const float *row = c->a + m * c->k;
    int8_t *q = c->codes + m * c->k;
    int32_t *start = c->start + m * c->pairs * 16;
    float *scale = c->ascale + m * c->pairs * 16;
    memset(start, 0, sizeof(int32_t) * 16 * c->pairs);
    memset(scale, 0, sizeof(float) * 16 * c->pairs);
    for (int64_t b = 0; b < c->blocks; b++) {
      const float *x = row + b * BLOCK;
      int32_t sum = 0;
#if Q8_VNNI /* the same products and rounding as the loop below (to nearest even), 32 at a time */
      __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      float s = amax / 127.0f, inverse = amax > 0 ? 127.0f / amax : 0.0f;
      __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(inverse)));
      __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(inverse)));
      _mm_storeu_si128((__m128i *)(q + b * BLOCK), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128((__m128i *)(q + b * BLOCK + 16), _mm512_cvtsepi32_epi8(q1));
      sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
      float amax = 0;
      for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
      float s = amax / 127.0f, inverse = amax > 0 ? 127.0f / amax : 0.0f;
      for (int i = 0; i < BLOCK; i++) {
        int v = (int)nearbyintf(x[i] * inverse);
        q[b * BLOCK + i] = (int8_t)v;
        sum += v;
      }
#endif
      int64_t lane = (b / 2) * 16 + (b % 2) * 8;
      start[lane] = -128 * sum;
      for (int i = 0; i < 8; i++) scale[lane + i] = s;
    }
  }
}

#define QUANTIZE_ROWS 8 /* rows of A per parallel task of quantization */

static void quantize_chunk(void *data, size_t index) {
  const Q8Call *c = data;
  int64_t first = (int64_t)index * QUANTIZE_ROWS;
  quantize_rows(c, first, first + QUANTIZE_ROWS < c->m ? first + QUANTIZE_ROWS : c->m);
}

/* Outputs [first, last) for every row of A, one output at a time: the reference arithmetic. */
static void outputs_scalar(const Q8Call *c, int64_t first, int64_t last) {
  for (int64_t m = 0; m < c->m; m++) {
    const int8_t *q = c->codes + m * c->k;
    const int32_t *start = c->start + m * c->pairs * 16;
    const float *ascale = c->ascale + m * c->pairs * 16;
    for (int64_t n = first; n < last; n++) {
      const uint8_t *w = c->w + n * c->k;
      float sum = 0;
      for (int64_t b = 0; b < c->blocks; b++) {
        int64_t lane = (b / 2) * 16 + (b % 2) * 8;
        int32_t dot = start[lane];
        for (int i = 0; i < BLOCK; i++) dot += (int32_t)w[b * BLOCK + i] * q[b * BLOCK + i];
        sum += (float)dot * ascale[lane] * c->wscale[n * c->blocks + b];
      }
      c->y[m * c->n + n] = sum;
    }
  }
}

#if Q8_VNNI
/* Block 2p's weight scale in lanes 0-7, 2p+1's in lanes 8-15 (only 2p's when `single`). */
static inline __m512 pair_scale(const float *s, int single) {
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m128 two = single ? _mm_load_ss(s) : _mm_castpd_ps(_mm_load_sd((const double *)s));
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two));
}

/* Output n for row m. One weight row at a time: four rows interleaved (sharing the activation loads) ran at a
   quarter of the speed, the hardware prefetcher losing the streams. */
static inline float output_vnni(const Q8Call *c, int64_t m, int64_t n) {
  const int8_t *q = c->codes + m * c->k;
  const __m512i *start = (const __m512i *)(c->start + m * c->pairs * 16);
  const __m512 *ascale = (const __m512 *)(c->ascale + m * c->pairs * 16);
  const uint8_t *w = c->w + n * c->k;
  const float *wscale = c->wscale + n * c->blocks;
  __m512 acc = _mm512_setzero_ps();
  const int64_t full = c->blocks / 2;
  for (int64_t p = 0; p < full; p++) {
    __m512i dot = _mm512_dpbusd_epi32(start[p], _mm512_loadu_si512(w + p * 64), _mm512_loadu_si512(q + p * 64));
    __m512 scale = _mm512_mul_ps(ascale[p], pair_scale(wscale + 2 * p, 0));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
  }
  if (c->blocks % 2) { /* the last block alone: the upper 32 bytes masked to 0, its start and scale lanes are 0 */
    int64_t p = full;
    __m512i dot = _mm512_dpbusd_epi32(start[p], _mm512_maskz_loadu_epi8(0xFFFFFFFFull, w + p * 64),
                                      _mm512_maskz_loadu_epi8(0xFFFFFFFFull, q + p * 64));
    __m512 scale = _mm512_mul_ps(ascale[p], pair_scale(wscale + 2 * p, 1));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

/* Outputs 4g..4g+3 for row m from the packed layout, into out[4]. */
static inline void group_packed(const Q8Call *c, int64_t m, int64_t g, float *out) {
  const int8_t *q = c->codes + m * c->k;
  const __m512i *start = (const __m512i *)(c->start + m * c->pairs * 16);
  const __m512 *ascale = (const __m512 *)(c->ascale + m * c->pairs * 16);
  const uint8_t *w = c->w + g * c->pairs * 256;
  const float *ws = c->wscale + g * c->pairs * 8;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int64_t p = 0; p < c->pairs; p++, w += 256, ws += 8) {
    __m512i a = _mm512_loadu_si512(q + p * 64); /* past K: spare bytes, against zero weights and scales */
    __m512i s0 = _mm512_load_si512(start + p);
    __m512 sa = _mm512_load_ps((const float *)(ascale + p));
#define ROW(r, acc)                                                                          \
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(s0, _mm512_loadu_si512(w + r * 64), a)), \
                        _mm512_mul_ps(sa, pair_scale(ws + 2 * r, 0)), acc)
    ROW(0, acc0);
    ROW(1, acc1);
    ROW(2, acc2);
    ROW(3, acc3);
#undef ROW
  }
  out[0] = _mm512_reduce_add_ps(acc0);
  out[1] = _mm512_reduce_add_ps(acc1);
  out[2] = _mm512_reduce_add_ps(acc2);
  out[3] = _mm512_reduce_add_ps(acc3);
}

/* Outputs 4g..4g+3 for rows m..m+3 (a prompt's), into out[row][4]: each weight load and scale pair serves four
   rows, each activation load four outputs (16 accumulators). */
static inline void group_packed_rows(const Q8Call *c, int64_t m, int64_t g, float out[4][4]) {
  const int8_t *q = c->codes + m * c->k;
  const __m512i *start = (const __m512i *)(c->start + m * c->pairs * 16);
  const __m512 *ascale = (const __m512 *)(c->ascale + m * c->pairs * 16);
  const uint8_t *w = c->w + g * c->pairs * 256;
  const float *ws = c->wscale + g * c->pairs * 8;
  __m512 acc[4][4];
  for (int i = 0; i < 4; i++)
    for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < c->pairs; p++, w += 256, ws += 8) {
    __m512i a[4];
    for (int i = 0; i < 4; i++) a[i] = _mm512_loadu_si512(q + i * c->k + p * 64);
    for (int r = 0; r < 4; r++) {
      __m512i wr = _mm512_loadu_si512(w + r * 64);
      __m512 sw = pair_scale(ws + 2 * r, 0);
      for (int i = 0; i < 4; i++) {
        __m512i dot = _mm512_dpbusd_epi32(_mm512_load_si512(start + i * c->pairs + p), wr, a[i]);
        __m512 scale = _mm512_mul_ps(_mm512_load_ps((const float *)(ascale + i * c->pairs + p)), sw);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[i][r]);
      }
    }
  }
  for (int i = 0; i < 4; i++)
    for (int r = 0; r < 4; r++) out[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

static void outputs_packed(const Q8Call *c, int64_t first, int64_t last) { /* first: a multiple of 4 */
  float out[4][4];
  for (int64_t g = first / 4; g * 4 < last; g++) {
    int64_t m = 0;
    for (; m + 4 <= c->m; m += 4) {
      group_packed_rows(c, m, g, out);
      for (int i = 0; i < 4; i++)
        for (int r = 0; r < 4 && g * 4 + r < c->n; r++) c->y[(m + i) * c->n + g * 4 + r] = out[i][r];
    }
    for (; m < c->m; m++) {
      group_packed(c, m, g, out[0]);
      for (int r = 0; r < 4 && g * 4 + r < c->n; r++) c->y[m * c->n + g * 4 + r] = out[0][r];
    }
  }
}

static void outputs_fast(const Q8Call *c, int64_t first, int64_t last) {
  for (int64_t n = first; n < last; n++)
    for (int64_t m = 0; m < c->m; m++) c->y[m * c->n + n] = output_vnni(c, m, n);
}
#endif

static void run_chunk(void *data, size_t index) {
  const Q8Call *c = data;
  int64_t first = (int64_t)index * chunk_outputs, last = first + chunk_outputs;
  if (last > c->n) last = c->n;
#if Q8_VNNI
  if (c->packed) {
    outputs_packed(c, first, last);
    return;
  }
  if (!use_scalar) {
    outputs_fast(c, first, last);
    return;
  }
#endif
  outputs_scalar(c, first, last);
}

/* EDGELM_Q8_THREADS=T: the library's own T - 1 worker threads share each call's chunks with the caller instead
   of onnxruntime's pool (the session then runs with 1 intra-op thread). Between calls a worker spins, then
   yields; one call at a time (a mutex), any session. */
static int own_threads = 0;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long pool_generation;
static atomic_int pool_next, pool_done;
static const Q8Call *pool_call;
static int pool_chunks;
static atomic_int pool_stop;
static pthread_t pool_workers[64];

static void pool_share(void) {
  for (int i; (i = atomic_fetch_add(&pool_next, 1)) < pool_chunks;) run_chunk((void *)pool_call, (size_t)i);
}

static void *pool_worker(void *unused) {
  (void)unused;
  long seen = 0;
  for (;;) {
    long spins = 0, now;
    while ((now = atomic_load_explicit(&pool_generation, memory_order_acquire)) == seen) {
      if (atomic_load_explicit(&pool_stop, memory_order_relaxed)) return NULL;
      if (++spins < 200000) {
#if Q8_VNNI
        _mm_pause();
#endif
      } else {
        sched_yield();
      }
    }
    seen = now;
    pool_share();
    atomic_fetch_add_explicit(&pool_done, 1, memory_order_release);
  }
  return NULL;
}

/* The workers end before the library is unloaded: their code goes with it. */
__attribute__((destructor)) static void pool_end(void) {
  atomic_store(&pool_stop, 1);
  for (int i = 1; i < own_threads; i++) pthread_join(pool_workers[i], NULL);
}

static void pool_run(const Q8Call *c, int chunks) {
  pthread_mutex_lock(&pool_lock);
  pool_call = c;
  pool_chunks = chunks;
  atomic_store(&pool_next, 0);
  atomic_store(&pool_done, 0);
  atomic_fetch_add_explicit(&pool_generation, 1, memory_order_release);
  pool_share();
  while (atomic_load_explicit(&pool_done, memory_order_acquire) < own_threads - 1) {
#if Q8_VNNI
    _mm_pause();
#endif
  }
  pthread_mutex_unlock(&pool_lock);
}

static OrtStatus *fail(const char *message) { return ort->CreateStatus(ORT_INVALID_ARGUMENT, message); }

#define CHECK(call)                         \
  do {                                      \
    OrtStatus *status_ = (call);            \
    if (status_) return status_;            \
  } while (0)

static OrtStatus *shape_of(const OrtValue *value, int64_t *dims, size_t *count, size_t capacity) {
  OrtTensorTypeAndShapeInfo *info;
  CHECK(ort->GetTensorTypeAndShape(value, &info));
  OrtStatus *status = ort->GetDimensionsCount(info, count);
  if (!status && *count > capacity) status = fail("edgelm.Q8MatMul: an input has too many dimensions");
  if (!status) status = ort->GetDimensions(info, dims, *count);
  ort->ReleaseTensorTypeAndShapeInfo(info);
  return status;
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *context) {
  const Q8Kernel *self = kernel;
  const OrtValue *a_value, *w_value, *s_value;
  CHECK(ort->KernelContext_GetInput(context, 0, &a_value));
  CHECK(ort->KernelContext_GetInput(context, 1, &w_value));
  CHECK(ort->KernelContext_GetInput(context, 2, &s_value));
  int64_t dims[8], wdims[8];
  size_t rank, wrank;
  CHECK(shape_of(a_value, dims, &rank, 8));
  CHECK(shape_of(w_value, wdims, &wrank, 8));
  if (rank < 1 || dims[rank - 1] != self->k) return fail("edgelm.Q8MatMul: A's last dimension is not K");
  if (wrank != 3 || wdims[0] != self->n || wdims[1] * wdims[2] != self->k || wdims[2] != BLOCK)
    return fail("edgelm.Q8MatMul: B is not [N, K/32, 32]");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < rank; i++) rows *= dims[i];
  dims[rank - 1] = self->n;
  OrtValue *y_value;
  CHECK(ort->KernelContext_GetOutput(context, 0, dims, rank, &y_value));
  void *a, *w, *s, *y;
  CHECK(ort->GetTensorMutableData((OrtValue *)a_value, &a));
  CHECK(ort->GetTensorMutableData((OrtValue *)w_value, &w));
  CHECK(ort->GetTensorMutableData((OrtValue *)s_value, &s));
  CHECK(ort->GetTensorMutableData(y_value, &y));
  if (rows == 0) return NULL;
  int packed = Q8_VNNI && pack_weights && !use_scalar;
  if (copy_weights || packed) {
    Q8Kernel *mutable = (Q8Kernel *)self;
    size_t wbytes = (size_t)self->n * self->k, sbytes = (size_t)self->n * (self->k / BLOCK) * sizeof(float);
    if (packed) {
      int64_t groups = (self->n + 3) / 4, pairs = (self->k / BLOCK + 1) / 2;
      wbytes = (size_t)groups * pairs * 256;
      sbytes = (size_t)groups * pairs * 8 * sizeof(float);
    }
    pthread_mutex_lock(&copy_lock);
    if (mutable->source != w) {
      size_t total = (wbytes + sbytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
      free(mutable->copy);
      mutable->copy = aligned_alloc(2u << 20, total);
      if (!mutable->copy) {
        mutable->source = NULL;
        pthread_mutex_unlock(&copy_lock);
        return ort->CreateStatus(ORT_FAIL, "edgelm.Q8MatMul: out of memory");
      }
      madvise(mutable->copy, total, MADV_HUGEPAGE);
      if (packed) {
        pack(w, s, self->k, self->n, mutable->copy, (float *)(mutable->copy + wbytes));
      } else {
        memcpy(mutable->copy, w, wbytes);
        memcpy(mutable->copy + wbytes, s, sbytes);
      }
      mutable->source = w;
    }
    pthread_mutex_unlock(&copy_lock);
    w = mutable->copy;
    s = mutable->copy + wbytes;
  }

  Q8Call c = {a, w, s, y, rows, self->k, self->n, self->k / BLOCK, (self->k / BLOCK + 1) / 2, NULL, NULL, NULL, packed};
  size_t pair_bytes = (size_t)rows * c.pairs * 64;
  char *scratch = aligned_alloc(64, 2 * pair_bytes + (((size_t)rows * c.k + 64 + 63) / 64) * 64);
  if (!scratch) return ort->CreateStatus(ORT_FAIL, "edgelm.Q8MatMul: out of memory");
  c.start = (int32_t *)scratch;
  c.ascale = (float *)(scratch + pair_bytes);
  c.codes = (int8_t *)(scratch + 2 * pair_bytes); /* 64 spare bytes: an odd last block's load reads past K */
  OrtStatus *status = NULL;
  size_t row_chunks = (size_t)((rows + QUANTIZE_ROWS - 1) / QUANTIZE_ROWS);
  if (row_chunks == 1 || own_threads > 1)
    quantize_rows(&c, 0, rows);
  else
    status = ort->KernelContext_ParallelFor(context, quantize_chunk, row_chunks, 0, &c);
  size_t chunks = (size_t)((c.n + chunk_outputs - 1) / chunk_outputs);
  if (status) {
    free(scratch);
    return status;
  }
  if (own_threads > 1)
    pool_run(&c, (int)chunks);
  else
    status = ort->KernelContext_ParallelFor(context, run_chunk, chunks, 0, &c);
  free(scratch);
  return status;
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                             void **kernel) {
  (void)op;
  (void)api;
  int64_t k, n, bits, block;
  CHECK(ort->KernelInfoGetAttribute_int64(info, "K", &k));
  CHECK(ort->KernelInfoGetAttribute_int64(info, "N", &n));
  CHECK(ort->KernelInfoGetAttribute_int64(info, "bits", &bits));
  CHECK(ort->KernelInfoGetAttribute_int64(info, "block_size", &block));
  if (bits != 8 || block != BLOCK || k <= 0 || n <= 0 || k % BLOCK)
    return fail("edgelm.Q8MatMul takes bits 8, block_size 32 and K a multiple of 32");
  Q8Kernel *self = malloc(sizeof *self);
  if (!self) return ort->CreateStatus(ORT_FAIL, "edgelm.Q8MatMul: out of memory");
  self->k = k;
  self->source = NULL;
  self->copy = NULL;
  self->n = n;
  *kernel = self;
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *kernel) {
  free(((Q8Kernel *)kernel)->copy);
  free(kernel);
}
static const char *ORT_API_CALL op_name(const OrtCustomOp *op) { (void)op; return "Q8MatMul"; }
static const char *ORT_API_CALL op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static size_t ORT_API_CALL input_count(const OrtCustomOp *op) { (void)op; return 3; }
static size_t ORT_API_CALL output_count(const OrtCustomOp *op) { (void)op; return 1; }
static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp *op, size_t i) {
  (void)op;
  (void)i;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp *op, size_t i) {
  (void)op;
  (void)i;
  return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType ORT_API_CALL memory_type(const OrtCustomOp *op, size_t i) {
  (void)op;
  (void)i;
  return OrtMemTypeDefault;
}
static int ORT_API_CALL one(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL zero(const OrtCustomOp *op) { (void)op; return 0; }
static int ORT_API_CALL last_version(const OrtCustomOp *op) { (void)op; return INT_MAX; }

static OrtCustomOp q8_matmul;

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  ort = base->GetApi(API_VERSION);
  if (!ort) return NULL; /* an onnxruntime older than 1.17: nothing registered, its graphs fail to load */
#if Q8_VNNI
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw"))
    return ort->CreateStatus(ORT_FAIL, "libedgelm_q8 was built for AVX-512 VNNI, which this CPU lacks");
#endif
  const char *chunk = getenv("EDGELM_Q8_CHUNK"), *scalar = getenv("EDGELM_Q8_SCALAR");
  if (chunk && atol(chunk) > 0) chunk_outputs = (atol(chunk) + 3) / 4 * 4;
  use_scalar = scalar && strcmp(scalar, "1") == 0;
  copy_weights = getenv("EDGELM_Q8_COPY") && strcmp(getenv("EDGELM_Q8_COPY"), "1") == 0;
  pack_weights = !(getenv("EDGELM_Q8_PACK") && strcmp(getenv("EDGELM_Q8_PACK"), "0") == 0);
  const char *threads = getenv("EDGELM_Q8_THREADS");
  if (threads && atoi(threads) > 1 && own_threads == 0) { /* started once, by the first registration */
    own_threads = atoi(threads) > 64 ? 64 : atoi(threads);
    for (int i = 1; i < own_threads; i++)
      if (pthread_create(&pool_workers[i], NULL, pool_worker, NULL)) {
        own_threads = i;
        return ort->CreateStatus(ORT_FAIL, "edgelm.Q8MatMul: no worker thread");
      }
  }

  memset(&q8_matmul, 0, sizeof q8_matmul);
  q8_matmul.version = API_VERSION;
  q8_matmul.GetName = op_name;
  q8_matmul.GetExecutionProviderType = op_provider;
  q8_matmul.GetInputType = input_type;
  q8_matmul.GetInputTypeCount = input_count;
  q8_matmul.GetOutputType = output_type;
  q8_matmul.GetOutputTypeCount = output_count;
  q8_matmul.GetInputCharacteristic = required;
  q8_matmul.GetOutputCharacteristic = required;
  q8_matmul.GetInputMemoryType = memory_type;
  q8_matmul.GetVariadicInputMinArity = one;
  q8_matmul.GetVariadicInputHomogeneity = zero;
  q8_matmul.GetVariadicOutputMinArity = one;
  q8_matmul.GetVariadicOutputHomogeneity = zero;
  q8_matmul.CreateKernelV2 = create_kernel;
  q8_matmul.KernelComputeV2 = compute;
  q8_matmul.KernelDestroy = destroy_kernel;
  q8_matmul.GetStartVersion = one;
  q8_matmul.GetEndVersion = last_version;

  OrtCustomOpDomain *domain; /* lives as long as the process: sessions made from these options refer to it */
  CHECK(ort->CreateCustomOpDomain("edgelm", &domain));
  CHECK(ort->CustomOpDomain_Add(domain, &q8_matmul));
  return ort->AddCustomOpDomain(options, domain);
}
