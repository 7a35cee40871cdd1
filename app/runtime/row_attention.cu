// Attention whose every query is computed the same way whatever the call it is in.
//
// Read once by app/execution/row_invariant.py and handed to `mx.fast.cuda_kernel` as the header of
// two kernels, whose bodies are one call each (`mlxcel::row_attention`, `mlxcel::pool_attention`).
// One thread block of 32 * WARPS threads takes one (query, head): the query's visible keys are
// walked in a fixed order (key j to warp j mod WARPS, an online softmax per warp, the warps merged
// in index order), so a query's output depends only on its vector and the keys it may see: a
// width-w forward gives the bits of w single steps, and a row's queries the bits they have alone.

namespace mlxcel {

// The walk both kernels share: keys [first, visible) of one query, one head.
template <typename T, int HEAD_DIM, int WARPS>
__device__ __forceinline__ void attend(const T* qp, const T* kp, const T* vp, long long k_step, long long v_step,
                                       int first, int visible, float scale, T* out) {
  constexpr int PER_LANE = HEAD_DIM / 32;
  const float minus_inf = __int_as_float(0xff800000);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  qp += lane * PER_LANE;
  kp += lane * PER_LANE;
  vp += lane * PER_LANE;
  float qv[PER_LANE];
  float acc[PER_LANE];
  for (int e = 0; e < PER_LANE; ++e) {
    qv[e] = static_cast<float>(qp[e]) * scale;
    acc[e] = 0.0f;
  }
  float m = minus_inf;
  float l = 0.0f;
  // the first key j >= first with j = warp (mod WARPS): key j always goes to warp j mod WARPS
  for (int j = first + ((warp - first % WARPS) + WARPS) % WARPS; j < visible; j += WARPS) {
    const T* kj = kp + j * k_step;
    const T* vj = vp + j * v_step;
    float s = 0.0f;
    for (int e = 0; e < PER_LANE; ++e) {
      s += qv[e] * static_cast<float>(kj[e]);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      s += __shfl_xor_sync(0xffffffff, s, offset);
    }
    const float m_new = fmaxf(m, s);
    const float carry = __expf(m - m_new);
    const float p = __expf(s - m_new);
    l = l * carry + p;
    for (int e = 0; e < PER_LANE; ++e) {
      acc[e] = acc[e] * carry + p * static_cast<float>(vj[e]);
    }
    m = m_new;
  }

  __shared__ float warp_max[WARPS];
  __shared__ float warp_sum[WARPS];
  __shared__ float warp_acc[WARPS][HEAD_DIM];
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
  for (int e = 0; e < PER_LANE; ++e) {
    warp_acc[warp][lane * PER_LANE + e] = acc[e];
  }
  __syncthreads();
  const int d = threadIdx.x;
  if (d < HEAD_DIM) {
    float top = minus_inf;
    for (int w = 0; w < WARPS; ++w) {
      top = fmaxf(top, warp_max[w]);
    }
    float total = 0.0f;
    float value = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      const float weight = warp_max[w] == minus_inf ? 0.0f : __expf(warp_max[w] - top);
      total += warp_sum[w] * weight;
      value += warp_acc[w][d] * weight;
    }
    out[(size_t)blockIdx.x * HEAD_DIM + d] = static_cast<T>(value / total);
  }
}

// One row's queries `[B, H, L, D]` over its keys `[B, Hk, S, D]`: query i sees keys
// [0, S - L + i] when causal, all S otherwise. Block b * H * L + h * L + i.
template <typename T, int HEAD_DIM, int WARPS, bool CAUSAL>
__device__ void row_attention(const T* q, int heads, int queries, long long q_batch, long long q_head,
                              long long q_step, const T* k, int kv_heads, int keys, long long k_batch,
                              long long k_head, long long k_step, const T* v, long long v_batch, long long v_head,
                              long long v_step, float scale, T* out) {
  const int row = blockIdx.x;
  const int i = row % queries;
  const int h = (row / queries) % heads;
  const int b = row / (queries * heads);
  const int hk = h / (heads / kv_heads);
  const int visible = CAUSAL ? keys - queries + i + 1 : keys;
  attend<T, HEAD_DIM, WARPS>(q + b * q_batch + h * q_head + i * q_step, k + b * k_batch + hk * k_head,
                             v + b * v_batch + hk * v_head, k_step, v_step, 0, visible, scale, out);
}

// A tick's queries `[N, H, 1, D]` over the KV pool `[slots, Hk, capacity, D]`: token t reads its
// row's slot `slots[t]`, keys [first[t], visible[t]). Block t * H + h.
template <typename T, int HEAD_DIM, int WARPS>
__device__ void pool_attention(const T* q, int heads, long long q_token, long long q_head, const T* k, int kv_heads,
                               long long k_slot, long long k_head, long long k_step, const T* v, long long v_slot,
                               long long v_head, long long v_step, const int* slots, const int* first,
                               const int* visible, float scale, T* out) {
  const int t = blockIdx.x / heads;
  const int h = blockIdx.x % heads;
  const int hk = h / (heads / kv_heads);
  const long long slot = slots[t];
  attend<T, HEAD_DIM, WARPS>(q + t * q_token + h * q_head, k + slot * k_slot + hk * k_head,
                             v + slot * v_slot + hk * v_head, k_step, v_step, first[t], visible[t], scale, out);
}

}  // namespace mlxcel
