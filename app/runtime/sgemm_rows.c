/*
 * cblas_sgemm for MLX's Linux CPU wheel, which otherwise links the netlib reference BLAS.
 *
 * Short products (up to ROW_STABLE_MAX rows: decode steps and verify forwards) run a small
 * kernel of our own that computes every output element with the same dot-product code,
 * whatever the number of rows. That is what keeps a k-token verify forward byte-identical to k
 * single-token decode steps: OpenBLAS picks different kernels (different summation orders) for
 * 1, 2-4 and 5+ rows. The kernel streams each weight row once for all rows of the product, so
 * k rows cost about what one row costs. Longer products (prefill) go to OpenBLAS, which the
 * scipy-openblas32 wheel exports under a scipy_ prefix.
 */
#include <stddef.h>
#include <stdlib.h>

typedef int blasint;
enum { ROW_MAJOR = 101, NO_TRANS = 111 };
#ifndef ROW_STABLE_MAX
#define ROW_STABLE_MAX 32
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

extern void scipy_cblas_sgemm(int, int, int, blasint, blasint, blasint, float, const float *, blasint,
                              const float *, blasint, float, float *, blasint);

static inline v16 load16(const float *p) {
  v16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

/* A fixed reduction tree over the 16 lanes (halves, then quarters, then pairs), then the scalar
   tail of the dot product. */
static inline float finish(v16 acc, const float *x, const float *y, blasint from, blasint k) {
  const v8 half = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 quarter = __builtin_shufflevector(half, half, 0, 1, 2, 3) + __builtin_shufflevector(half, half, 4, 5, 6, 7);
  float s = (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
  for (blasint p = from; p < k; p++) s += x[p] * y[p];
  return s;
}

/* Eight dot products sharing the loads of x: out[c] = x . y[c]. Each output sees the same
   sequence of operations (16-lane partial sums in order of p, then `finish`) whatever block it
   is computed in, so blocking never changes a result. */
__attribute__((noinline)) static void dot8(const float *x, const float *const y[8], blasint k, float out[8]) {
  v16 a[8];
  __builtin_memset(a, 0, sizeof a);
  blasint p = 0;
  for (; p + 16 <= k; p += 16) {
    const v16 xv = load16(x + p);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) a[c] += xv * load16(y[c] + p);
  }
#pragma GCC unroll 8
  for (int c = 0; c < 8; c++) out[c] = finish(a[c], x, y[c], p, k);
}

/* C[i, :] = alpha * sum_p A[i, p] * B[p, :] + beta * C[i, :] with B not transposed. */
__attribute__((noinline)) static void axpy_rows(const float *a_row, blasint a_stride, const float *b, blasint ldb,
                                                float *c_row, blasint n, blasint k, float alpha, float beta) {
  for (blasint j = 0; j < n; j++) c_row[j] = beta == 0.0f ? 0.0f : beta * c_row[j];
  for (blasint p = 0; p < k; p++) {
    const float scale = alpha * a_row[(size_t)p * a_stride];
    const float *b_row = b + (size_t)p * ldb;
    for (blasint j = 0; j < n; j++) c_row[j] += scale * b_row[j];
  }
}

static void row_stable_sgemm(int trans_a, int trans_b, blasint m, blasint n, blasint k, float alpha,
                             const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,
                             blasint ldc) {
  /* Element (i, p) of op(A) lives at a[i * row_step + p * col_step]. */
  const blasint row_step = trans_a == NO_TRANS ? lda : 1;
  const blasint col_step = trans_a == NO_TRANS ? 1 : lda;
  if (trans_b == NO_TRANS) {
    for (blasint i = 0; i < m; i++)
      axpy_rows(a + (size_t)i * row_step, col_step, b, ldb, c + (size_t)i * ldc, n, k, alpha, beta);
    return;
  }
  /* Rows of op(A) must be contiguous for dot(): gather them when A is transposed. */
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
  /* op(B) column j is row j of B. Columns go eight at a time (the last block repeats its final
     column as padding), so each weight row is read once for all m rows of the product. */
  for (blasint j = 0; j < n; j += 8) {
    const float *cols[8];
    for (int q = 0; q < 8; q++) cols[q] = b + (size_t)(j + q < n ? j + q : n - 1) * ldb;
    for (blasint i = 0; i < m; i++) {
      float value[8];
      dot8(rows + (size_t)i * stride, cols, k, value);
      for (int q = 0; q < 8 && j + q < n; q++) {
        float *out = c + (size_t)i * ldc + j + q;
        *out = beta == 0.0f ? alpha * value[q] : alpha * value[q] + beta * *out;
      }
    }
  }
  free(gathered);
}

/* How many rows still take the kernel: a batched forward (app/loading/batched.py) flattens rows
   only up to this many tokens. */
int mlxcel_row_stable_max(void) { return ROW_STABLE_MAX; }

void cblas_sgemm(int order, int trans_a, int trans_b, blasint m, blasint n, blasint k, float alpha,
                 const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,
                 blasint ldc) {
  if (order == ROW_MAJOR && m > 0 && m <= ROW_STABLE_MAX) {
    row_stable_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
