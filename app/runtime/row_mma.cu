// Matrix products on the tensor cores whose every row is reduced the same way whatever the number
// of rows (issue 48; the CUDA-core kernel beside it is row_matmul.cu).
//
// Read once by app/execution/row_invariant.py and handed to `mx.fast.cuda_kernel` as the header of
// the product kernels (`row_mma`, `row_quantized_mma`), whose bodies are one call each. Only inline
// PTX (`mma.sync.aligned.m16n8k16`, sm_80 and later): no header beyond what MLX's JIT gives.
//
// The tiling. A thread block is KSPLIT x COLUMN_WARPS warps; each group of KSPLIT warps owns
// COLUMN_TILES tiles of 8 output columns and the block's ROW_TILES tiles of 16 input rows (grid x
// over the columns, grid y over groups of rows; the COLUMN_WARPS groups read the same rows of x,
// from L1 after the first). K is cut
// into chunks of 32; warp w takes chunks w, w + KSPLIT, ... in that order, keeping float
// accumulators in registers across its whole walk (one m16n8k16 product per half chunk), and the
// warps' partial sums are added in one fixed tree, ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))
// at KSPLIT = 8, through shared memory. So every output element (m, n) is reduced over K in an
// order that depends on K and KSPLIT alone: not on M, not on which row tile or row group holds row m,
// and not on ROW_TILES, COLUMN_TILES or COLUMN_WARPS (how much work one block does), so the Python
// side may pick those by M. The tensor core's product of a row of A by a column of B does not look
// at the tile's other rows, and rows past M are zero-filled and never stored.
//
// Within a chunk of 32, lane l (quad q = l % 4, group r = l / 4) loads 8 consecutive values (one
// 16-byte load) at k = 8q .. 8q + 7 of its row of x and of its column of w; the first m16n8k16
// takes words 0 and 1 of both (its k pairs 2q and 2q + 8 are the physical k = 8q + {0, 1} and
// 8q + {2, 3}), the second words 2 and 3. A and B are permuted alike, so the product is the same
// sum over K, and every load is a whole 16 bytes (four lanes read 64 contiguous bytes of a row).
// The output routing (SPLIT1, SPLIT2: up to three outputs side by side, for q/k/v and gate/up) is
// row_matmul.cu's.

namespace mlxcel_mma {

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  if (BF16) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// One float to the 16 bits of a half-precision value (round to nearest even).
template <bool BF16>
__device__ __forceinline__ unsigned int narrow(float f) {
  if (BF16) {
    const unsigned int u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  } else {
    return (unsigned int)__half_as_ushort(__float2half_rn(f));
  }
}

// Output element (row, n) to the output that holds column n (row_matmul.cu's routing).
template <typename T>
__device__ __forceinline__ void put(float value, size_t row, int n, int columns, T* out0, T* out1, T* out2,
                                    int split1, int split2) {
  if (n < split1) {
    out0[row * split1 + n] = static_cast<T>(value);
  } else if (n < split2) {
    out1[row * (split2 - split1) + n - split1] = static_cast<T>(value);
  } else {
    out2[row * (columns - split2) + n - split2] = static_cast<T>(value);
  }
}

// The walk both products share. `weights(n, k, pack)` gives the 8 values k .. k + 7 of column n's
// weights as half-precision bits (a uint4), for n < columns.
template <typename T, bool BF16, int DEPTH, int KSPLIT, int ROW_TILES, int COLUMN_TILES, int COLUMN_WARPS,
          typename Weights>
__device__ __forceinline__ void walk(const T* x, int all_rows, int columns, T* out0, T* out1, T* out2, int split1,
                                     int split2, Weights weights) {
  static_assert(DEPTH % 32 == 0, "K in chunks of 32");
  static_assert(KSPLIT == 1 || KSPLIT == 2 || KSPLIT == 4 || KSPLIT == 8 || KSPLIT == 16, "a power of two");
  constexpr int CHUNKS = DEPTH / 32;
  constexpr int ACC = ROW_TILES * COLUMN_TILES * 4;
  constexpr int UNROLL = ROW_TILES * COLUMN_TILES >= 4 ? 2 : 4;  // loads in flight against registers
  __shared__ float partials[COLUMN_WARPS][KSPLIT > 1 ? KSPLIT / 2 : 1][ACC][32];

  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % KSPLIT;  // this warp's share of K
  const int column_warp = threadIdx.x / 32 / KSPLIT;  // and of the block's columns
  float(&partial)[KSPLIT > 1 ? KSPLIT / 2 : 1][ACC][32] = partials[column_warp];
  const int quad = lane % 4;
  const int group = lane / 4;
  const int first_row = blockIdx.y * (ROW_TILES * 16);
  const int first_column = (blockIdx.x * COLUMN_WARPS + column_warp) * (COLUMN_TILES * 8);
  const int rows = min(ROW_TILES * 16, all_rows - first_row);
  const int row_tiles = (rows + 15) / 16;  // the same for every thread: whole tiles skipped alike

  float acc[ROW_TILES][COLUMN_TILES][4];
#pragma unroll
  for (int mt = 0; mt < ROW_TILES; ++mt) {
#pragma unroll
    for (int nt = 0; nt < COLUMN_TILES; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[mt][nt][i] = 0.0f;
      }
    }
  }

  // this lane's two rows of each row tile (rows past M read as zeros)
  const T* xr[ROW_TILES][2];
  bool live[ROW_TILES][2];
#pragma unroll
  for (int mt = 0; mt < ROW_TILES; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = mt * 16 + group + 8 * h;
      live[mt][h] = m < rows;
      xr[mt][h] = x + (size_t)(first_row + (m < rows ? m : 0)) * DEPTH + quad * 8;
    }
  }

#pragma unroll(UNROLL)
  for (int c = warp; c < CHUNKS; c += KSPLIT) {
    const int k = c * 32 + quad * 8;
    uint4 b[COLUMN_TILES];
#pragma unroll
    for (int nt = 0; nt < COLUMN_TILES; ++nt) {
      const int n = first_column + nt * 8 + group;
      b[nt] = n < columns ? weights(n, k) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int mt = 0; mt < ROW_TILES; ++mt) {
      if (mt < row_tiles) {
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        const uint4 lo = live[mt][0] ? *reinterpret_cast<const uint4*>(xr[mt][0] + c * 32) : zero;
        const uint4 hi = live[mt][1] ? *reinterpret_cast<const uint4*>(xr[mt][1] + c * 32) : zero;
#pragma unroll
        for (int nt = 0; nt < COLUMN_TILES; ++nt) {
          mma16816<BF16>(acc[mt][nt], lo.x, hi.x, lo.y, hi.y, b[nt].x, b[nt].y);
          mma16816<BF16>(acc[mt][nt], lo.z, hi.z, lo.w, hi.w, b[nt].z, b[nt].w);
        }
      }
    }
  }

  // the warps' partial sums, added in a fixed tree: warp w takes warp w + half's, half = KSPLIT / 2 .. 1
#pragma unroll
  for (int half = KSPLIT / 2; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half) {
#pragma unroll
      for (int mt = 0; mt < ROW_TILES; ++mt) {
#pragma unroll
        for (int nt = 0; nt < COLUMN_TILES; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            partial[warp - half][(mt * COLUMN_TILES + nt) * 4 + i][lane] = acc[mt][nt][i];
          }
        }
      }
    }
    __syncthreads();
    if (warp < half) {
#pragma unroll
      for (int mt = 0; mt < ROW_TILES; ++mt) {
#pragma unroll
        for (int nt = 0; nt < COLUMN_TILES; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[mt][nt][i] = acc[mt][nt][i] + partial[warp][(mt * COLUMN_TILES + nt) * 4 + i][lane];
          }
        }
      }
    }
    __syncthreads();
  }

  if (warp == 0) {
#pragma unroll
    for (int mt = 0; mt < ROW_TILES; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = mt * 16 + group + 8 * h;
        if (m < rows) {
#pragma unroll
          for (int nt = 0; nt < COLUMN_TILES; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int n = first_column + nt * 8 + quad * 2 + e;
              if (n < columns) {
                put<T>(acc[mt][nt][2 * h + e], (size_t)(first_row + m), n, columns, out0, out1, out2, split1,
                       split2);
              }
            }
          }
        }
      }
    }
  }
}

// x `[rows, DEPTH]` times w `[columns, DEPTH]` (half precision, the same type as x).
template <typename T, bool BF16, int DEPTH, int KSPLIT, int ROW_TILES, int COLUMN_TILES, int COLUMN_WARPS>
__device__ void row_mma(const T* x, int rows, const T* w, int columns, T* out0, T* out1, T* out2, int split1,
                        int split2) {
  walk<T, BF16, DEPTH, KSPLIT, ROW_TILES, COLUMN_TILES, COLUMN_WARPS>(
      x, rows, columns, out0, out1, out2, split1, split2,
      [&](int n, int k) { return *reinterpret_cast<const uint4*>(w + (size_t)n * DEPTH + k); });
}

// The same walk over mlx-lm's affine-quantized weights (`QuantizedLinear`, BITS 4 or 8): the 8
// values at k are one 32-bit word at 4 bits and two at 8, each `scale * q + bias` of its group in
// float, rounded to x's half-precision type before the tensor core takes them.
template <typename T, bool BF16, int DEPTH, int KSPLIT, int ROW_TILES, int COLUMN_TILES, int COLUMN_WARPS, int BITS,
          int GROUP_SIZE, typename S>
__device__ void row_quantized_mma(const T* x, int rows, const uint32_t* w, const S* scales, const S* biases,
                                  int columns, T* out0, T* out1, T* out2, int split1, int split2) {
  constexpr int WORDS = BITS / 4;  // 32-bit words per 8 values
  constexpr unsigned int MASK = (1u << BITS) - 1u;
  constexpr int GROUPS = DEPTH / GROUP_SIZE;
  walk<T, BF16, DEPTH, KSPLIT, ROW_TILES, COLUMN_TILES, COLUMN_WARPS>(
      x, rows, columns, out0, out1, out2, split1, split2, [&](int n, int k) {
        const int g = k / GROUP_SIZE;
        const float scale = static_cast<float>(scales[(size_t)n * GROUPS + g]);
        const float bias = static_cast<float>(biases[(size_t)n * GROUPS + g]);
        const uint32_t* wn = w + ((size_t)n * DEPTH + k) / 8 * WORDS;
        unsigned int halves[8];
#pragma unroll
        for (int word = 0; word < WORDS; ++word) {
          const uint32_t packed = wn[word];
#pragma unroll
          for (int e = 0; e < 8 / WORDS; ++e) {
            const float q = static_cast<float>((packed >> (BITS * e)) & MASK);
            halves[word * (8 / WORDS) + e] = narrow<BF16>(fmaf(q, scale, bias));
          }
        }
        return make_uint4(halves[0] | (halves[1] << 16), halves[2] | (halves[3] << 16), halves[4] | (halves[5] << 16),
                          halves[6] | (halves[7] << 16));
      });
}

}  // namespace mlxcel_mma
