// The sampler's vocabulary-wide work for one denoising step as one CPU kernel (an XLA FFI custom call).
//
// Per position (a row of V float32 logits) and inverse temperature 1/t: the first arg-max of the logits; the
// entropy of softmax(logits / t); one draw from that distribution by inverse CDF, given a uniform in [0, 1);
// and optionally the distribution itself (float32 or bfloat16), which the next step self-conditions on. The
// formulas are those of `dgemma.sampling.acceptance.analyse` (XLA), the reference the tests compare against.
// Each row is read once for its maximum and once for exp((logits - max) / t) with its sums; the rest reads the
// exponentials back while they are still in cache. XLA:CPU runs the same work as five or six passes over
// memory, one kernel each.
//
// Written with GCC / Clang vector extensions of 16 float lanes: AVX-512 registers where -march=native has them,
// pairs of AVX2 registers (or narrower) elsewhere.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;
typedef float F __attribute__((vector_size(4 * kLanes)));
typedef int32_t I __attribute__((vector_size(4 * kLanes)));
typedef uint32_t U __attribute__((vector_size(4 * kLanes)));
typedef uint16_t H __attribute__((vector_size(2 * kLanes)));

inline F Load(const float* p) { F v; std::memcpy(&v, p, sizeof v); return v; }
inline void Store(float* p, F v) { std::memcpy(p, &v, sizeof v); }
inline F Splat(float x) { return F{} + x; }
inline float Sum(F v) { float s = 0.0f; for (int j = 0; j < kLanes; ++j) s += v[j]; return s; }

// exp(x) for x <= 0: 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 (Cody-Waite: ln 2 in two parts, so r
// is exact to float32 rounding even for large |x|), |r| <= ln(2) / 2, e^r by its Taylor polynomial of degree 7
// (truncation error < 1e-8 relative). Results below 2^-126, float32's smallest normal, are 0, as XLA:CPU gives
// with denormals flushed.
inline F ExpNonPositive(F x) {
  F t = x * 1.44269504088896341f;
  t = t < Splat(-126.0f) ? Splat(-127.0f) : t;  // (then r may be huge, but the result is replaced by 0 below)
  const F magic = Splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds |t| < 2^22 to an integer
  const F n = (t + magic) - magic;
  const F r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln 2 = 0.693359375 - 2.12194440e-4
  const F p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 +
              r * (1.0f / 5040)))))));
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  return n <= Splat(-127.0f) ? Splat(0.0f) : p * (F)bits;  // (a vector cast reinterprets the bits)
}

// float32 -> bfloat16, rounding to nearest even (the inputs are finite probabilities).
inline H ToBf16(F x) {
  U b = (U)x;  // the bits
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return __builtin_convertvector(b, H);
}

enum Probs { kNone, kF32, kBf16 };

struct RowStats {
  int32_t argmax, sample;
  float entropy;
};

// One row of `v` logits. `block` (a multiple of kLanes dividing v) is the inverse CDF's first level, as the
// reference's; `scratch` holds v + 2 * (v / block) floats.
template <Probs kProbs>
RowStats Row(const float* logits, int64_t v, int64_t block, float uniform, float inv_t, float* scratch,
             void* probs) {
  // The maximum and its first index: per lane, the first index at which the lane's maximum was reached.
  F m = Load(logits);
  I iota, at;
  for (int j = 0; j < kLanes; ++j) iota[j] = j;
  at = iota;
  for (int64_t i = kLanes; i < v; i += kLanes) {
    F x = Load(logits + i);
    I greater = x > m;
    m = greater ? x : m;
    at = greater ? iota + static_cast<int32_t>(i) : at;
  }
  float top = m[0];
  for (int j = 1; j < kLanes; ++j) top = m[j] > top ? m[j] : top;
  int32_t argmax = std::numeric_limits<int32_t>::max();
  for (int j = 0; j < kLanes; ++j)
    if (m[j] == top && at[j] < argmax) argmax = at[j];
  if (argmax >= v) argmax = static_cast<int32_t>(v - 1);  // a NaN top matches no lane (the reference clamps too)

  // z = max((logits - top) / t, lowest), so that a -inf logit adds 0 * finite (not NaN) to the entropy's sum,
  // while a NaN stays NaN (a NaN logit, +inf - +inf, -inf - -inf): then the entropy is NaN, as in the reference,
  // and the step accepts nothing there. e = exp(z), kept in scratch; the block masses and sum(e * z) in the same
  // pass. H = log Z - sum(e * z) / Z.
  const int64_t nb = v / block;
  float* e = scratch;
  float* mass = scratch + v;
  float* cdf = mass + nb;
  const F lowest = Splat(std::numeric_limits<float>::lowest());
  const F top_v = Splat(top), inv_t_v = Splat(inv_t);
  F weighted_v = Splat(0.0f);
  float total = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    F mass_v = Splat(0.0f);
    for (int64_t i = b * block; i < (b + 1) * block; i += kLanes) {
      F z = (Load(logits + i) - top_v) * inv_t_v;
      z = z < lowest ? lowest : z;
      F x = ExpNonPositive(z);
      Store(e + i, x);
      mass_v += x;
      weighted_v += x * z;
    }
    mass[b] = Sum(mass_v);
    total += mass[b];
    cdf[b] = total;
  }
  const float entropy = std::log(total) - Sum(weighted_v) / total;

  // Inverse CDF in two levels, as the reference: the block whose cumulative mass first exceeds the target
  // (clamped to the last block with mass), then the token inside it (clamped to its last token with mass).
  const float target = uniform * total;
  int64_t last_block = nb - 1;
  while (last_block > 0 && !(mass[last_block] > 0.0f)) --last_block;
  int64_t blk = 0;
  while (blk < nb && cdf[blk] <= target) ++blk;
  blk = std::min(blk, last_block);
  float running = blk > 0 ? cdf[blk - 1] : 0.0f;
  const float* eb = e + blk * block;
  int64_t last_nonzero = block - 1;
  while (last_nonzero > 0 && !(eb[last_nonzero] > 0.0f)) --last_nonzero;
  int64_t within = 0;
  for (int64_t i = 0; i < block; i += kLanes) {  // whole groups of 16 while the running sum stays <= target
    const float group = Sum(Load(eb + i));
    if (running + group <= target) {
      running += group;
      within += kLanes;
      continue;
    }
    for (int j = 0; j < kLanes; ++j) {
      running += eb[i + j];
      if (!(running <= target)) break;
      ++within;
    }
    break;
  }
  within = std::min(within, last_nonzero);

  if constexpr (kProbs != kNone) {
    const F scale = Splat(1.0f / total);
    for (int64_t i = 0; i < v; i += kLanes) {
      const F p = Load(e + i) * scale;
      if constexpr (kProbs == kF32) {
        Store(static_cast<float*>(probs) + i, p);
      } else {
        const H h = ToBf16(p);
        std::memcpy(static_cast<uint16_t*>(probs) + i, &h, sizeof h);
      }
    }
  }
  return RowStats{argmax, static_cast<int32_t>(blk * block + within), entropy};
}

// Rows go out in chunks from a shared counter. The calling thread works through them, and one task on XLA's
// intra-op pool joins in if a worker picks it up in time; the caller then waits only for chunks already taken.
// A task that starts late finds none left; the counters it touches live on the heap, owned jointly.
struct Progress {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> busy{0};
};

template <Probs kProbs>
ffi::Error Run(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits, ffi::Buffer<ffi::F32> uniform,
               ffi::Buffer<ffi::F32> inv_t, ffi::ResultBuffer<ffi::S32> argmax, ffi::ResultBuffer<ffi::F32> entropy,
               ffi::ResultBuffer<ffi::S32> sample, void* probs, int64_t block) {
  const auto dims = logits.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("token_stats: the logits need a vocabulary axis");
  const int64_t v = dims.back();
  if (v == 0 || v % kLanes || block < kLanes || block % kLanes || v % block)
    return ffi::Error::InvalidArgument("token_stats: the vocabulary and the block must be multiples of 16, and "
                                       "the block must divide the vocabulary");
  const int64_t rows = logits.element_count() / v;
  if (uniform.element_count() != rows || inv_t.element_count() != rows)
    return ffi::Error::InvalidArgument("token_stats: one uniform and one inverse temperature per position");
  const float* l = logits.typed_data();
  const float* u = uniform.typed_data();
  const float* t = inv_t.typed_data();
  int32_t* a = argmax->typed_data();
  float* h = entropy->typed_data();
  int32_t* s = sample->typed_data();
  const int64_t probs_bytes = kProbs == kF32 ? 4 : 2;
  const int64_t chunk = 8;
  const int64_t chunks = (rows + chunk - 1) / chunk;
  auto progress = std::make_shared<Progress>();
  auto work = [=](Progress& p) {
    std::vector<float> scratch;  // allocated once a chunk is claimed: a task that starts late needs none
    for (;;) {
      p.busy.fetch_add(1, std::memory_order_acq_rel);
      const int64_t c = p.next.fetch_add(1, std::memory_order_acq_rel);
      if (c >= chunks) {
        p.busy.fetch_sub(1, std::memory_order_acq_rel);
        return;
      }
      scratch.resize(v + 2 * (v / block));
      for (int64_t r = c * chunk; r < std::min(rows, (c + 1) * chunk); ++r) {
        void* row_probs = kProbs == kNone ? nullptr : static_cast<char*>(probs) + r * v * probs_bytes;
        const RowStats out = Row<kProbs>(l + r * v, v, block, u[r], t[r], scratch.data(), row_probs);
        a[r] = out.argmax;
        h[r] = out.entropy;
        s[r] = out.sample;
      }
      p.busy.fetch_sub(1, std::memory_order_acq_rel);
    }
  };
  if (chunks > 1 && pool.num_threads() > 1) pool.Schedule([progress, work] { work(*progress); });
  work(*progress);
  while (progress->busy.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  return ffi::Error::Success();
}

ffi::Error NoProbs(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> l, ffi::Buffer<ffi::F32> u,
                   ffi::Buffer<ffi::F32> t, ffi::ResultBuffer<ffi::S32> a, ffi::ResultBuffer<ffi::F32> h,
                   ffi::ResultBuffer<ffi::S32> s, int64_t block) {
  return Run<kNone>(pool, l, u, t, a, h, s, nullptr, block);
}

ffi::Error F32Probs(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> l, ffi::Buffer<ffi::F32> u,
                    ffi::Buffer<ffi::F32> t, ffi::ResultBuffer<ffi::S32> a, ffi::ResultBuffer<ffi::F32> h,
                    ffi::ResultBuffer<ffi::S32> s, ffi::ResultBuffer<ffi::F32> p, int64_t block) {
  return Run<kF32>(pool, l, u, t, a, h, s, p->untyped_data(), block);
}

ffi::Error Bf16Probs(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> l, ffi::Buffer<ffi::F32> u,
                     ffi::Buffer<ffi::F32> t, ffi::ResultBuffer<ffi::S32> a, ffi::ResultBuffer<ffi::F32> h,
                     ffi::ResultBuffer<ffi::S32> s, ffi::ResultBuffer<ffi::BF16> p, int64_t block) {
  return Run<kBf16>(pool, l, u, t, a, h, s, p->untyped_data(), block);
}

}  // namespace

// Arguments: logits [..., V], uniforms [...], inverse temperatures [...]. Results: first arg-max [...] (int32),
// entropy in nats [...] (float32), sample [...] (int32), and for the last two targets softmax(logits / t).
#define DGEMMA_TOKEN_STATS_BINDING      \
  ffi::Ffi::Bind()                      \
      .Ctx<ffi::ThreadPool>()           \
      .Arg<ffi::Buffer<ffi::F32>>()     \
      .Arg<ffi::Buffer<ffi::F32>>()     \
      .Arg<ffi::Buffer<ffi::F32>>()     \
      .Ret<ffi::Buffer<ffi::S32>>()     \
      .Ret<ffi::Buffer<ffi::F32>>()     \
      .Ret<ffi::Buffer<ffi::S32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(DgemmaTokenStats, NoProbs, DGEMMA_TOKEN_STATS_BINDING.Attr<int64_t>("block"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(DgemmaTokenStatsF32, F32Probs,
                              DGEMMA_TOKEN_STATS_BINDING.Ret<ffi::Buffer<ffi::F32>>().Attr<int64_t>("block"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(DgemmaTokenStatsBf16, Bf16Probs,
                              DGEMMA_TOKEN_STATS_BINDING.Ret<ffi::Buffer<ffi::BF16>>().Attr<int64_t>("block"));
