#include "kvtier/reference_worker/tiny_transformer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/numeric.h"

namespace kvtier::reference_worker {
namespace {

using kernels::Bf16ToFloat;
using kernels::FloatToBf16;

// splitmix64: a fixed, platform-independent stream (std::uniform_real_distribution is not).
uint64_t NextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// rows * cols values uniform in [-limit, limit), limit = sqrt(3 / fan_in): unit-variance outputs.
std::vector<float> RandomMatrix(uint64_t& state, int64_t rows, int64_t cols, double fan_in) {
  const float limit = static_cast<float>(std::sqrt(3.0 / fan_in));
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& v : m) {
    const float u = static_cast<float>(NextRandom(state) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    v = (2.0f * u - 1.0f) * limit;
  }
  return m;
}

// out = x / rms(x) * gain, sum of squares in index order.
void RmsNorm(const float* x, const float* gain, int32_t d, float eps, float* out) {
  float sum_sq = 0.0f;
  for (int32_t i = 0; i < d; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
  for (int32_t i = 0; i < d; ++i) out[i] = x[i] * inv * gain[i];
}

// y[cols] = x[rows] . w[rows][cols]; each y[j] accumulates over i in increasing order.
void MatVec(const float* x, const float* w, int32_t rows, int32_t cols, float* y) {
  std::fill(y, y + cols, 0.0f);
  for (int32_t i = 0; i < rows; ++i) {
    const float xi = x[i];
    const float* row = w + static_cast<int64_t>(i) * cols;
    for (int32_t j = 0; j < cols; ++j) y[j] += xi * row[j];
  }
}

// Rotates each head of `v` (num_heads * head_dim) by position: the "rotate half" form of Llama, pairing
// element i with i + head_dim / 2.
void ApplyRope(const std::vector<float>& cos_t, const std::vector<float>& sin_t, int32_t num_heads, int32_t head_dim,
               float* v) {
  const int32_t half = head_dim / 2;
  for (int32_t h = 0; h < num_heads; ++h) {
    float* x = v + static_cast<int64_t>(h) * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos_t[i] - b * sin_t[i];
      x[i + half] = b * cos_t[i] + a * sin_t[i];
    }
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

absl::StatusOr<TinyTransformer> TinyTransformer::Create(const ModelConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  TinyTransformer m(config);
  const int32_t d = config.d_model, qd = config.num_heads * config.head_dim,
                kvd = config.num_kv_heads * config.head_dim, f = config.ffn_dim;
  uint64_t state = config.seed;
  m.embedding_ = RandomMatrix(state, config.vocab_size, d, 1.0);
  for (int32_t l = 0; l < config.num_layers; ++l) {
    Layer layer;
    layer.attn_norm.assign(d, 1.0f);
    layer.wq = RandomMatrix(state, d, qd, d);
    layer.wk = RandomMatrix(state, d, kvd, d);
    layer.wv = RandomMatrix(state, d, kvd, d);
    layer.wo = RandomMatrix(state, qd, d, qd);
    layer.mlp_norm.assign(d, 1.0f);
    layer.w_gate = RandomMatrix(state, d, f, d);
    layer.w_up = RandomMatrix(state, d, f, d);
    layer.w_down = RandomMatrix(state, f, d, f);
    m.layers_.push_back(std::move(layer));
  }
  m.final_norm_.assign(d, 1.0f);
  m.lm_head_ = RandomMatrix(state, d, config.vocab_size, d);
  for (int32_t i = 0; i < config.head_dim / 2; ++i) {
    m.rope_inv_freq_.push_back(
        static_cast<float>(std::pow(static_cast<double>(config.rope_theta), -2.0 * i / config.head_dim)));
  }
  return m;
}

absl::StatusOr<std::vector<float>> TinyTransformer::Prefill(std::span<const uint32_t> tokens, int32_t start,
                                                            std::span<const int32_t> page_table,
                                                            PagedKvCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (start < 0 || start >= n) {
    return absl::InvalidArgumentError(absl::StrCat("start is ", start, ", want [0, ", n, ")"));
  }
  if (cache.num_layers() != c.num_layers || cache.num_kv_heads() != c.num_kv_heads || cache.head_dim() != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("cache has ", cache.num_layers(), " layers x ", cache.num_kv_heads(),
                                                   " kv heads x ", cache.head_dim(), ", model wants ", c.num_layers,
                                                   " x ", c.num_kv_heads, " x ", c.head_dim));
  }
  if (static_cast<int64_t>(page_table.size()) * cache.page_size() < n) {
    return absl::InvalidArgumentError(absl::StrCat("page table of ", page_table.size(), " pages of ", cache.page_size(),
                                                   " tokens is short of ", n, " tokens"));
  }
  for (int64_t t = start; t < n; ++t) {
    if (tokens[t] >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", t, " is ", tokens[t], ", want < vocab_size ", c.vocab_size));
    }
  }

  const int32_t d = c.d_model, hd = c.head_dim, qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
  const int32_t group = c.num_heads / c.num_kv_heads, half = hd / 2;
  const int64_t chunk = n - start;
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Residual stream of the chunk, and per-position RoPE tables.
  std::vector<float> x(static_cast<size_t>(chunk * d));
  for (int64_t t = 0; t < chunk; ++t) {
    std::copy_n(embedding_.data() + static_cast<int64_t>(tokens[start + t]) * d, d, x.data() + t * d);
  }
  std::vector<std::vector<float>> cos_t(chunk, std::vector<float>(half)), sin_t(chunk, std::vector<float>(half));
  for (int64_t t = 0; t < chunk; ++t) {
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(start + t) * rope_inv_freq_[i];
      cos_t[t][i] = static_cast<float>(std::cos(angle));
      sin_t[t][i] = static_cast<float>(std::sin(angle));
    }
  }

  std::vector<float> h(d), q(static_cast<size_t>(chunk * qd)), k(kvd), v(kvd), attn(qd), o(d);
  std::vector<float> gate(c.ffn_dim), up(c.ffn_dim), scores(static_cast<size_t>(n));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const Layer& w = layers_[l];
    // Q for the chunk; K and V rounded to bf16 and written to the cache before any query reads them.
    for (int64_t t = 0; t < chunk; ++t) {
      const int32_t pos = static_cast<int32_t>(start + t);
      RmsNorm(x.data() + t * d, w.attn_norm.data(), d, c.rms_eps, h.data());
      float* qt = q.data() + t * qd;
      MatVec(h.data(), w.wq.data(), d, qd, qt);
      MatVec(h.data(), w.wk.data(), d, kvd, k.data());
      MatVec(h.data(), w.wv.data(), d, kvd, v.data());
      ApplyRope(cos_t[t], sin_t[t], c.num_heads, hd, qt);
      ApplyRope(cos_t[t], sin_t[t], c.num_kv_heads, hd, k.data());
      for (int32_t g = 0; g < c.num_kv_heads; ++g) {
        uint16_t* krow = cache.Row(l, 0, page_table, pos, g);
        uint16_t* vrow = cache.Row(l, 1, page_table, pos, g);
        for (int32_t e = 0; e < hd; ++e) {
          krow[e] = FloatToBf16(k[g * hd + e]);
          vrow[e] = FloatToBf16(v[g * hd + e]);
        }
      }
    }
    // Causal attention of each chunk position over cache positions 0..pos, then the MLP.
    for (int64_t t = 0; t < chunk; ++t) {
      const int32_t pos = static_cast<int32_t>(start + t);
      for (int32_t head = 0; head < c.num_heads; ++head) {
        const int32_t g = head / group;
        const float* qh = q.data() + t * qd + static_cast<int64_t>(head) * hd;
        float max_score = -INFINITY;
        for (int32_t j = 0; j <= pos; ++j) {
          const uint16_t* krow = cache.Row(l, 0, page_table, j, g);
          float s = 0.0f;
          for (int32_t e = 0; e < hd; ++e) s += qh[e] * Bf16ToFloat(krow[e]);
          scores[j] = s * score_scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int32_t j = 0; j <= pos; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        float* out = attn.data() + static_cast<int64_t>(head) * hd;
        std::fill(out, out + hd, 0.0f);
        for (int32_t j = 0; j <= pos; ++j) {
          const uint16_t* vrow = cache.Row(l, 1, page_table, j, g);
          const float p = scores[j];
          for (int32_t e = 0; e < hd; ++e) out[e] += p * Bf16ToFloat(vrow[e]);
        }
        const float inv_sum = 1.0f / sum;
        for (int32_t e = 0; e < hd; ++e) out[e] *= inv_sum;
      }
      float* xt = x.data() + t * d;
      MatVec(attn.data(), w.wo.data(), qd, d, o.data());
      for (int32_t i = 0; i < d; ++i) xt[i] += o[i];
      RmsNorm(xt, w.mlp_norm.data(), d, c.rms_eps, h.data());
      MatVec(h.data(), w.w_gate.data(), d, c.ffn_dim, gate.data());
      MatVec(h.data(), w.w_up.data(), d, c.ffn_dim, up.data());
      for (int32_t i = 0; i < c.ffn_dim; ++i) gate[i] = Silu(gate[i]) * up[i];
      MatVec(gate.data(), w.w_down.data(), c.ffn_dim, d, o.data());
      for (int32_t i = 0; i < d; ++i) xt[i] += o[i];
    }
  }
  RmsNorm(x.data() + (chunk - 1) * d, final_norm_.data(), d, c.rms_eps, h.data());
  std::vector<float> logits(c.vocab_size);
  MatVec(h.data(), lm_head_.data(), d, c.vocab_size, logits.data());
  return logits;
}

double TinyTransformer::PrefillMacs(int64_t start, int64_t end) const {
  const ModelConfig& c = config_;
  const double qd = double{1} * c.num_heads * c.head_dim, kvd = double{1} * c.num_kv_heads * c.head_dim;
  const double per_token = c.d_model * (qd + 2 * kvd) + qd * c.d_model + 3.0 * c.d_model * c.ffn_dim;
  double macs = 0;
  for (int64_t t = start; t < end; ++t) {
    macs += c.num_layers * (per_token + 2.0 * qd * static_cast<double>(t + 1));  // + QK^T and PV
  }
  return macs + static_cast<double>(c.d_model) * c.vocab_size;
}

}  // namespace kvtier::reference_worker
