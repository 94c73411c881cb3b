// Causal self-attention of one sequence's heads on CPU, fp32: forward (output and log-sum-exp) and backward, for the
// narrow heads the CPU studies train (head_dim a multiple of 16: 16 in every committed CPU study).
//
// torch's CPU flash attention runs each (batch, head) pair's 128 x 128 scores through small GEMM calls; at head_dim 16
// and 128 tokens those calls are mostly overhead (a deep, narrow step spent a third of its time there, compiled or
// not: docs/performance.md). Here one (batch, head) pair is one task, its keys and values transposed into a scratch
// (head_dim x T) so that a query row's scores against 16 keys are head_dim fused multiply-adds of one 16-float
// vector, and only the causal half of the scores is formed. Forward and backward keep one row of scores at a time;
// the backward recomputes the probabilities from the saved log-sum-exp, as flash attention does, so the saved
// tensors are the same as torch's (q, k, v, out, lse).
//
// Every output of a pair is summed in a fixed order inside its task, so the results do not depend on the thread
// count. The exp is a vectorised Cephes-style polynomial (relative error about 1 ulp, as torch's own vectorised exp).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
constexpr int64_t kW = 16;  // floats a vector

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

// exp(x) for x <= 0 (scores minus their row's maximum, or minus the row's log-sum-exp): 2^n exp(r) with
// r = x - n ln 2 in [-ln2/2, ln2/2] and Cephes' degree-5 polynomial for exp(r) - 1 - r; x below -87 gives 0. Lanes
// above 88 (a later key's score in backward, whose weight is then set to 0) are clamped first, so that the exponent's
// conversion to an integer stays defined.
inline f32x16 exp16(f32x16 x) {
  f32x16 lo = x < -87.0f ? f32x16{} - 87.0f : x;  // the comparison's lanes are -1 where true
  lo = lo > 88.0f ? f32x16{} + 88.0f : lo;
  const f32x16 t = lo * 1.44269504088896341f + 12582912.0f;  // round to nearest: 1.5 * 2^23
  const f32x16 n = t - 12582912.0f;
  const f32x16 r = (lo - n * 0.693359375f) + n * 2.12194440e-4f;
  f32x16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f32x16 e = p * (r * r) + r + 1.0f;
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const i32x16 under = x < -87.0f;
  f32x16 out = e * scale;
  i32x16 out_bits;
  std::memcpy(&out_bits, &out, sizeof out_bits);
  out_bits &= ~under;
  std::memcpy(&out, &out_bits, sizeof out);
  return out;
}

// Rows of one (batch, head) pair: row t of x at x + t * st (the last dim contiguous).
struct Rows {
  const float* base;
  int64_t st;
  const float* operator[](int64_t t) const { return base + t * st; }
};

// dst (hd x tp) = src (T x hd) transposed, zero in the columns T .. tp - 1
void transpose(const Rows& src, int64_t t_n, int64_t hd, int64_t tp, float* dst) {
  for (int64_t t = 0; t < t_n; ++t) {
    const float* row = src[t];
    for (int64_t c = 0; c < hd; ++c) dst[c * tp + t] = row[c];
  }
  for (int64_t c = 0; c < hd; ++c)
    for (int64_t t = t_n; t < tp; ++t) dst[c * tp + t] = 0.f;
}

constexpr int kR = 8;  // query rows a tile: each key row loaded serves eight rows, eight independent chains

// s[r][0 .. nb * 16) = q[r] . kt[:, j] for the tile's kR query rows q[r] (hd floats each) and the first nb * 16 keys j
// (kt: hd x tp): each 16 keys' column of kt is loaded once for the tile's rows, and the rows are kR independent chains
inline void tile_scores(const float* const* q, const float* kt, int64_t hd, int64_t tp, int64_t nb, float* const* s) {
  for (int64_t b = 0; b < nb; ++b) {
    f32x16 acc[kR] = {};
    for (int64_t c = 0; c < hd; ++c) {
      const f32x16 col = load16(kt + c * tp + b * kW);
      for (int r = 0; r < kR; ++r) acc[r] += q[r][c] * col;
    }
    for (int r = 0; r < kR; ++r) store16(s[r] + b * kW, acc[r]);
  }
}

// x with the lanes of keys after row i (key j = j0 + lane) set to fill
inline f32x16 past(f32x16 x, int64_t j0, int64_t i, float fill) {
  if (j0 + kW - 1 <= i) return x;  // every key of the block is at or before row i
  const i32x16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const i32x16 after = lane > static_cast<int32_t>(i - j0);
  return after ? f32x16{} + fill : x;
}

inline float hsum(f32x16 v) {
  float s = 0.f;
  for (int64_t c = 0; c < kW; ++c) s += v[c];
  return s;
}

inline float hmax(f32x16 v) {
  float m = v[0];
  for (int64_t c = 1; c < kW; ++c) m = std::max(m, v[c]);
  return m;
}

void check4(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, name, " must be a CPU float32 tensor");
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, name, " must be (B, H, T, hd) with its last dim contiguous");
}

Rows rows_of(const torch::Tensor& x, int64_t b, int64_t h) {
  return Rows{x.data_ptr<float>() + b * x.stride(0) + h * x.stride(1), x.stride(2)};
}

}  // namespace

// q, k, v (B, H, T, hd) (any strides but the last) -> out (B, H, T, hd), a view of a (B, T, H, hd) tensor (so that
// the output projection reads it without a copy), and lse (B, H, T): causal attention with scores scale * q . k.
std::vector<torch::Tensor> attention_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             double scale) {
  check4(q, "q");
  check4(k, "k");
  check4(v, "v");
  const int64_t b_n = q.size(0), h_n = q.size(1), t_n = q.size(2), hd = q.size(3);
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "q, k and v must have one shape");
  TORCH_CHECK(hd % kW == 0, "attention_forward: head_dim must be a multiple of 16");
  torch::Tensor out = torch::empty({b_n, t_n, h_n, hd}, q.options()).transpose(1, 2);
  torch::Tensor lse = torch::empty({b_n, h_n, t_n}, q.options());
  const int64_t tp = (t_n + kR + kW - 1) / kW * kW;  // a tile's rows may run kR - 1 past the last token
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b_n * h_n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(hd * tp), sbuf(kR * tp), qbuf(kR * hd), obuf(kR * hd);
    float* s[kR];
    const float* qs[kR];
    for (int r = 0; r < kR; ++r) s[r] = sbuf.data() + r * tp, qs[r] = qbuf.data() + r * hd;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / h_n, h = bh % h_n;
      const Rows Q = rows_of(q, b, h), V = rows_of(v, b, h);
      float* O = out.data_ptr<float>() + b * out.stride(0) + h * out.stride(1);
      float* L = lse.data_ptr<float>() + bh * t_n;
      transpose(rows_of(k, b, h), t_n, hd, tp, kt.data());
      for (int64_t i0 = 0; i0 < t_n; i0 += kR) {
        const int64_t n = std::min(i0 + kR, t_n), nb = (n + kW - 1) / kW;  // keys 0 .. n - 1 for the tile
        for (int r = 0; r < kR; ++r) {
          const float* row = Q[std::min(i0 + r, t_n - 1)];  // rows past the end repeat the last (never stored)
          for (int64_t c = 0; c < hd; ++c) qbuf[r * hd + c] = sc * row[c];
        }
        tile_scores(qs, kt.data(), hd, tp, nb, s);
        float inv[kR];
        for (int r = 0; r < kR; ++r) {  // row i0 + r: softmax over its keys 0 .. i0 + r
          const float minus_inf = -std::numeric_limits<float>::infinity();
          for (int64_t bb = 0; bb < nb; ++bb) store16(s[r] + bb * kW, past(load16(s[r] + bb * kW), bb * kW, i0 + r, minus_inf));
          f32x16 top16 = load16(s[r]);
          for (int64_t bb = 1; bb < nb; ++bb) {
            const f32x16 x = load16(s[r] + bb * kW);
            top16 = top16 > x ? top16 : x;
          }
          const float top = hmax(top16);
          f32x16 total = {};
          for (int64_t bb = 0; bb < nb; ++bb) {
            const f32x16 p = exp16(load16(s[r] + bb * kW) - top);
            store16(s[r] + bb * kW, p);
            total += p;
          }
          const float l = hsum(total);
          if (i0 + r < t_n) L[i0 + r] = top + std::log(l);
          inv[r] = 1.f / l;  // the weights' sum, divided out of the row's output once
        }
        for (int64_t c0 = 0; c0 < hd; c0 += kW) {  // out = p @ v, a 16-column strip for the tile's rows at once
          f32x16 acc[kR] = {};
          for (int64_t j = 0; j < n; ++j) {
            const f32x16 vj = load16(V[j] + c0);
            for (int r = 0; r < kR; ++r) acc[r] += s[r][j] * vj;
          }
          for (int r = 0; r < kR && i0 + r < t_n; ++r) store16(O + (i0 + r) * out.stride(2) + c0, acc[r] * inv[r]);
        }
      }
    }
  });
  return {out, lse};
}

// The backward of attention_forward: q, k, v, out, dout (B, H, T, hd) (any strides but the last), lse (B, H, T)
// -> dq, dk, dv (B, H, T, hd)
std::vector<torch::Tensor> attention_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              const torch::Tensor& out, const torch::Tensor& lse,
                                              const torch::Tensor& dout, double scale) {
  check4(q, "q");
  check4(k, "k");
  check4(v, "v");
  check4(out, "out");
  check4(dout, "dout");
  const int64_t b_n = q.size(0), h_n = q.size(1), t_n = q.size(2), hd = q.size(3);
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes() && out.sizes() == q.sizes() && dout.sizes() == q.sizes(),
              "q, k, v, out and dout must have one shape");
  TORCH_CHECK(hd % kW == 0, "attention_backward: head_dim must be a multiple of 16");
  TORCH_CHECK(lse.device().is_cpu() && lse.scalar_type() == torch::kFloat32 && lse.is_contiguous() &&
                  lse.numel() == b_n * h_n * t_n,
              "lse must be a contiguous (B, H, T) CPU float32 tensor");
  torch::Tensor dq = torch::empty({b_n, h_n, t_n, hd}, q.options());
  torch::Tensor dk = torch::empty_like(dq), dv = torch::empty_like(dq);
  const int64_t tp = (t_n + kR + kW - 1) / kW * kW;
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b_n * h_n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(hd * tp), vt(hd * tp), pbuf(kR * tp), dsbuf(kR * tp), qbuf(kR * hd), dobuf(kR * hd);
    float *p[kR], *ds[kR];
    const float *qs[kR], *dos[kR];
    for (int r = 0; r < kR; ++r)
      p[r] = pbuf.data() + r * tp, ds[r] = dsbuf.data() + r * tp, qs[r] = qbuf.data() + r * hd,
      dos[r] = dobuf.data() + r * hd;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / h_n, h = bh % h_n;
      const Rows Q = rows_of(q, b, h), K = rows_of(k, b, h), O = rows_of(out, b, h), DO = rows_of(dout, b, h);
      const float* L = lse.data_ptr<float>() + bh * t_n;
      float* DQ = dq.data_ptr<float>() + bh * t_n * hd;
      float* DK = dk.data_ptr<float>() + bh * t_n * hd;
      float* DV = dv.data_ptr<float>() + bh * t_n * hd;
      std::memset(DK, 0, sizeof(float) * t_n * hd);
      std::memset(DV, 0, sizeof(float) * t_n * hd);
      transpose(K, t_n, hd, tp, kt.data());
      transpose(rows_of(v, b, h), t_n, hd, tp, vt.data());
      for (int64_t i0 = 0; i0 < t_n; i0 += kR) {
        const int64_t n = std::min(i0 + kR, t_n), nb = (n + kW - 1) / kW;
        float di[kR], li[kR];
        for (int r = 0; r < kR; ++r) {
          const int64_t i = std::min(i0 + r, t_n - 1);
          const float *qi = Q[i], *doi = DO[i], *oi = O[i];
          float d = 0.f;  // <dout_i, out_i> = sum_j p_j dp_j
          for (int64_t c = 0; c < hd; ++c) {
            qbuf[r * hd + c] = sc * qi[c];
            dobuf[r * hd + c] = doi[c];
            d += doi[c] * oi[c];
          }
          di[r] = d;
          li[r] = L[i];
        }
        tile_scores(qs, kt.data(), hd, tp, nb, p);    // the scores, then their probabilities
        tile_scores(dos, vt.data(), hd, tp, nb, ds);  // dp_j = dout_i . v_j, then d(score_j) / scale
        for (int r = 0; r < kR; ++r) {
          const int64_t last = i0 + r < t_n ? i0 + r : -1;  // a row past the end gets no weight on any key
          for (int64_t bb = 0; bb < nb; ++bb) {
            const f32x16 pb = past(exp16(load16(p[r] + bb * kW) - li[r]), bb * kW, last, 0.f);
            store16(p[r] + bb * kW, pb);
            store16(ds[r] + bb * kW, pb * (load16(ds[r] + bb * kW) - di[r]) * sc);
          }
        }
        for (int64_t c0 = 0; c0 < hd; c0 += kW) {
          f32x16 qv[kR], dov[kR], dqv[kR] = {};
          for (int r = 0; r < kR; ++r) qv[r] = load16(Q[std::min(i0 + r, t_n - 1)] + c0), dov[r] = load16(dos[r] + c0);
          for (int64_t j = 0; j < n; ++j) {
            const f32x16 kj = load16(K[j] + c0);
            f32x16 dkj = load16(DK + j * hd + c0), dvj = load16(DV + j * hd + c0);
            for (int r = 0; r < kR; ++r) {
              dqv[r] += ds[r][j] * kj;
              dkj += ds[r][j] * qv[r];
              dvj += p[r][j] * dov[r];
            }
            store16(DK + j * hd + c0, dkj);
            store16(DV + j * hd + c0, dvj);
          }
          for (int r = 0; r < kR && i0 + r < t_n; ++r) store16(DQ + (i0 + r) * hd + c0, dqv[r]);
        }
      }
    }
  });
  return {dq, dk, dv};
}
