#include "engine/dsv4_cpu.h"

#include <cmath>
#include <vector>

#include "engine/activation.h"

namespace engine::dsv4 {

void hc_weights(const float* m, const HcOpts& o, float* pc) {
  const int hc = o.hc;
  const float *sc = o.scale.f32(), *b = o.base.f32();
  for (int h = 0; h < hc; ++h) pc[h] = sigmoid(m[hc + h] * sc[1] + b[hc + h]) * 2.0f;
  float* comb = pc + hc;
  for (int src = 0; src < hc; ++src) {
    float mx = -INFINITY;
    for (int dst = 0; dst < hc; ++dst) {
      const int i = dst + hc * src;
      comb[i] = m[2 * hc + i] * sc[2] + b[2 * hc + i];
      mx = std::max(mx, comb[i]);
    }
    float sum = 0.0f;
    for (int dst = 0; dst < hc; ++dst) {
      const int i = dst + hc * src;
      comb[i] = std::exp(comb[i] - mx);
      sum += comb[i];
    }
    const float inv = 1.0f / sum;
    for (int dst = 0; dst < hc; ++dst) comb[dst + hc * src] = comb[dst + hc * src] * inv + o.eps;
  }
  auto norm_cols = [&] {  // per dst, over src
    for (int dst = 0; dst < hc; ++dst) {
      float sum = o.eps;
      for (int src = 0; src < hc; ++src) sum += comb[dst + hc * src];
      const float inv = 1.0f / sum;
      for (int src = 0; src < hc; ++src) comb[dst + hc * src] *= inv;
    }
  };
  auto norm_rows = [&] {  // per src, over dst
    for (int src = 0; src < hc; ++src) {
      float sum = o.eps;
      for (int dst = 0; dst < hc; ++dst) sum += comb[dst + hc * src];
      const float inv = 1.0f / sum;
      for (int dst = 0; dst < hc; ++dst) comb[dst + hc * src] *= inv;
    }
  };
  norm_cols();
  for (int i = 1; i < o.sinkhorn_iters; ++i) norm_rows(), norm_cols();
}

template <typename E>
void compress(Pool<E>& c, const Dsv4AttnOpts& o, const Tensor& ape, const Tensor& norm,
              const float* kv, const float* score, int64_t p) {
  const int64_t r = o.ratio, d = c.dim, w = c.width;
  const int64_t slot = p % c.slots;
  std::copy_n(kv, w, c.kv + slot * w);
  const float* bias = ape.f32() + (p % r) * w;
  for (int64_t i = 0; i < w; ++i) c.score[slot * w + i] = score[i] + bias[i];
  if ((p + 1) % r != 0) return;
  const int64_t blk = p / r, start = blk * r;
  const bool overlap = w == 2 * d;
  const int64_t n = overlap ? 2 * r : r;
  std::vector<float> v(n), s(n), ent(d), e(d);
  for (int64_t ch = 0; ch < d; ++ch) {
    for (int64_t j = 0; j < n; ++j) {
      int64_t pos = start + j, off = ch;
      if (overlap) pos = j < r ? start - r + j : start + j - r, off = j < r ? ch : d + ch;
      if (pos < 0) {
        v[j] = 0.0f, s[j] = -INFINITY;
        continue;
      }
      const int64_t sl = pos % c.slots;
      v[j] = c.kv[sl * w + off], s[j] = c.score[sl * w + off];
    }
    kernels::softmax(s.data(), n);
    double acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += double(v[j] * s[j]);
    ent[ch] = static_cast<float>(acc);
  }
  kernels::rms_norm(ent.data(), norm.f32(), e.data(), d, o.eps);
  kernels::rope(e.data() + d - o.n_rot, o.n_rot, o.n_rot, start, o.rope.base, o.rope.neox,
                o.rope.yarn);
  narrow(e.data(), c.entries + blk * d, d);
}

template void compress<float>(Pool<float>&, const Dsv4AttnOpts&, const Tensor&, const Tensor&,
                              const float*, const float*, int64_t);
template void compress<uint16_t>(Pool<uint16_t>&, const Dsv4AttnOpts&, const Tensor&, const Tensor&,
                                 const float*, const float*, int64_t);

}  // namespace engine::dsv4
