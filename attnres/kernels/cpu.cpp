// The two-phase depth attention's token-wise work on CPU, fp32: the deposit of a completed source, phase 1 (forward,
// and the backward of a block's first query), the phase-2 merge (forward and backward) and the deposit's backward, one
// pass over each token's rows; and RMSNorm's backward (every variant's sublayers and final norm), at its end. The token
// attention's kernels are in attention.cpp, built into the same module.
//
// The math is that of attnres.kernels.two_phase's Deposit, Phase1 and Merge, line for line (see there and
// docs/method.md). Eager PyTorch runs it as ten or so separate passes over (tokens, D) tensors; here every token's
// rows are read once and kept in L1 while all of its dot products and outputs are formed. Tokens are split over the
// threads by at::parallel_for (PyTorch's own pool). Every output is a function of one token's rows, except du, a sum
// over the tokens: it is summed token by token in token order, its columns split over the threads, so it is the same
// bits whatever the number of threads (a run's losses do not depend on the threads it was given, docs/training.md).
// Built on first use by attnres/kernels/cpu.py (torch.utils.cpp_extension); no build step at install.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

void check(const torch::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, name, " must be a CPU float32 tensor");
  TORCH_CHECK(x.dim() == dim && x.stride(-1) == 1, name, " must have ", dim, " dims, the last contiguous");
}

constexpr int64_t kGrain = 64;    // tokens per task: 64 rows of D floats per stream
constexpr int64_t kColumns = 16;  // columns per task of a sum over the tokens: one 64-byte cache line of a row

// Eight floats as one vector (GCC's and Clang's vector extension: AVX on x86, NEON pairs on ARM). combine keeps its
// partial sums in two of them; a plain array there, GCC vectorised the loop over the columns instead, with gathers.
typedef float f32x8 __attribute__((vector_size(32)));

inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// <a, b> over d floats. One accumulator makes a chain of dependent adds, and the kernels that take a dozen dot
// products per token (a slot's readers) waited on it: here four vectors of partial sums, 32 columns a step, then
// one, then single floats, added up in a fixed order: the same bits at any thread count.
inline float dot(const float* a, const float* b, int64_t d) {
  f32x8 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    s0 += load8(a + i) * load8(b + i);
    s1 += load8(a + i + 8) * load8(b + i + 8);
    s2 += load8(a + i + 16) * load8(b + i + 16);
    s3 += load8(a + i + 24) * load8(b + i + 24);
  }
  for (; i + 8 <= d; i += 8) s0 += load8(a + i) * load8(b + i);
  const f32x8 v = (s0 + s1) + (s2 + s3);
  float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

// out = sum_j c[j] rows[j] (d floats each), summed in j's order, 16 columns at a time with their partial sums in
// registers: out is written once. Adding one row at a time into out instead read and wrote out once a row, and a
// slot's backward (a dozen readers and queries) or a block's phase 1 (k slots) was bound by those loads and stores.
inline void combine(float* out, const float* const* rows, const float* c, int64_t m, int64_t d) {
  int64_t i0 = 0;
  for (; i0 + 16 <= d; i0 += 16) {
    f32x8 lo = c[0] * load8(rows[0] + i0), hi = c[0] * load8(rows[0] + i0 + 8);
    for (int64_t j = 1; j < m; ++j) {
      lo += c[j] * load8(rows[j] + i0);
      hi += c[j] * load8(rows[j] + i0 + 8);
    }
    std::memcpy(out + i0, &lo, sizeof lo);
    std::memcpy(out + i0 + 8, &hi, sizeof hi);
  }
  for (int64_t i = i0; i < d; ++i) {  // the columns after the last whole 16
    // explicit fused multiply-adds, as the vector loop's: left to the compiler, the contraction of this loop varied
    // with where combine was inlined, so a sum split in two (deposit_backward's partial) gave other bits
    float a = c[0] * rows[0][i];
    for (int64_t j = 1; j < m; ++j) a = std::fma(c[j], rows[j][i], a);
    out[i] = a;
  }
}

// dots[j] = <v_j, g> for the k slot rows of token t (slot stride vs), and returns sum_j w_j dots[j] = <out, g>
inline float slot_dots(const float* V, int64_t vs, const float* W, int64_t ws, int64_t k, int64_t t, int64_t d,
                       const float* g, float* dots) {
  float dot_out = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    dots[j] = dot(V + j * vs + t * d, g, d);
    dot_out += W[j * ws + t] * dots[j];
  }
  return dot_out;
}

// out (D) += sum_t a_t p_t over the rows of P (N, D), in token order: a sum split over the tokens' threads (one partial
// row per thread, as before) depends on the thread count, and made a run's depth-query gradients, so its losses,
// differ between 1 and 2 threads. One more pass over P, its columns shared out; one thread gives the bits it gave
// before.
void sum_rows(const float* A, const float* P, int64_t n, int64_t d, float* out) {
  at::parallel_for(0, d, kColumns, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < n; ++t) {
      const float a = A[t];
      const float* pt = P + t * d;
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) out[i] += a * pt[i];
    }
  });
}

// A merge's dp row (dp = dp_later + (1 - keep) dh + a u + c p, with a = -dscore r and c = dscore logit r^2 / D: p's
// gradient through h = p + keep (out - p) and through its logit) for token t; returns a, whose sum with p is du.
inline float merge_dp_row(float dscore, float kp, float rt, float logit, float inv_d, const float* dht, const float* pt,
                          const float* lt, const float* U, float* dpt, int64_t d) {
  const float rest = 1.f - kp, a = -dscore * rt, c = dscore * logit * rt * rt * inv_d;
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) dpt[i] = lt[i] + rest * dht[i] + a * U[i] + c * pt[i];
  return a;
}

}  // namespace

// out, last, prev (N, D) (prev may be empty: p = last), u (D), lse (N) -> h, keep, 1/rms(p), logit, p
std::vector<torch::Tensor> merge_forward(const torch::Tensor& out, const torch::Tensor& prev, const torch::Tensor& last,
                                         const torch::Tensor& u, const torch::Tensor& lse, double eps) {
  check(out, "out", 2), check(last, "last", 2), check(u, "u", 1), check(lse, "lse", 1);
  const bool summed = prev.numel() > 0;
  if (summed) check(prev, "prev", 2);
  const int64_t n = out.size(0), d = out.size(1);
  TORCH_CHECK(out.is_contiguous() && last.is_contiguous() && (!summed || prev.is_contiguous()) && lse.is_contiguous(),
              "merge_forward: contiguous inputs expected");
  torch::Tensor p = summed ? torch::empty_like(out) : last;
  torch::Tensor h = torch::empty_like(out);
  torch::Tensor keep = torch::empty({n}, out.options()), r = torch::empty({n}, out.options());
  torch::Tensor logit = torch::empty({n}, out.options());
  const float *O = out.data_ptr<float>(), *L = last.data_ptr<float>(), *U = u.data_ptr<float>();
  const float *S = lse.data_ptr<float>(), *Q = summed ? prev.data_ptr<float>() : nullptr;
  float *P = p.data_ptr<float>(), *H = h.data_ptr<float>();
  float *K = keep.data_ptr<float>(), *R = r.data_ptr<float>(), *G = logit.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* lt = L + t * d;
      float* pt = P + t * d;
      float squares = 0.f, pu = 0.f;
      if (summed) {
        const float* qt = Q + t * d;
#pragma omp simd reduction(+ : squares, pu)
        for (int64_t i = 0; i < d; ++i) {
          const float x = qt[i] + lt[i];
          pt[i] = x;
          squares += x * x;
          pu += x * U[i];
        }
      } else {
#pragma omp simd reduction(+ : squares, pu)
        for (int64_t i = 0; i < d; ++i) {
          squares += lt[i] * lt[i];
          pu += lt[i] * U[i];
        }
      }
      const float rt = 1.f / std::sqrt(squares / static_cast<float>(d) + feps);
      const float lg = pu * rt;
      const float kp = 1.f / (1.f + std::exp(lg - S[t]));  // sigmoid(lse - logit)
      R[t] = rt, G[t] = lg, K[t] = kp;
      const float* ot = O + t * d;
      float* ht = H + t * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) ht[i] = pt[i] + kp * (ot[i] - pt[i]);
    }
  });
  return {h, keep, r, logit, p};
}

// dh, p, dp_later (N, D), u (D), weights (k, N), values and value_grad (k, N, D) slot rows, r, logit, keep (N),
// logit_grad (k, N) rows of this query. Adds the softmax's backward to logit_grad and keep * weights[j] * dh to
// value_grad[j] (the readers scatter: AttnRes.gather = False; with gather, merge_backward_kept). Returns dp (N, D)
// (including dp_later) and du (D).
std::vector<torch::Tensor> merge_backward(const torch::Tensor& dh, const torch::Tensor& p,
                                          const torch::Tensor& dp_later, const torch::Tensor& u,
                                          const torch::Tensor& weights, const torch::Tensor& values,
                                          torch::Tensor value_grad, const torch::Tensor& r, const torch::Tensor& logit,
                                          const torch::Tensor& keep, torch::Tensor logit_grad) {
  check(dh, "dh", 2), check(p, "p", 2), check(dp_later, "dp_later", 2), check(u, "u", 1);
  check(weights, "weights", 2), check(values, "values", 3), check(value_grad, "value_grad", 3);
  check(r, "r", 1), check(logit, "logit", 1), check(keep, "keep", 1), check(logit_grad, "logit_grad", 2);
  const int64_t n = dh.size(0), d = dh.size(1), k = weights.size(0);
  TORCH_CHECK(dh.is_contiguous() && p.is_contiguous() && dp_later.is_contiguous(), "merge_backward: contiguous rows");
  TORCH_CHECK(values.stride(1) == d && value_grad.stride(1) == d && weights.stride(1) == 1 && logit_grad.stride(1) == 1,
              "merge_backward: slot rows must be contiguous");
  TORCH_CHECK(k <= 64, "merge_backward: at most 64 slots");
  torch::Tensor dp = torch::empty_like(dh);
  torch::Tensor du = torch::zeros({d}, dh.options()), a_of = torch::empty({n}, dh.options());
  const float *DH = dh.data_ptr<float>(), *P = p.data_ptr<float>(), *DL = dp_later.data_ptr<float>();
  const float *U = u.data_ptr<float>(), *W = weights.data_ptr<float>(), *V = values.data_ptr<float>();
  const float *R = r.data_ptr<float>(), *G = logit.data_ptr<float>(), *K = keep.data_ptr<float>();
  float *VG = value_grad.data_ptr<float>(), *LG = logit_grad.data_ptr<float>();
  float *DP = dp.data_ptr<float>(), *DU = du.data_ptr<float>(), *A = a_of.data_ptr<float>();
  const int64_t ws = weights.stride(0), vs = values.stride(0), ls = logit_grad.stride(0);
  const int64_t gs = value_grad.stride(0);
  const float inv_d = 1.f / static_cast<float>(d);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    float dots[64];
    for (int64_t t = begin; t < end; ++t) {
      const float *dht = DH + t * d, *pt = P + t * d;
      const float dhp = dot(dht, pt, d);
      const float dot_out = slot_dots(V, vs, W, ws, k, t, d, dht, dots);  // <dh, out>
      const float kp = K[t], rest = 1.f - kp, rt = R[t];
      const float dscore = (dot_out - dhp) * kp * rest;
      for (int64_t j = 0; j < k; ++j) {
        const float wj = W[j * ws + t], coef = kp * wj;
        LG[j * ls + t] += wj * ((dots[j] - dot_out) * kp + dscore);
        float* gt = VG + j * gs + t * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) gt[i] += coef * dht[i];
      }
      A[t] = merge_dp_row(dscore, kp, rt, G[t], inv_d, dht, pt, DL + t * d, U, DP + t * d, d);
    }
  });
  sum_rows(A, P, n, d, DU);
  return {dp, du};
}

// The merge's backward when the slots gather its share later (deposit_backward): dh, p, h, dp_later (N, D), u (D),
// r, logit, keep (N) -> dp (N, D) (including dp_later), du (D) and c (N), what deposit_backward needs for this query's
// logits' gradient. No slot is read: with h = p + keep (out - p), <dh, h - p> = keep (<dh, out> - <dh, p>), so the
// score's gradient is dscore = (1 - keep) <dh, h - p>, and the softmax's backward on slot j, w_j (keep <v_j, dh> -
// keep <dh, out> + dscore), is w_j (keep <v_j, dh> - c) with c = keep <dh, h>: deposit_backward forms <v_j, dh> while
// it reads both rows anyway. (merge_backward, for the scatter, reads the k slots for those: k + 5 passes, not 5.)
std::vector<torch::Tensor> merge_backward_kept(const torch::Tensor& dh, const torch::Tensor& p, const torch::Tensor& h,
                                               const torch::Tensor& dp_later, const torch::Tensor& u,
                                               const torch::Tensor& r, const torch::Tensor& logit,
                                               const torch::Tensor& keep) {
  check(dh, "dh", 2), check(p, "p", 2), check(h, "h", 2), check(dp_later, "dp_later", 2), check(u, "u", 1);
  check(r, "r", 1), check(logit, "logit", 1), check(keep, "keep", 1);
  const int64_t n = dh.size(0), d = dh.size(1);
  TORCH_CHECK(dh.is_contiguous() && p.is_contiguous() && h.is_contiguous() && dp_later.is_contiguous(),
              "merge_backward_kept: contiguous rows");
  torch::Tensor dp = torch::empty_like(dh), c_of = torch::empty({n}, dh.options());
  torch::Tensor du = torch::zeros({d}, dh.options()), a_of = torch::empty({n}, dh.options());
  const float *DH = dh.data_ptr<float>(), *P = p.data_ptr<float>(), *H = h.data_ptr<float>();
  const float *DL = dp_later.data_ptr<float>(), *U = u.data_ptr<float>();
  const float *R = r.data_ptr<float>(), *G = logit.data_ptr<float>(), *K = keep.data_ptr<float>();
  float *DP = dp.data_ptr<float>(), *DU = du.data_ptr<float>(), *A = a_of.data_ptr<float>(), *C = c_of.data_ptr<float>();
  const float inv_d = 1.f / static_cast<float>(d);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *dht = DH + t * d, *pt = P + t * d, *ht = H + t * d;
      const float dhp = dot(dht, pt, d), dhh = dot(dht, ht, d);
      const float kp = K[t], rest = 1.f - kp, rt = R[t];
      const float dscore = (dhh - dhp) * rest;
      C[t] = kp * dhh;
      A[t] = merge_dp_row(dscore, kp, rt, G[t], inv_d, dht, pt, DL + t * d, U, DP + t * d, d);
    }
  });
  sum_rows(A, P, n, d, DU);
  return {dp, du, c_of};
}

// Phase 1 (k >= 2 completed slots, S queries): scores (S, k, N) (any strides), values (k, N, D) slot rows ->
// lse (S, N), weights (S, k, N) and the S outputs sum_j weights[s, j] v_j (N, D). Each token's k slot rows are read
// once for all S outputs.
std::vector<torch::Tensor> phase1_forward(const torch::Tensor& scores, const torch::Tensor& values) {
  check(values, "values", 3);
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == torch::kFloat32 && scores.dim() == 3,
              "scores must be a (S, k, N) CPU float32 tensor");
  const int64_t s_n = scores.size(0), k = scores.size(1), n = scores.size(2), d = values.size(2);
  TORCH_CHECK(values.size(0) >= k && values.size(1) == n && values.stride(1) == d, "values must hold k slot rows");
  TORCH_CHECK(k <= 64 && s_n <= 64, "phase1_forward: at most 64 slots and 64 queries");
  torch::Tensor lse = torch::empty({s_n, n}, values.options()), weights = torch::empty({s_n, k, n}, values.options());
  std::vector<torch::Tensor> outs;
  std::vector<float*> out_ptrs;
  for (int64_t q = 0; q < s_n; ++q) {  // one allocation per query: a sublayer's norm keeps its input alive alone
    outs.push_back(torch::empty({n, d}, values.options()));
    out_ptrs.push_back(outs.back().data_ptr<float>());
  }
  const float* SC = scores.data_ptr<float>();
  const int64_t ss = scores.stride(0), sk = scores.stride(1), sn = scores.stride(2);
  const float* V = values.data_ptr<float>();
  const int64_t vs = values.stride(0);
  float *LSE = lse.data_ptr<float>(), *W = weights.data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    float w[64];
    const float* rows[64];
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < k; ++j) rows[j] = V + j * vs + t * d;
      for (int64_t q = 0; q < s_n; ++q) {
        const float* sc = SC + q * ss + t * sn;
        float top = sc[0];
        for (int64_t j = 1; j < k; ++j) top = std::max(top, sc[j * sk]);
        float total = 0.f;
        for (int64_t j = 0; j < k; ++j) total += (w[j] = std::exp(sc[j * sk] - top));
        LSE[q * n + t] = top + std::log(total);
        const float inv = 1.f / total;  // one exp per weight: at k = 9 and 2 queries the exps were a third of this
        for (int64_t j = 0; j < k; ++j) W[(q * k + j) * n + t] = (w[j] *= inv);
        combine(out_ptrs[q] + t * d, rows, w, k, d);
      }
    }
  });
  outs.insert(outs.begin(), weights);
  outs.insert(outs.begin(), lse);
  return outs;
}

// Phase 1's backward for one query whose output got the gradient dout (N, D): adds weights[j] * dout to
// value_grad[j] (written, not added, where fresh[j]: no reader has written that slot yet) and the softmax's backward
// to logit_grad (k, N) rows of this query.
void slot_backward(const torch::Tensor& dout, const torch::Tensor& weights, const torch::Tensor& values,
                   torch::Tensor value_grad, torch::Tensor logit_grad, const std::vector<bool>& fresh) {
  check(dout, "dout", 2), check(weights, "weights", 2), check(values, "values", 3);
  check(value_grad, "value_grad", 3), check(logit_grad, "logit_grad", 2);
  const int64_t n = dout.size(0), d = dout.size(1), k = weights.size(0);
  TORCH_CHECK(dout.is_contiguous() && values.stride(1) == d && value_grad.stride(1) == d && weights.stride(1) == 1 &&
                  logit_grad.stride(1) == 1 && static_cast<int64_t>(fresh.size()) == k && k <= 64,
              "slot_backward: slot rows must be contiguous");
  const float *DO = dout.data_ptr<float>(), *W = weights.data_ptr<float>(), *V = values.data_ptr<float>();
  float *VG = value_grad.data_ptr<float>(), *LG = logit_grad.data_ptr<float>();
  const int64_t ws = weights.stride(0), vs = values.stride(0), gs = value_grad.stride(0), ls = logit_grad.stride(0);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    float dots[64];
    for (int64_t t = begin; t < end; ++t) {
      const float* dt = DO + t * d;
      const float dot_out = slot_dots(V, vs, W, ws, k, t, d, dt, dots);  // <dout, out>
      for (int64_t j = 0; j < k; ++j) {
        const float wj = W[j * ws + t];
        LG[j * ls + t] += wj * (dots[j] - dot_out);
        float* gt = VG + j * gs + t * d;
        if (fresh[j]) {
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) gt[i] = wj * dt[i];
        } else {
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) gt[i] += wj * dt[i];
        }
      }
    }
  });
}

// Deposit: x = prev + last (x = last when prev is empty) into the slot row x (N, D), r = 1/rms(x) (N) and the logits
// r (x . u_q) of the queries that will read it into logits (Q', N), u (Q', D).
void deposit_forward(const torch::Tensor& prev, const torch::Tensor& last, const torch::Tensor& u, torch::Tensor x,
                     torch::Tensor r, torch::Tensor logits, double eps) {
  check(last, "last", 2), check(u, "u", 2), check(x, "x", 2), check(r, "r", 1), check(logits, "logits", 2);
  const bool summed = prev.numel() > 0;
  if (summed) check(prev, "prev", 2);
  const int64_t n = last.size(0), d = last.size(1), queries = u.size(0);
  TORCH_CHECK(last.is_contiguous() && (!summed || prev.is_contiguous()) && x.is_contiguous() && u.is_contiguous() &&
                  r.is_contiguous() && logits.size(0) == queries && logits.size(1) == n,
              "deposit_forward: contiguous rows expected");
  const float *L = last.data_ptr<float>(), *Q = summed ? prev.data_ptr<float>() : nullptr, *U = u.data_ptr<float>();
  float *X = x.data_ptr<float>(), *R = r.data_ptr<float>(), *Z = logits.data_ptr<float>();
  const int64_t zs = logits.stride(0);
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* lt = L + t * d;
      float* xt = X + t * d;
      float squares = 0.f;
      if (summed) {
        const float* qt = Q + t * d;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < d; ++i) {
          xt[i] = qt[i] + lt[i];
          squares += xt[i] * xt[i];
        }
      } else {
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < d; ++i) {
          xt[i] = lt[i];
          squares += lt[i] * lt[i];
        }
      }
      const float rt = 1.f / std::sqrt(squares / static_cast<float>(d) + feps);
      R[t] = rt;
      for (int64_t q = 0; q < queries; ++q) Z[q * zs + t] = rt * dot(xt, U + q * d, d);
    }
  });
}

// The deposit's backward, formed when the slot's own backward runs (every reader's has): its readers' share, then its
// logits' path. Reader q's output got the gradient s_q g_q, g_q (N, D) with scale s_q (N) (a merge's keep; empty: 1);
// its softmax weight on this slot is w_q (N); readers come in descending query order. A reader that left its logits'
// gradient to the slot (a block's first query, c_q = <out_q, g_q>; a merge, c_q from merge_backward_kept) adds
// w_q (s_q <x, g_q> - c_q) to its row of the slot's logit gradient (row reader_rows[q] of logit_rows, below); an empty
// c_q formed it itself. A reader that gives its phase-1 output out_q (N, D) has c_q formed here first, into c_q,
// while g_q's row is at hand (the first slot to gather a block's first query; the later ones get c_q). Then, with z
// the slot's logit rows (Q', N) against the queries u (Q', D) that read it, dz their gradient (Q', N, every reader's
// added now) and r = 1/rms(x):
//     dx = sum_q w_q s_q g_q + (r dz)^T u - (r^2 / D) (sum_q dz_q z_q) x      (z_q = r <x, u_q>, dr/dx = -r^3 x / D)
// returned with r dz (Q', N), whose product with x (du = (r dz) x, a sum over the tokens) the caller forms (a BLAS
// product: as one more pass of this kernel's, its columns split over the threads as sum_rows does, the kernel took
// 2.5x as long). Each token's slot row and gradient row stay in L1 while every reader's row is read once: the slot's
// backward reads each reader's gradient once and writes dx once, a third of the traffic of adding each reader's
// share into a slot-gradient buffer as it comes (slot_backward, merge_backward), and none for the logits' path (five
// more passes over dx and x in torch ops).
//
// Ahead (a group of slots, attnres.kernels.two_phase.gather_plan): every reader of this slot reads the lower slots
// too, so while its gradient row is at hand this call also forms those slots' share of it, for each ahead slot a with
// rows ahead_x[a] (N, D), its weight rows ahead_weights[a * readers + q] (N) and logit-gradient rows
// ahead_logit_rows[a * readers + q] (N, added to as above): the partial sum sum_q w_aq s_q g_q (N, D), returned after
// dx and dzr, one per ahead slot. That slot's own call later takes it as `partial` and gathers only the readers below
// this slot's: each of these readers' gradients is read once for the group, not once per slot (Full AttnRes at 16
// sublayers reads 35 % fewer bytes here). `partial` comes first in dx's sum, then the readers in descending order, as
// in the one sum over every reader it replaces, so dx is the same bits.
std::vector<torch::Tensor> deposit_backward(const torch::Tensor& x, const std::vector<torch::Tensor>& grads,
                                            const std::vector<torch::Tensor>& scales,
                                            const std::vector<torch::Tensor>& weights,
                                            std::vector<torch::Tensor> dots_out,
                                            const std::vector<torch::Tensor>& outs,
                                            const std::vector<int64_t>& reader_rows, torch::Tensor logit_rows,
                                            const torch::Tensor& logits, const torch::Tensor& r,
                                            const torch::Tensor& u, const torch::Tensor& partial,
                                            const std::vector<torch::Tensor>& ahead_x,
                                            const std::vector<torch::Tensor>& ahead_weights,
                                            std::vector<torch::Tensor> ahead_logit_rows) {
  check(x, "x", 2), check(logit_rows, "logit_rows", 2), check(logits, "logits", 2), check(r, "r", 1);
  check(u, "u", 2);
  const int64_t n = x.size(0), d = x.size(1), readers = static_cast<int64_t>(grads.size()), queries = u.size(0);
  const int64_t ahead = static_cast<int64_t>(ahead_x.size());
  TORCH_CHECK(x.is_contiguous() && static_cast<int64_t>(weights.size()) == readers &&
                  static_cast<int64_t>(scales.size()) == readers &&
                  static_cast<int64_t>(dots_out.size()) == readers && static_cast<int64_t>(outs.size()) == readers &&
                  static_cast<int64_t>(reader_rows.size()) == readers,
              "deposit_backward: a contiguous slot and one gradient, weight row, dot, output and logit row per reader");
  TORCH_CHECK(u.is_contiguous() && u.size(1) == d && r.is_contiguous() && r.size(0) == n &&
                  logit_rows.size(0) == queries && logit_rows.size(1) == n && logits.size(0) == queries &&
                  logits.size(1) == n,
              "deposit_backward: logit rows (Q', N) and queries (Q', D) that match the slot");
  const bool summed = partial.numel() > 0;
  if (summed) {
    check(partial, "partial", 2);
    TORCH_CHECK(partial.is_contiguous() && partial.sizes() == x.sizes(), "deposit_backward: a partial sum like x");
  }
  TORCH_CHECK(static_cast<int64_t>(ahead_weights.size()) == ahead * readers &&
                  static_cast<int64_t>(ahead_logit_rows.size()) == ahead * readers && (ahead == 0 || readers > 0),
              "deposit_backward: a weight row and a logit row per ahead slot and reader, and readers to share");
  std::vector<const float*> G, S, W, O, AX, AW;
  std::vector<float*> C, LG, ALG, AP;
  for (int64_t q = 0; q < readers; ++q) {
    check(grads[q], "grad", 2), check(weights[q], "weights", 1);
    if (dots_out[q].numel() > 0) check(dots_out[q], "dots_out", 1);
    if (outs[q].numel() > 0) {
      check(outs[q], "out", 2);
      TORCH_CHECK(outs[q].is_contiguous() && outs[q].sizes() == x.sizes() && dots_out[q].numel() == n,
                  "deposit_backward: a reader's output is (N, D), with a c row to form");
    }
    O.push_back(outs[q].numel() > 0 ? outs[q].data_ptr<float>() : nullptr);
    if (scales[q].numel() > 0) {
      check(scales[q], "scale", 1);
      TORCH_CHECK(scales[q].size(0) == n, "deposit_backward: a scale per token");
    }
    S.push_back(scales[q].numel() > 0 ? scales[q].data_ptr<float>() : nullptr);
    TORCH_CHECK(grads[q].is_contiguous() && grads[q].size(0) == n && grads[q].size(1) == d &&
                    weights[q].size(0) == n && (dots_out[q].numel() == 0 || dots_out[q].size(0) == n) &&
                    reader_rows[q] >= 0 && reader_rows[q] < queries,
                "deposit_backward: reader rows must match the slot");
    G.push_back(grads[q].data_ptr<float>()), W.push_back(weights[q].data_ptr<float>());
    const bool logit = dots_out[q].numel() > 0;
    C.push_back(logit ? dots_out[q].data_ptr<float>() : nullptr);
    LG.push_back(logit ? logit_rows.data_ptr<float>() + reader_rows[q] * logit_rows.stride(0) : nullptr);
  }
  std::vector<torch::Tensor> result = {torch::empty_like(x), torch::empty({queries, n}, x.options())};
  for (int64_t a = 0; a < ahead; ++a) {
    check(ahead_x[a], "ahead_x", 2);
    TORCH_CHECK(ahead_x[a].is_contiguous() && ahead_x[a].sizes() == x.sizes(), "deposit_backward: ahead slots like x");
    AX.push_back(ahead_x[a].data_ptr<float>());
    result.push_back(torch::empty_like(x));
    AP.push_back(result.back().data_ptr<float>());
    for (int64_t q = 0; q < readers; ++q) {
      const torch::Tensor &aw = ahead_weights[a * readers + q], &al = ahead_logit_rows[a * readers + q];
      check(aw, "ahead_weights", 1), check(al, "ahead_logit_rows", 1);
      TORCH_CHECK(aw.size(0) == n && al.size(0) == n, "deposit_backward: ahead rows must match the slot");
      AW.push_back(aw.data_ptr<float>()), ALG.push_back(al.data_ptr<float>());
    }
  }
  const float *X = x.data_ptr<float>(), *LR = logit_rows.data_ptr<float>(), *Z = logits.data_ptr<float>();
  const float *R = r.data_ptr<float>(), *U = u.data_ptr<float>(), *PS = summed ? partial.data_ptr<float>() : nullptr;
  float *DX = result[0].data_ptr<float>(), *DZ = result[1].data_ptr<float>();
  const int64_t ls = logit_rows.stride(0), zs = logits.stride(0), first = summed ? 1 : 0;
  const float inv_d = 1.f / static_cast<float>(d);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    // dx_t = partial_t + sum_q (w_q s_q) g_q + sum_q dz_q u_q + coef x_t: the rows and their coefficients, for combine
    const int64_t terms = first + readers + queries + 1;
    std::vector<const float*> rows(terms);
    std::vector<float> coefs(terms), ahead_coefs(ahead * readers);
    for (int64_t q = 0; q < queries; ++q) rows[first + readers + q] = U + q * d;
    if (summed) coefs[0] = 1.f;
    for (int64_t t = begin; t < end; ++t) {
      const float* xt = X + t * d;
      if (summed) rows[0] = PS + t * d;
      for (int64_t q = 0; q < readers; ++q) {
        const float* gt = G[q] + t * d;
        const float s = S[q] ? S[q][t] : 1.f, w = W[q][t];
        if (O[q]) C[q][t] = dot(O[q] + t * d, gt, d);
        if (C[q]) LG[q][t] += w * (s * dot(xt, gt, d) - C[q][t]);
        rows[first + q] = gt, coefs[first + q] = w * s;
        for (int64_t a = 0; a < ahead; ++a) {
          const int64_t aq = a * readers + q;
          const float wa = AW[aq][t];
          if (C[q]) ALG[aq][t] += wa * (s * dot(AX[a] + t * d, gt, d) - C[q][t]);
          ahead_coefs[aq] = wa * s;
        }
      }
      const float rt = R[t];
      float zsum = 0.f;
      for (int64_t q = 0; q < queries; ++q) {
        const float dz = LR[q * ls + t] * rt;
        DZ[q * n + t] = dz, coefs[first + readers + q] = dz;
        zsum += dz * Z[q * zs + t];
      }
      rows[terms - 1] = xt, coefs[terms - 1] = -zsum * rt * inv_d;
      combine(DX + t * d, rows.data(), coefs.data(), terms, d);
      for (int64_t a = 0; a < ahead; ++a)
        combine(AP[a] + t * d, rows.data() + first, ahead_coefs.data() + a * readers, readers, d);
    }
  });
  return result;
}

// RMSNorm's backward, y = x * r * w with r = 1 / sqrt(mean(x^2) + eps) (the forward is torch's, which also returns r):
// g, x (N, D), r (N), w (D) -> dx = r * (g w - x * r^2 * mean(g w x)) (N, D) and dw = sum over tokens of g x r (D).
// Autograd differentiates torch's composite forward op by op, about ten passes over (N, D) tensors; this is one pass
// for dx and one for dw, summed token by token in token order with its columns split over the threads (as du above).
std::vector<torch::Tensor> rms_norm_backward(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& r,
                                             const torch::Tensor& w) {
  check(g, "g", 2), check(x, "x", 2), check(r, "r", 1), check(w, "w", 1);
  const int64_t n = x.size(0), d = x.size(1);
  TORCH_CHECK(g.is_contiguous() && x.is_contiguous() && r.is_contiguous() && w.is_contiguous() && g.size(0) == n &&
                  g.size(1) == d && r.size(0) == n && w.size(0) == d,
              "rms_norm_backward: contiguous g, x (N, D), r (N) and w (D) expected");
  torch::Tensor dx = torch::empty_like(x), dw = torch::zeros({d}, x.options());
  const float *G = g.data_ptr<float>(), *X = x.data_ptr<float>(), *R = r.data_ptr<float>(), *W = w.data_ptr<float>();
  float *DX = dx.data_ptr<float>(), *DW = dw.data_ptr<float>();
  const float inv_d = 1.f / static_cast<float>(d);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *gt = G + t * d, *xt = X + t * d;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < d; ++i) s += gt[i] * W[i] * xt[i];
      const float rt = R[t], c = s * rt * rt * inv_d;
      float* dxt = DX + t * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) dxt[i] = rt * (gt[i] * W[i] - c * xt[i]);
    }
  });
  at::parallel_for(0, d, kColumns, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < n; ++t) {
      const float *gt = G + t * d, *xt = X + t * d;
      const float rt = R[t];
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) DW[i] += gt[i] * (xt[i] * rt);
    }
  });
  return {dx, dw};
}

// attention.cpp: the token attention's causal forward and backward (one build, one module)
std::vector<torch::Tensor> attention_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             double scale);
std::vector<torch::Tensor> attention_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              const torch::Tensor& out, const torch::Tensor& lse,
                                              const torch::Tensor& dout, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("deposit_forward", &deposit_forward, "deposit a completed source into its slot (CPU, fp32)");
  m.def("phase1_forward", &phase1_forward, "phase 1, forward (CPU, fp32)");
  m.def("slot_backward", &slot_backward, "phase 1, backward of one query (CPU, fp32)");
  m.def("merge_forward", &merge_forward, "phase-2 merge, forward (CPU, fp32)");
  m.def("merge_backward", &merge_backward, "phase-2 merge, backward (CPU, fp32)");
  m.def("rms_norm_backward", &rms_norm_backward, "RMSNorm, backward (CPU, fp32)");
  m.def("merge_backward_kept", &merge_backward_kept, "phase-2 merge, backward, its slots' share left (CPU, fp32)");
  m.def("deposit_backward", &deposit_backward, "a slot's backward: its readers' share and its logits (CPU, fp32)");
  m.def("attention_forward", &attention_forward, "causal token attention, forward (CPU, fp32)");
  m.def("attention_backward", &attention_backward, "causal token attention, backward (CPU, fp32)");
}
