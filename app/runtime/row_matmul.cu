// Matrix products whose every row is reduced the same way whatever the number of rows.
//
// Read once by app/execution/row_invariant.py and handed to `mx.fast.cuda_kernel` as the header of
// the product kernels, whose bodies are one call each. One warp per output column n: lane l takes
// the 16-byte chunks l, l + 32, ... of the weight row (8 values each), every input row m keeps its
// own float sum over them in that fixed order, then the warp reduces each row by butterfly. So
// row m's output is the same for one row as for MAX_ROWS (and for any MAX_ROWS), and a product of
// several layers' weights side by side (q/k/v, gate/up) gives each layer's columns the bits of its
// own product. Half-precision values are widened by bit operations, in registers; affine 4- and
// 8-bit weights are widened as `scale * q + bias` of their group.

namespace mlxcel {

template <bool BF16>
__device__ __forceinline__ void widen(const uint4& pack, float (&out)[8]) {
  const unsigned int words[4] = {pack.x, pack.y, pack.z, pack.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (BF16) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    } else {
      out[2 * i] = __half2float(__ushort_as_half((unsigned short)(words[i] & 0xffffu)));
      out[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(words[i] >> 16)));
    }
  }
}

// Every input row m adds chunk c's 8 widened weights `wf` against its own 8 values, in order.
template <bool BF16, int MAX_ROWS>
__device__ __forceinline__ void accumulate(const uint4* xs, int rows, int chunks, int c, const float (&wf)[8],
                                           float (&acc)[MAX_ROWS]) {
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < rows) {
      float xf[8];
      widen<BF16>(xs[(size_t)m * chunks + c], xf);
      float sum = acc[m];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sum = fmaf(wf[e], xf[e], sum);
      }
      acc[m] = sum;
    }
  }
}

// Each row's sum reduced over the warp; lane 0 stores column n of row first + m in the output
// that holds it (the columns [0, split1) go to out0, [split1, split2) to out1, the rest to out2).
template <typename T, int MAX_ROWS>
__device__ __forceinline__ void store(float (&acc)[MAX_ROWS], int first, int rows, int lane, int n, int columns,
                                      T* out0, T* out1, T* out2, int split1, int split2) {
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < rows) {
      float sum = acc[m];
      for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_xor_sync(0xffffffff, sum, offset);
      }
      if (lane == 0) {
        const size_t row = (size_t)first + m;
        if (n < split1) {
          out0[row * split1 + n] = static_cast<T>(sum);
        } else if (n < split2) {
          out1[row * (split2 - split1) + n - split1] = static_cast<T>(sum);
        } else {
          out2[row * (columns - split2) + n - split2] = static_cast<T>(sum);
        }
      }
    }
  }
}

// The walk both products share: this warp's column n for the MAX_ROWS rows of x that block row
// blockIdx.y takes (a product of many rows is one launch, MAX_ROWS rows to a block, each block
// computing its rows exactly as a launch of those rows alone would), every row's sum over the
// chunks of K in order (chunk c to lane c mod 32), `weights(n, c, wf)` widening chunk c of column
// n's weights.
template <typename T, bool BF16, int MAX_ROWS, int COLUMNS_PER_BLOCK, int DEPTH, typename Weights>
__device__ __forceinline__ void walk(const T* x, int all_rows, int columns, T* out0, T* out1, T* out2, int split1,
                                     int split2, Weights weights) {
  constexpr int chunks = DEPTH / 8;  // a compile-time stride: the rows' addresses cost no registers
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * COLUMNS_PER_BLOCK + threadIdx.x / 32;
  const int first = blockIdx.y * MAX_ROWS;
  const int rows = min(MAX_ROWS, all_rows - first);
  if (n >= columns) {
    return;
  }
  const uint4* xs = reinterpret_cast<const uint4*>(x + (size_t)first * DEPTH);
  float acc[MAX_ROWS];
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    acc[m] = 0.0f;
  }
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    float wf[8];
    weights(n, c, wf);
    accumulate<BF16, MAX_ROWS>(xs, rows, chunks, c, wf, acc);
  }
  store<T, MAX_ROWS>(acc, first, rows, lane, n, columns, out0, out1, out2, split1, split2);
}

// x `[rows, DEPTH]` times w `[columns, DEPTH]` (half precision).
template <typename T, bool BF16, int MAX_ROWS, int COLUMNS_PER_BLOCK, int DEPTH>
__device__ void row_matmul(const T* x, int rows, const T* w, int columns, T* out0, T* out1, T* out2, int split1,
                           int split2) {
  constexpr int chunks = DEPTH / 8;
  const uint4* ws = reinterpret_cast<const uint4*>(w);
  walk<T, BF16, MAX_ROWS, COLUMNS_PER_BLOCK, DEPTH>(x, rows, columns, out0, out1, out2, split1, split2,
                                                   [&](int n, int c, float (&wf)[8]) {
                                                     widen<BF16>(ws[(size_t)n * chunks + c], wf);
                                                   });
}

// The same walk over mlx-lm's affine-quantized weights (`QuantizedLinear`, BITS 4 or 8): a chunk
// of 8 values is one 32-bit word at 4 bits and two at 8, each value `scale * q + bias` of its group.
template <typename T, bool BF16, int MAX_ROWS, int COLUMNS_PER_BLOCK, int DEPTH, int BITS, int GROUP_SIZE, typename S>
__device__ void row_quantized_matmul(const T* x, int rows, const uint32_t* w, const S* scales, const S* biases,
                                     int columns, T* out0, T* out1, T* out2, int split1, int split2) {
  constexpr int WORDS = BITS / 4;  // 32-bit words per chunk of 8 values
  constexpr unsigned int MASK = (1u << BITS) - 1u;
  constexpr int chunks = DEPTH / 8;
  constexpr int groups = DEPTH / GROUP_SIZE;
  walk<T, BF16, MAX_ROWS, COLUMNS_PER_BLOCK, DEPTH>(
      x, rows, columns, out0, out1, out2, split1, split2, [&](int n, int c, float (&wf)[8]) {
        const int g = (c * 8) / GROUP_SIZE;
        const float scale = static_cast<float>(scales[(size_t)n * groups + g]);
        const float bias = static_cast<float>(biases[(size_t)n * groups + g]);
        const uint32_t* wn = w + ((size_t)n * chunks + c) * WORDS;
#pragma unroll
        for (int word = 0; word < WORDS; ++word) {
          const uint32_t packed = wn[word];
#pragma unroll
          for (int e = 0; e < 8 / WORDS; ++e) {
            const float q = static_cast<float>((packed >> (BITS * e)) & MASK);
            wf[word * (8 / WORDS) + e] = fmaf(q, scale, bias);
          }
        }
      });
}

}  // namespace mlxcel
