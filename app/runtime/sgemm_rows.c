/*
 * cblas_sgemm for MLX's Linux CPU wheel, which otherwise links the netlib reference BLAS.
 *
 * Products of up to ROW_STABLE_MAX rows (decode steps, verify forwards, the flattened rows of a
 * batched forward, prefill chunks) run a kernel of our own that computes every output element
 * with the same sequence of operations whatever the number of rows and wherever the element
 * falls in a tile. That is what keeps a k-token verify forward byte-identical to k single-token
 * decode steps, and a row of a batched forward independent of its batch-mates: OpenBLAS picks
 * different kernels (different summation orders) for 1, 2-4 and 5+ rows. The kernel is register
 * blocked (tiles of outputs held in registers, sharing their loads of A and B), within reach of
 * OpenBLAS from a few rows on (docs/benchmarks.md, "Row-stable matrix kernel"). Longer products go to OpenBLAS,
 * which the scipy-openblas32 wheel exports under a scipy_ prefix.
 *
 * Every multiply-add is fused: explicitly (fmaf) in scalar code, by contraction of `a += x * y`
 * in vector code (blas.py builds with -ffp-contract=fast; the bits were checked against the
 * kernel this one replaced).
 */
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

typedef int blasint;
enum { ROW_MAJOR = 101, NO_TRANS = 111 };
/* 1024: every tick the scheduler can make (server.max_batch_tokens defaults to 1024) flattens
   into one exact forward, and a prefill chunk (PREFILL_CHUNK = 128 rows) is row-stable too, for
   about a tenth more prefill time than OpenBLAS would take (measured, docs/benchmarks.md). */
#ifndef ROW_STABLE_MAX
#define ROW_STABLE_MAX 1024
#endif

typedef float v16 __attribute__((vector_size(64)));

extern void scipy_cblas_sgemm(int, int, int, blasint, blasint, blasint, float, const float *, blasint,
                              const float *, blasint, float, float *, blasint);

static inline v16 load16(const float *p) {
  v16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

/* The tail of a dot product past its last whole 16 elements, added to its reduced partial sums. */
static inline float tail(float s, const float *x, const float *y, blasint from, blasint k) {
  for (blasint p = from; p < k; p++) s = __builtin_fmaf(x[p], y[p], s);
  return s;
}

/* Lane e of the result reduces acc[e] by one fixed tree: lanes l + l+8, then l + l+4, then
   (0 + 2) + (1 + 3). The 16 accumulators are reduced side by side (each shuffle pairs two of
   them), which costs a few vector operations per output instead of a scalar reduction each,
   and gives each output exactly the sums a reduction of its accumulator alone would. */
static inline v16 reduce16(const v16 acc[16]) {
  v16 half[8], quarter[4], pair[2];
#pragma GCC unroll 8
  for (int e = 0; e < 8; e++)
    half[e] = __builtin_shufflevector(acc[2 * e], acc[2 * e + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                      22, 23) +
              __builtin_shufflevector(acc[2 * e], acc[2 * e + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                      29, 30, 31);
#pragma GCC unroll 4
  for (int e = 0; e < 4; e++)
    quarter[e] = __builtin_shufflevector(half[2 * e], half[2 * e + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                                         25, 26, 27) +
                 __builtin_shufflevector(half[2 * e], half[2 * e + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                         29, 30, 31);
#pragma GCC unroll 2
  for (int e = 0; e < 2; e++)
    pair[e] = __builtin_shufflevector(quarter[2 * e], quarter[2 * e + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21,
                                      24, 25, 28, 29) +
              __builtin_shufflevector(quarter[2 * e], quarter[2 * e + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23,
                                      26, 27, 30, 31);
  return __builtin_shufflevector(pair[0], pair[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(pair[0], pair[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* A tile of 16 dot products, R rows x 16/R columns: lane r * 16/R + c is x[r] . y[c]. Every
   output is one 16-lane accumulator fed in order of p (the loads of a row and of a column are
   shared by the whole tile), then `reduce16` and `tail`: the same operations whatever R, the
   tile's place, or the size of the product, so tiling never changes a result. */
static inline __attribute__((always_inline)) v16 tile(const int R, const float *const x[], const float *const y[],
                                                     blasint k) {
  const int C = 16 / R;
  v16 acc[16];
#pragma GCC unroll 16
  for (int e = 0; e < 16; e++) acc[e] = (v16){0};
  blasint p = 0;
  for (; p + 16 <= k; p += 16) {
    v16 xv[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) xv[r] = load16(x[r] + p);
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
      const v16 yv = load16(y[c] + p);
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) acc[r * C + c] += xv[r] * yv;
    }
  }
  v16 sums = reduce16(acc);
  if (p < k)
    for (int e = 0; e < 16; e++) sums[e] = tail(sums[e], x[e / C], y[e % C], p, k);
  return sums;
}

/* One instance per tile shape: 4 x 4 for most rows, 2 x 8 and 1 x 16 for the last m % 4 (a
   single decode row shares its loads of x over 16 columns). */
__attribute__((noinline)) static v16 tile4(const float *const x[], const float *const y[], blasint k) {
  return tile(4, x, y, k);
}
__attribute__((noinline)) static v16 tile2(const float *const x[], const float *const y[], blasint k) {
  return tile(2, x, y, k);
}
__attribute__((noinline)) static v16 tile1(const float *const x[], const float *const y[], blasint k) {
  return tile(1, x, y, k);
}

/* B not transposed: C[i, j] = beta * C[i, j] (or 0), then += (alpha * A[i, p]) * B[p, j] in order
   of p, one multiply-add per step. A tile of R rows x V vectors of 16 columns keeps its part of C
   in registers over the steps from..to (each B[p, columns] load serves all R rows); spilling it to
   C between step ranges keeps every element's sequence, as does the scalar path for the last
   n % 16 columns. Element (r, p) of op(A) lives at a[r * row_step + p * col_step]. */
static inline __attribute__((always_inline)) void axpy_tile(const int R, const int V, const float *a,
                                                            blasint row_step, blasint col_step, float alpha,
                                                            const float *b, blasint ldb, float *c, blasint ldc,
                                                            blasint from, blasint to) {
  v16 acc[4][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) acc[r][v] = load16(c + (size_t)r * ldc + 16 * v);
  for (blasint p = from; p < to; p++) {
    const float *b_row = b + (size_t)p * ldb;
    v16 bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) bv[v] = load16(b_row + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const float scale = alpha * a[(size_t)r * row_step + (size_t)p * col_step];
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) acc[r][v] += scale * bv[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) __builtin_memcpy(c + (size_t)r * ldc + 16 * v, &acc[r][v], sizeof(v16));
}

#define AXPY_TILE(R, V)                                                                                       \
  __attribute__((noinline)) static void axpy_tile##R##x##V(const float *a, blasint row_step, blasint col_step, \
                                                           float alpha, const float *b, blasint ldb, float *c, \
                                                           blasint ldc, blasint from, blasint to) {            \
    axpy_tile(R, V, a, row_step, col_step, alpha, b, ldb, c, ldc, from, to);                                   \
  }
AXPY_TILE(4, 4)
AXPY_TILE(1, 4)
AXPY_TILE(4, 1)
AXPY_TILE(1, 1)

/* Steps of p per pass over a block of columns: 128 rows of a 64-column block of B (32 KiB) stay
   in the L1 cache while every row tile uses them. */
enum { AXPY_STEPS = 128 };

static void axpy_rows(blasint m, blasint n, blasint k, float alpha, const float *a, blasint row_step,
                      blasint col_step, const float *b, blasint ldb, float beta, float *c, blasint ldc) {
  for (blasint i = 0; i < m; i++)
    for (blasint j = 0; j < n; j++) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
  for (blasint j = 0; j + 16 <= n;) {
    const int wide = j + 64 <= n;
    for (blasint from = 0; from < k; from += AXPY_STEPS) {
      const blasint to = k - from < AXPY_STEPS ? k : from + AXPY_STEPS;
      for (blasint i = 0; i < m;) {
        const int four = i + 4 <= m;
        (wide ? (four ? axpy_tile4x4 : axpy_tile1x4) : (four ? axpy_tile4x1 : axpy_tile1x1))(
            a + (size_t)i * row_step, row_step, col_step, alpha, b + j, ldb, c + (size_t)i * ldc + j, ldc, from, to);
        i += four ? 4 : 1;
      }
    }
    j += wide ? 64 : 16;
  }
  for (blasint i = 0; i < m; i++)
    for (blasint j = n - n % 16; j < n; j++) {
      float acc = c[(size_t)i * ldc + j];
      for (blasint p = 0; p < k; p++)
        acc = __builtin_fmaf(alpha * a[(size_t)i * row_step + (size_t)p * col_step], b[(size_t)p * ldb + j], acc);
      c[(size_t)i * ldc + j] = acc;
    }
}

/* Row-major only; exported so that ops/bench/batched_forward.py can time it against OpenBLAS at
   any row count. */
void mlxcel_row_stable_sgemm(int trans_a, int trans_b, blasint m, blasint n, blasint k, float alpha,
                             const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,
                             blasint ldc) {
  /* Element (i, p) of op(A) lives at a[i * row_step + p * col_step]. */
  const blasint row_step = trans_a == NO_TRANS ? lda : 1;
  const blasint col_step = trans_a == NO_TRANS ? 1 : lda;
  if (trans_b == NO_TRANS) {
    axpy_rows(m, n, k, alpha, a, row_step, col_step, b, ldb, beta, c, ldc);
    return;
  }
  /* Rows of op(A) must be contiguous for `tile`: gather them when A is transposed. */
  float *gathered = NULL;
  const float *rows = a;
  blasint stride = lda;
  if (trans_a != NO_TRANS) {
    gathered = malloc((size_t)m * (size_t)k * sizeof(float));
    for (blasint i = 0; i < m; i++)
      for (blasint p = 0; p < k; p++) gathered[(size_t)i * k + p] = a[(size_t)i * row_step + (size_t)p * col_step];
    rows = gathered;
    stride = k;
  }
  /* op(B) column j is row j of B. Columns go 16 at a time (the last block repeats its final
     column as padding), so each weight row is read from memory once for all m rows of the
     product; within a block, rows go 4 at a time, each 4 x 4 tile reusing the block's columns
     from the L1 cache. */
  for (blasint j = 0; j < n; j += 16) {
    const float *cols[16];
    for (int q = 0; q < 16; q++) cols[q] = b + (size_t)(j + q < n ? j + q : n - 1) * ldb;
    for (blasint i = 0; i < m;) {
      const int r = m - i >= 4 ? 4 : m - i >= 2 ? 2 : 1, per_tile = 16 / r;
      const float *x[4];
      for (int t = 0; t < r; t++) x[t] = rows + (size_t)(i + t) * stride;
      for (int q0 = 0; q0 < 16; q0 += per_tile) {
        const v16 value = (r == 4 ? tile4 : r == 2 ? tile2 : tile1)(x, cols + q0, k);
        if (beta == 0.0f && j + 16 <= n) {  /* the usual case, a whole tile: store its rows */
          const v16 scaled = alpha * value;
          for (int t = 0; t < r; t++)
            __builtin_memcpy(c + (size_t)(i + t) * ldc + j + q0, (const float *)&scaled + t * per_tile,
                             per_tile * sizeof(float));
          continue;
        }
        for (int e = 0; e < 16; e++) {
          const blasint col = j + q0 + e % per_tile;
          if (col >= n) continue;
          float *out = c + (size_t)(i + e / per_tile) * ldc + col;
          *out = beta == 0.0f ? alpha * value[e] : __builtin_fmaf(alpha, value[e], beta * *out);
        }
      }
      i += r;
    }
  }
  free(gathered);
}

/* How many rows still take the kernel: a batched forward (app/execution/forward.py) flattens rows
   only up to this many tokens. */
int mlxcel_row_stable_max(void) { return ROW_STABLE_MAX; }

/* The seconds products spend in the kernel while timing is on (ops/bench/tick.py reports its
   share of a tick): one clock read before and after each product, nothing while off. MLX's CPU
   stream runs every product on one thread. */
static int timing;
static double timed_seconds;

void mlxcel_time_products(int on) {
  timing = on;
  timed_seconds = 0.0;
}

double mlxcel_product_seconds(void) { return timed_seconds; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void cblas_sgemm(int order, int trans_a, int trans_b, blasint m, blasint n, blasint k, float alpha,
                 const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,
                 blasint ldc) {
  if (order == ROW_MAJOR && m > 0 && m <= ROW_STABLE_MAX) {
    const double started = timing ? now() : 0.0;
    mlxcel_row_stable_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (timing) timed_seconds += now() - started;
    return;
  }
  scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
