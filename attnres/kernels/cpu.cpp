// The two-phase depth attention's token-wise work on CPU, fp32: the deposit of a completed source, phase 1 (forward,
// and the backward of a block's first query) and the phase-2 merge (forward and backward), one pass over each
// token's rows; and RMSNorm's backward (every variant's sublayers and final norm), at its end. (The deposit's backward stays in torch ops: it is mostly a (tokens, Q) x (Q, D) product, which BLAS
// does well, and a kernel for it measured no faster.)
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
#include <vector>

namespace {

void check(const torch::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, name, " must be a CPU float32 tensor");
  TORCH_CHECK(x.dim() == dim && x.stride(-1) == 1, name, " must have ", dim, " dims, the last contiguous");
}

constexpr int64_t kGrain = 64;    // tokens per task: 64 rows of D floats per stream
constexpr int64_t kColumns = 16;  // columns per task of a sum over the tokens: one 64-byte cache line of a row

inline float dot(const float* a, const float* b, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
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
// logit_grad (k, N) rows of this query. Adds the softmax's backward to logit_grad and, with scatter, keep * weights[j]
// * dh to value_grad[j] (without: the slots gather that later, gather_backward; value_grad is not read). Returns dp
// (N, D) (including dp_later) and du (D).
std::vector<torch::Tensor> merge_backward(const torch::Tensor& dh, const torch::Tensor& p,
                                          const torch::Tensor& dp_later, const torch::Tensor& u,
                                          const torch::Tensor& weights, const torch::Tensor& values,
                                          torch::Tensor value_grad, const torch::Tensor& r, const torch::Tensor& logit,
                                          const torch::Tensor& keep, torch::Tensor logit_grad, bool scatter) {
  check(dh, "dh", 2), check(p, "p", 2), check(dp_later, "dp_later", 2), check(u, "u", 1);
  check(weights, "weights", 2), check(values, "values", 3);
  check(r, "r", 1), check(logit, "logit", 1), check(keep, "keep", 1), check(logit_grad, "logit_grad", 2);
  const int64_t n = dh.size(0), d = dh.size(1), k = weights.size(0);
  TORCH_CHECK(dh.is_contiguous() && p.is_contiguous() && dp_later.is_contiguous(), "merge_backward: contiguous rows");
  TORCH_CHECK(values.stride(1) == d && weights.stride(1) == 1 && logit_grad.stride(1) == 1,
              "merge_backward: slot rows must be contiguous");
  if (scatter) {
    check(value_grad, "value_grad", 3);
    TORCH_CHECK(value_grad.stride(1) == d, "merge_backward: slot rows must be contiguous");
  }
  TORCH_CHECK(k <= 64, "merge_backward: at most 64 slots");
  torch::Tensor dp = torch::empty_like(dh);
  torch::Tensor du = torch::zeros({d}, dh.options()), a_of = torch::empty({n}, dh.options());
  const float *DH = dh.data_ptr<float>(), *P = p.data_ptr<float>(), *DL = dp_later.data_ptr<float>();
  const float *U = u.data_ptr<float>(), *W = weights.data_ptr<float>(), *V = values.data_ptr<float>();
  const float *R = r.data_ptr<float>(), *G = logit.data_ptr<float>(), *K = keep.data_ptr<float>();
  float *VG = scatter ? value_grad.data_ptr<float>() : nullptr, *LG = logit_grad.data_ptr<float>();
  float *DP = dp.data_ptr<float>(), *DU = du.data_ptr<float>(), *A = a_of.data_ptr<float>();
  const int64_t ws = weights.stride(0), vs = values.stride(0), ls = logit_grad.stride(0);
  const int64_t gs = scatter ? value_grad.stride(0) : 0;
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
        if (scatter) {
          float* gt = VG + j * gs + t * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) gt[i] += coef * dht[i];
        }
      }
      const float a = -dscore * rt, c = dscore * G[t] * rt * rt * inv_d;
      A[t] = a;
      const float* lt = DL + t * d;
      float* dpt = DP + t * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) dpt[i] = lt[i] + rest * dht[i] + a * U[i] + c * pt[i];
    }
  });
  // du = sum_t a_t p_t in token order: a sum split over the tokens' threads (one partial row per thread, as before)
  // depends on the thread count, and made a run's depth-query gradients, so its losses, differ between 1 and 2
  // threads. One more pass over p, its columns shared out; one thread gives the bits it gave before.
  at::parallel_for(0, d, kColumns, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < n; ++t) {
      const float a = A[t];
      const float* pt = P + t * d;
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) DU[i] += a * pt[i];
    }
  });
  return {dp, du};
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
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t q = 0; q < s_n; ++q) {
        const float* sc = SC + q * ss + t * sn;
        float top = sc[0];
        for (int64_t j = 1; j < k; ++j) top = std::max(top, sc[j * sk]);
        float total = 0.f;
        for (int64_t j = 0; j < k; ++j) total += std::exp(sc[j * sk] - top);
        const float l = top + std::log(total);
        LSE[q * n + t] = l;
        for (int64_t j = 0; j < k; ++j) {
          w[j] = std::exp(sc[j * sk] - l);
          W[(q * k + j) * n + t] = w[j];
        }
        float* ot = out_ptrs[q] + t * d;
        const float* v0 = V + t * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) ot[i] = w[0] * v0[i];
        for (int64_t j = 1; j < k; ++j) {
          const float* vj = V + j * vs + t * d;
          const float wj = w[j];
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) ot[i] += wj * vj[i];
        }
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

// A slot's share of its readers' backward, formed when the slot's own backward runs (every reader's has). Reader q's
// output got the gradient s_q g_q, g_q (N, D) with scale s_q (N) (a merge's keep; empty: 1); its softmax weight on
// this slot is w_q (N). Returns dx = sum_q w_q s_q g_q (N, D), summed in the readers' order. A reader that left its
// logits' gradient to the slot (a block's first query) gives c_q = <out_q, g_q> (N): this adds w_q (<x, g_q> - c_q)
// to its logit-gradient row; a merge, which forms its logits' gradient itself, gives an empty c_q. Each token's slot row and gradient row stay in L1 while every reader's row is read once: a third of
// the traffic of adding each reader's share into a slot-gradient buffer as it comes (slot_backward, merge_backward).
torch::Tensor gather_backward(const torch::Tensor& x, const std::vector<torch::Tensor>& grads,
                              const std::vector<torch::Tensor>& scales, const std::vector<torch::Tensor>& weights,
                              const std::vector<torch::Tensor>& dots_out, std::vector<torch::Tensor> logit_grads) {
  check(x, "x", 2);
  const int64_t n = x.size(0), d = x.size(1), readers = static_cast<int64_t>(grads.size());
  TORCH_CHECK(x.is_contiguous() && readers >= 1 && static_cast<int64_t>(weights.size()) == readers &&
                  static_cast<int64_t>(scales.size()) == readers &&
                  static_cast<int64_t>(dots_out.size()) == readers &&
                  static_cast<int64_t>(logit_grads.size()) == readers,
              "gather_backward: a contiguous slot and one gradient, weight row, dot and logit row per reader");
  std::vector<const float*> G, S, W, C;
  std::vector<float*> LG;
  for (int64_t q = 0; q < readers; ++q) {
    check(grads[q], "grad", 2), check(weights[q], "weights", 1);
    if (dots_out[q].numel() > 0) check(dots_out[q], "dots_out", 1);
    if (scales[q].numel() > 0) {
      check(scales[q], "scale", 1);
      TORCH_CHECK(scales[q].size(0) == n, "gather_backward: a scale per token");
    }
    S.push_back(scales[q].numel() > 0 ? scales[q].data_ptr<float>() : nullptr);
    check(logit_grads[q], "logit_grad", 1);
    TORCH_CHECK(grads[q].is_contiguous() && grads[q].size(0) == n && grads[q].size(1) == d &&
                    weights[q].size(0) == n && (dots_out[q].numel() == 0 || dots_out[q].size(0) == n) &&
                    (dots_out[q].numel() == 0 || logit_grads[q].size(0) == n),
                "gather_backward: reader rows must match the slot");
    G.push_back(grads[q].data_ptr<float>()), W.push_back(weights[q].data_ptr<float>());
    const bool logits = dots_out[q].numel() > 0;
    C.push_back(logits ? dots_out[q].data_ptr<float>() : nullptr);
    LG.push_back(logits ? logit_grads[q].data_ptr<float>() : nullptr);
  }
  torch::Tensor dx = torch::empty_like(x);
  const float* X = x.data_ptr<float>();
  float* DX = dx.data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xt = X + t * d;
      float* dxt = DX + t * d;
      for (int64_t q = 0; q < readers; ++q) {
        const float* gt = G[q] + t * d;
        const float s = S[q] ? S[q][t] : 1.f, w = W[q][t], ws = w * s;
        if (C[q]) LG[q][t] += w * (s * dot(xt, gt, d) - C[q][t]);
        if (q == 0) {
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) dxt[i] = ws * gt[i];
        } else {
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) dxt[i] += ws * gt[i];
        }
      }
    }
  });
  return dx;
}

// <a_t, b_t> for each row t of a, b (N, D): a query's <out, g> for gather_backward.
torch::Tensor row_dots(const torch::Tensor& a, const torch::Tensor& b) {
  check(a, "a", 2), check(b, "b", 2);
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && a.sizes() == b.sizes(), "row_dots: two contiguous (N, D)");
  const int64_t n = a.size(0), d = a.size(1);
  torch::Tensor out = torch::empty({n}, a.options());
  const float *A = a.data_ptr<float>(), *B = b.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) O[t] = dot(A + t * d, B + t * d, d);
  });
  return out;
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("deposit_forward", &deposit_forward, "deposit a completed source into its slot (CPU, fp32)");
  m.def("phase1_forward", &phase1_forward, "phase 1, forward (CPU, fp32)");
  m.def("slot_backward", &slot_backward, "phase 1, backward of one query (CPU, fp32)");
  m.def("merge_forward", &merge_forward, "phase-2 merge, forward (CPU, fp32)");
  m.def("merge_backward", &merge_backward, "phase-2 merge, backward (CPU, fp32)");
  m.def("rms_norm_backward", &rms_norm_backward, "RMSNorm, backward (CPU, fp32)");
  m.def("gather_backward", &gather_backward, "Full AttnRes: a slot's share of its readers' backward (CPU, fp32)");
  m.def("row_dots", &row_dots, "row-wise dot products (CPU, fp32)");
}
