/*
 * MLX's Linux CPU wheel links the netlib reference BLAS (~5 GFLOP/s here). This shim gives MLX a
 * cblas_sgemm that forwards to OpenBLAS (scipy-openblas32 exports it under a scipy_ prefix).
 *
 * It also pads products with fewer than MIN_ROWS rows up to MIN_ROWS: OpenBLAS picks a different
 * kernel (a different summation order) for very short left operands, so a one-token decode step
 * and a k-token verify forward would disagree in the last bits. Padding makes every width run the
 * same kernel, which keeps speculative verification byte-exact against single-token decoding.
 */
#include <stdlib.h>
#include <string.h>

typedef int blasint;
enum { ROW_MAJOR = 101, NO_TRANS = 111 };
enum { MIN_ROWS = 8 };

extern void scipy_cblas_sgemm(int, int, int, blasint, blasint, blasint, float, const float *, blasint,
                              const float *, blasint, float, float *, blasint);

void cblas_sgemm(int order, int trans_a, int trans_b, blasint m, blasint n, blasint k, float alpha,
                 const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,
                 blasint ldc) {
  float *pa = NULL, *pc = NULL;
  if (order == ROW_MAJOR && m > 0 && m < MIN_ROWS) {
    pa = calloc((size_t)MIN_ROWS * k, sizeof(float));
    pc = calloc((size_t)MIN_ROWS * n, sizeof(float));
  }
  if (pa == NULL || pc == NULL) {
    free(pa);
    free(pc);
    scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  for (blasint i = 0; i < m; i++) {
    if (trans_a == NO_TRANS) {
      memcpy(pa + (size_t)i * k, a + (size_t)i * lda, (size_t)k * sizeof(float));
    } else {
      for (blasint j = 0; j < k; j++) pa[(size_t)i * k + j] = a[(size_t)j * lda + i];
    }
    if (beta != 0.0f) memcpy(pc + (size_t)i * n, c + (size_t)i * ldc, (size_t)n * sizeof(float));
  }
  scipy_cblas_sgemm(order, NO_TRANS, trans_b, MIN_ROWS, n, k, alpha, pa, k, b, ldb, beta, pc, n);
  for (blasint i = 0; i < m; i++) memcpy(c + (size_t)i * ldc, pc + (size_t)i * n, (size_t)n * sizeof(float));
  free(pa);
  free(pc);
}
