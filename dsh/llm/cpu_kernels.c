/* dsh.llm.kernels: the two memory-bound parts of a decoding step on the CPU, for dsh.llm.engine; and, at the end,
   the causal attention over packed sequences of training and scoring, forward and backward (dsh.llm.packed_attention).

   A decoding step of a small model spends most of its time reading the KV cache (the linear layers are
   matrix products that MKL already runs near the machine's peak). torch's batched matmul reads the cache of
   every row up to the longest row, in many tiny products (one 1 x D by D x L per row and head); these loops
   read each row's own keys and values once, as two sequential streams, and nothing beyond its length.

   Layout (float32): see attend().
   Built by dsh.llm.kernels (compiled once per machine; see its docstring). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#else
#include <time.h>
static double omp_get_wtime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
#endif

#define TILE 16

/* bfloat16 <-> float32 as torch converts them: widening is exact; narrowing rounds to the nearest, ties to even (a NaN
   becomes torch's 0x7FC0). */
static inline float bf16_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t float_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0x7FC0 : r;
}
static inline float same_float(float x) { return x; }

/* Rotary embedding of one head vector x[D] at the position whose tables are cos[D], sin[D]
   (transformers' rotate_half convention: pairs (i, i + D/2)). */
static inline void rope(const float *restrict x, const float *restrict cos, const float *restrict sin,
                        float *restrict out, int64_t D) {
  const int64_t h = D / 2;
#pragma omp simd
  for (int64_t i = 0; i < h; ++i) {
    out[i] = x[i] * cos[i] - x[i + h] * sin[i];
    out[i + h] = x[i + h] * cos[i + h] + x[i] * sin[i + h];
  }
}

/* One decoding position of every row b with len[b] > 0 (its cache in slot[b], its token at position pos[b],
   len[b] = pos[b] + 1):
   1. rotate the query heads and the key heads of qkv[b] ([(H + 2 KV) D], the fused projection), store the keys
      and values into the caches at pos[b];
   2. out[b, h] = softmax(q_h . k * scale) . v over positions 0 .. pos[b], query head h reading key/value head
      h / (H / KV).
   Caches (float32; _Float16 in attend_f16): keys [slots, M / TILE, KV, D, TILE] (tiles of TILE positions, transposed within the tile, so
   that TILE scores are one vector product over D), values [slots, M, KV, D]. A row's used cache is read as two
   sequential streams, each once for all heads: the key tiles (every head's scores of a tile computed together,
   HB heads' sums interleaved so that their dependency chains overlap), then the values (every head's weighted sum
   advanced by one position at a time; where D is whole vectors of 16, VB of the (head, 16 dimensions) sums at a time
   kept in registers over all positions, instead of in memory). Each head's sums run in the order of the one-head
   loops (positions, then dimensions), so the result does not depend on how the heads are grouped. Rows with len 0
   are skipped (out 0). */
#define HB 4 /* query heads whose score sums are interleaved */
/* The loop below, for a cache of element type T: float; or _Float16 where the compiler has it (half the bytes read).
   Both are read in place, 16 values at a time widened to one float vector as they are used (LOAD16: one F16C
   conversion on x86), then the same float sums in the same order; where D is not whole vectors of 16, each
   position's values are widened into a buffer first (WIDEN(src, buf, n) gives the float values). Reading a half
   cache in place rather than through a buffer: 1.19-1.23x at 256 rows of 8-220 positions (4 heads of 32, an Intel
   Xeon with AVX-512), the same bits. Each row's streams are short (50 KB each at 200 positions in half floats, 10-20 KB
   at the sampling bench's 10-70) and start cold, and the rows' caches lie in slots far apart, so the memory is read
   ahead by hand: the next row's first PREFETCH_ROW bytes of each stream into L2, a few lines at a time as this row
   runs (fetch_ahead: a burst of them at the row's start stalls on the full miss queues), this row's next key tile and
   its values PREFETCH_V positions ahead into L1. The new key and value are rounded to T as vectors (NARROW) before
   they are stored. Against this row's prefetches alone (the 2-core AMD Zen 4, one process, the paths alternating, a
   fresh engine each repeat, 10 repeats): the sampling bench's 256 rows 1.17x on half floats (1.20x (1.05-1.37x) against
   1.03x for the numpy bookkeeping alone), the same completions; with each path's engine kept across repeats, 1.18x
   (0.99-1.54x) on half floats and 1.08x (0.86-1.78x) on floats. The attention alone at 100 and 200 positions: 24.4 ->
   28.2 and 28.8 -> 28.8 GB/s on half floats, 16.2 -> 22.6 and 17.2 -> 22.2 on floats (medians of 5). The size: the
   whole next row (32 KB a stream) 26 GB/s alone at 200 positions; 4, 8, 16 and 32 KB 1.31x, 1.37x, 1.41x and 1.40x on
   the sampling bench (engines kept across 6 alternations, which flatters all but the first by a few per cent). */
static inline const float *widen_float(const float *src, float *buf, int64_t n) {
  (void)buf;
  (void)n;
  return src;
}
#ifdef __FLT16_MAX__
static inline const float *widen_half(const _Float16 *restrict src, float *restrict buf, int64_t n) {
  int64_t i = 0; /* the compilers leave this loop scalar: the F16C conversions by hand where the CPU has them */
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#elif defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
  for (; i < n; ++i) buf[i] = (float)src[i];
  return buf;
}
#endif
/* n floats rounded to T as they are stored (as the conversion (T)x rounds: to nearest, ties to even) */
static inline void narrow_float(const float *restrict src, float *restrict dst, int64_t n) {
  __builtin_memcpy(dst, src, n * sizeof(float));
}
#ifdef __FLT16_MAX__
static inline void narrow_half(const float *restrict src, _Float16 *restrict dst, int64_t n) {
  int64_t i = 0; /* the compilers leave this loop scalar (a conversion and a 2-byte store per value) */
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_CUR_DIRECTION));
#elif defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_CUR_DIRECTION));
#endif
  for (; i < n; ++i) dst[i] = (_Float16)src[i];
}
#endif
/* 16 consecutive floats as one vector, for the value loop's sums in registers (VB below). */
typedef float v16f __attribute__((vector_size(64)));
static inline v16f load16_float(const float *src) {
  v16f x;
  __builtin_memcpy(&x, src, sizeof x);
  return x;
}
#ifdef __FLT16_MAX__
/* 16 consecutive half floats widened to one float vector (exactly: every half is a float). */
static inline v16f load16_half(const _Float16 *src) {
#if defined(__AVX512F__)
  return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
#else
  v16f x;
  for (int i = 0; i < 16; ++i) x[i] = (float)src[i];
  return x;
#endif
}
#endif
#define VB 8 /* (head, 16 dimensions) value sums held in registers at once */
#define PREFETCH_V 8 /* positions of values fetched ahead */
#define PREFETCH_ROW 16384 /* bytes of each of the next row's two streams fetched ahead (into L2) */
/* what is left to fetch of the next row's key tiles [k, k_end) and values [v, v_end); fetch_ahead fetches n more lines */
typedef struct { const char *k, *k_end, *v, *v_end; } ahead_t;
static inline void fetch_ahead(ahead_t *a, int64_t n) {
  for (; n > 0 && a->k < a->k_end; --n, a->k += 64) __builtin_prefetch(a->k, 0, 2);
  for (; n > 0 && a->v < a->v_end; --n, a->v += 64) __builtin_prefetch(a->v, 0, 2);
}
/* The rows b0 .. b1 - 1 of the B rows that this thread of the enclosing parallel region attends: one run of
   consecutive rows a thread (its caches read as one stream where the rows' slots follow each other), the runs cut to
   equal costs, a row costing its positions len[b] plus ROW_COST (its rotation, stores and softmax), a done row
   (len 0) 1. Inside an inactive region (the C step's parts) all rows. Against rows handed out two at a time
   (schedule(dynamic, 2)): the attention alone at 256 rows of 100 and 200 positions, half floats, 27.8-36.4 and
   28.6-35.6 GB/s against 24.5-29.3 and 27.7-31.6 (three rounds of 5 interleaved repeats, medians; the host's read
   bandwidth moved between 29 and 48 GB/s across them); the same results (each row's sums are its own). */
#define ROW_COST 16
/* The first row of run k (0 <= k <= runs; run `runs` starts at B) when the B rows are cut into `runs` runs of
   consecutive rows of equal cost, a row costing live + len[b] where len[b] > 0, done where len[b] is 0. */
static int64_t equal_cost_start(const int64_t *restrict len, int64_t B, double live, double done, int64_t k,
                                int64_t runs) {
  if (k <= 0) return 0;
  if (k >= runs) return B;
  double total = 0.0, acc = 0.0;
  for (int64_t b = 0; b < B; ++b) total += len[b] > 0 ? live + (double)len[b] : done;
  const double at = total * (double)k / (double)runs;
  int64_t b = 0;
  for (; b < B && acc < at; ++b) acc += len[b] > 0 ? live + (double)len[b] : done;
  return b;
}
static void own_rows(const int64_t *restrict len, int64_t B, int64_t *b0, int64_t *b1) {
  int64_t t = 0, T = 1;
#ifdef _OPENMP
  t = omp_get_thread_num();
  T = omp_get_num_threads();
#endif
  *b0 = equal_cost_start(len, B, ROW_COST, 1.0, t, T);
  *b1 = equal_cost_start(len, B, ROW_COST, 1.0, t + 1, T);
}
#define DEFINE_ATTEND(NAME, T, WIDEN, LOAD16, NARROW) \
void NAME(const float *restrict qkv, const float *restrict cos, const float *restrict sin, \
            const int64_t *restrict pos, const int64_t *restrict len, const int64_t *restrict slot, \
            T *restrict kt, T *restrict v, float *restrict out, int64_t B, int64_t H, int64_t KV, int64_t D, \
            int64_t M, float scale) { \
  const int64_t group = H / KV, tiles_all = M / TILE; \
_Pragma("omp parallel") \
  { \
  int64_t b0, b1; \
  own_rows(len, B, &b0, &b1); \
  for (int64_t b = b0; b < b1; ++b) { \
    const int64_t n = len[b]; \
    if (n <= 0) { \
      for (int64_t i = 0; i < H * D; ++i) out[b * H * D + i] = 0.f; \
      continue; \
    } \
    const int64_t p = pos[b]; \
    const float *row = qkv + b * (H + 2 * KV) * D; \
    const float *c = cos + p * D, *s = sin + p * D; \
    T *K = kt + slot[b] * tiles_all * KV * D * TILE; \
    T *V = v + slot[b] * M * KV * D; \
    ahead_t ahead = {0, 0, 0, 0}; /* the next row's caches, fetched into L2 a few lines at a time as this row runs */ \
    if (b + 1 < B && len[b + 1] > 0) { \
      const int64_t n1 = len[b + 1], kb = (n1 + TILE - 1) / TILE * KV * D * TILE * (int64_t)sizeof(T), \
                    vb = n1 * KV * D * (int64_t)sizeof(T); \
      ahead.k = (const char *)(kt + slot[b + 1] * tiles_all * KV * D * TILE); \
      ahead.v = (const char *)(v + slot[b + 1] * M * KV * D); \
      ahead.k_end = ahead.k + (kb < PREFETCH_ROW ? kb : PREFETCH_ROW); \
      ahead.v_end = ahead.v + (vb < PREFETCH_ROW ? vb : PREFETCH_ROW); \
    } \
    float kr[D], vbuf[KV * D] __attribute__((aligned(64))); \
    T kn[D]; \
    for (int64_t h = 0; h < KV; ++h) { \
      rope(row + (H + h) * D, c, s, kr, D); \
      T *restrict tile = K + ((p / TILE) * KV + h) * D * TILE; \
      NARROW(kr, kn, D); /* rounded as vectors, then stored a position each */ \
      for (int64_t d = 0; d < D; ++d) tile[d * TILE + p % TILE] = kn[d]; \
      const float *restrict vin = row + (H + KV + h) * D; \
      T *restrict vout = V + (p * KV + h) * D; \
      NARROW(vin, vout, D); \
    } \
    const int64_t tiles = (n + TILE - 1) / TILE, stride = tiles * TILE; \
    const int64_t HP = (H + HB - 1) / HB * HB; /* heads padded to whole groups (padding heads repeat head H - 1) */ \
    float sc[HP * stride] __attribute__((aligned(64))); \
    float qs[HP * D], acc[H * D]; \
    for (int64_t h = 0; h < H; ++h) { \
      rope(row + h * D, c, s, qs + h * D, D); \
      for (int64_t d = 0; d < D; ++d) qs[h * D + d] *= scale; \
    } \
    for (int64_t h = H; h < HP; ++h) \
      for (int64_t d = 0; d < D; ++d) qs[h * D + d] = qs[(H - 1) * D + d]; \
    /* scores: the key tiles once, every head */ \
    for (int64_t t = 0; t < tiles; ++t) { \
      const T *tk = K + t * KV * D * TILE; /* read in place, each 16 positions of a dimension one vector */ \
      fetch_ahead(&ahead, 8); \
      if (t + 1 < tiles) /* the next tile fetched ahead (the row's stream starts cold for the prefetchers) */ \
        for (int64_t i = 0; i < (int64_t)(KV * D * TILE * sizeof(T)); i += 64) \
          __builtin_prefetch((const char *)(tk + KV * D * TILE) + i); \
      for (int64_t h0 = 0; h0 < HP; h0 += HB) { \
        const T *tl[HB]; \
        for (int k = 0; k < HB; ++k) { \
          const int64_t h = h0 + k < H ? h0 + k : H - 1; \
          tl[k] = tk + (h / group) * D * TILE; \
        } \
        v16f sv[HB]; \
        for (int k = 0; k < HB; ++k) sv[k] = (v16f){0}; \
        for (int64_t d = 0; d < D; ++d) \
          for (int k = 0; k < HB; ++k) sv[k] += qs[(h0 + k) * D + d] * LOAD16(tl[k] + d * TILE); \
        for (int k = 0; k < HB; ++k) __builtin_memcpy(sc + (h0 + k) * stride + t * TILE, &sv[k], sizeof sv[k]); \
      } \
    } \
    float inv[H]; \
    for (int64_t h = 0; h < H; ++h) { \
      float *sh = sc + h * stride; \
      float mx = -FLT_MAX, sum = 0.f; \
      for (int64_t j = 0; j < n; ++j) mx = sh[j] > mx ? sh[j] : mx; \
      /* exp(z) < e^-60 ~ 1e-26 is taken as 0: far below float32's resolution of the sum (which holds the 1 of \
         the maximum); it keeps expf and the products with v from making subnormal numbers (a microcode assist \
         each on x86). */ \
_Pragma("omp simd reduction(+ : sum)") \
      for (int64_t j = 0; j < n; ++j) { \
        const float z = sh[j] - mx; \
        sh[j] = z < -60.f ? 0.f : expf(z); \
        sum += sh[j]; \
      } \
      inv[h] = 1.f / sum; \
    } \
    /* weighted values; where D is whole vectors of 16, VB (head, 16 dimensions) sums at a time held in registers \
       over every position (the same sums in the same order as the loop after it) */ \
    if (D % 16 == 0) { \
      const int64_t C = D / 16, U = H * C; \
      for (int64_t u0 = 0; u0 < U; u0 += VB) { \
        int64_t off[VB]; \
        const float *pr[VB]; \
        for (int k = 0; k < VB; ++k) { \
          const int64_t u = u0 + k < U ? u0 + k : U - 1, h = u / C; \
          off[k] = (h / group) * D + (u % C) * 16; \
          pr[k] = sc + h * stride; \
        } \
        v16f a[VB]; \
        _Pragma("GCC unroll 8") \
        for (int k = 0; k < VB; ++k) a[k] = (v16f){0}; \
        for (int64_t j = 0; j < n; ++j) { \
          const T *vj = V + j * KV * D; /* read in place */ \
          if (u0 == 0) fetch_ahead(&ahead, 8); \
          if (u0 == 0 && j + PREFETCH_V < n) /* the values PREFETCH_V positions ahead fetched ahead */ \
            for (int64_t i = 0; i < (int64_t)(KV * D * sizeof(T)); i += 64) \
              __builtin_prefetch((const char *)(vj + PREFETCH_V * KV * D) + i); \
          _Pragma("GCC unroll 8") \
          for (int k = 0; k < VB; ++k) a[k] += pr[k][j] * LOAD16(vj + off[k]); \
        } \
        for (int k = 0; k < VB && u0 + k < U; ++k) { \
          const int64_t u = u0 + k, h = u / C; \
          for (int i = 0; i < 16; ++i) out[(b * H + h) * D + (u % C) * 16 + i] = a[k][i] * inv[h]; \
        } \
      } \
      fetch_ahead(&ahead, INT64_MAX); \
      continue; \
    } \
    for (int64_t i = 0; i < H * D; ++i) acc[i] = 0.f; \
    for (int64_t j = 0; j < n; ++j) { \
      const float *vj = WIDEN(V + j * KV * D, vbuf, KV * D); \
      for (int64_t h = 0; h < H; ++h) { \
        const float pj = sc[h * stride + j]; \
        const float *vh = vj + (h / group) * D; \
        float *ah = acc + h * D; \
_Pragma("omp simd") \
        for (int64_t d = 0; d < D; ++d) ah[d] += pj * vh[d]; \
      } \
    } \
    for (int64_t h = 0; h < H; ++h) \
      for (int64_t d = 0; d < D; ++d) out[(b * H + h) * D + d] = acc[h * D + d] * inv[h]; \
    fetch_ahead(&ahead, INT64_MAX); \
  } \
  } \
}
DEFINE_ATTEND(attend, float, widen_float, load16_float, narrow_float)
#ifdef __FLT16_MAX__
DEFINE_ATTEND(attend_f16, _Float16, widen_half, load16_half, narrow_half)
int has_attend_f16(void) { return 1; }
#else
int has_attend_f16(void) { return 0; }
#endif

/* RMSNorm of each row of x [B, N]: out = w * x / sqrt(mean(x^2) + eps) (transformers' LlamaRMSNorm); with rstd
   not NULL, each row's r = 1 / sqrt(mean(x^2) + eps) kept in rstd [B] (for training's backward pass). */
void rms_norm_rstd(const float *restrict x, const float *restrict w, float eps, float *restrict out,
                   float *restrict rstd, int64_t B, int64_t N) {
#pragma omp parallel for schedule(static) if (B * N > 32768)
  for (int64_t b = 0; b < B; ++b) {
    const float *r = x + b * N;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < N; ++i) ss += r[i] * r[i];
    const float inv = 1.f / sqrtf(ss / (float)N + eps);
    if (rstd) rstd[b] = inv;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) out[b * N + i] = w[i] * (r[i] * inv);
  }
}

void rms_norm(const float *restrict x, const float *restrict w, float eps, float *restrict out, int64_t B,
              int64_t N) {
  rms_norm_rstd(x, w, eps, out, NULL, B, N);
}

/* The gated MLP's activation: gu [B, 2F] holds the gate then the up projection; out [B, F] = silu(gate) * up.
   silu_mul: float32; silu_mul_bf16: bfloat16 rows (the gate/up product of GRPO's update in bfloat16,
   dsh.llm.fused_layers), each value widened, the same float32 arithmetic, the result rounded to bfloat16 (so its out
   equals silu_mul's on the widened rows, rounded, bit for bit). */
#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE) \
  void NAME(const T *restrict gu, T *restrict out, int64_t B, int64_t F) { \
    _Pragma("omp parallel for schedule(static) if (B * F > 32768)") \
    for (int64_t b = 0; b < B; ++b) { \
      const T *g = gu + b * 2 * F, *u = g + F; \
      _Pragma("omp simd") \
      for (int64_t i = 0; i < F; ++i) { \
        const float x = LOAD(g[i]); \
        out[b * F + i] = STORE(x / (1.f + expf(-x)) * LOAD(u[i])); \
      } \
    } \
  }
DEFINE_SILU_MUL(silu_mul, float, same_float, same_float)
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, bf16_float, float_bf16)

/* dsh.llm.streams (_mix31, counted_uniform): the same integers, the same float32 uniforms. */
static inline int64_t mix31(int64_t x) {
  static const int64_t mult[3] = {0x2C1B3C6D, 0x297A2D39, 0x3C6EF372};
  for (int k = 0; k < 3; ++k) x = ((x ^ (x >> 16)) * mult[k]) & 0x7FFFFFFF;
  return x ^ (x >> 15);
}

#define SAMPLE_BLOCK 256
/* argmax_i l_i * inv_temp - log(-log U_i), U_i the counted uniform of (h, i): the perturbed logits a block at a time
   (a vector loop), the first index of the maximum. Kept out of line: inlining it changes how the caller's
   log-probability sum is vectorised, and so that sum's last bits. */
__attribute__((noinline)) static int64_t gumbel_argmax(const float *restrict l, int64_t h, float inv_temp, int64_t V) {
  int64_t best = 0;
  float top = -INFINITY;
  for (int64_t i0 = 0; i0 < V; i0 += SAMPLE_BLOCK) {
    const int64_t m = V - i0 < SAMPLE_BLOCK ? V - i0 : SAMPLE_BLOCK;
    float g[SAMPLE_BLOCK];
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) {
      const float u = ((float)(mix31((h ^ (i0 + j)) & 0x7FFFFFFF) >> 7) + 0.5f) / 16777216.f;
      g[j] = l[i0 + j] * inv_temp - logf(-logf(u));
    }
    for (int64_t j = 0; j < m; ++j)
      if (g[j] > top) {
        top = g[j];
        best = i0 + j;
      }
  }
  return best;
}

/* Next token of each row from logits [B, V]: argmax when greedy, else argmax_i logits_i / T - log(-log U_i) (the
   Gumbel-max form of a draw from softmax(logits / T)), U_i the counted uniform of (key[b], step[b], i); logp[b] the
   chosen token's log-probability under softmax(logits / T) (T = 1 when greedy). */
void sample_tokens(const float *restrict logits, const int64_t *restrict key, const int64_t *restrict step,
                   float inv_temp, int greedy, int64_t *restrict out, float *restrict logp, int64_t B, int64_t V) {
#pragma omp parallel for schedule(static) if (B * V > 4096)
  for (int64_t b = 0; b < B; ++b) {
    const float *l = logits + b * V;
    int64_t best = 0;
    if (greedy) {
      for (int64_t i = 1; i < V; ++i)
        if (l[i] > l[best]) best = i;
    } else {
      const int64_t h = mix31((mix31(key[b] & 0x7FFFFFFF) ^ (step[b] & 0x7FFFFFFF)) & 0x7FFFFFFF);
      best = gumbel_argmax(l, h, inv_temp, V);
    }
    out[b] = best;
    float mx = -INFINITY, sum = 0.f;
    for (int64_t i = 0; i < V; ++i) mx = l[i] * inv_temp > mx ? l[i] * inv_temp : mx;
    for (int64_t i = 0; i < V; ++i) sum += expf(l[i] * inv_temp - mx);
    logp[b] = l[best] * inv_temp - mx - logf(sum);
  }
}

/* The rows' bookkeeping after a decoding step (dsh.llm.kernel_engine): st [ROW_FIELDS, A] holds, one row of A
   values each, the active rows' slot, token fed, position, prompt length, tokens generated, token limit, stream key,
   done, stopped, capped, stop-token count and attended length (the order of kernel_engine.ROW_FIELDS). For each row
   with new[r] drawn after feeding position pos: a row still live whose position is past its prompt records new[r]
   and its logp[r] at out[slot, n_gen] (out_w columns) and counts it; an end token (eos[0 .. n_eos)) stops it, the
   token limit or the stop_n-th stop_tok (stop_tok < 0: none) ends it; a live row moves one position on and is fed
   its sampled token, or its prompt's next one (prompt [slot, prompt_w]); lens = pos + 1, or 0 once done.
   Returns how many rows are done. */
enum { R_SLOT, R_TOK, R_POS, R_PLEN, R_NGEN, R_LIMIT, R_KEY, R_DONE, R_STOPPED, R_CAPPED, R_MARKS, R_LENS };
/* advance_rows() on the rows r0 .. r1 - 1 of the A (a part of the step, decode_step()); how many of them are done. */
static int64_t advance_range(const int64_t *restrict nxt, const float *restrict logp, int64_t *restrict st, int64_t A,
                             int64_t r0, int64_t r1, int64_t *restrict out, float *restrict out_logp, int64_t out_w,
                             const int64_t *restrict prompt, int64_t prompt_w, const int64_t *restrict eos,
                             int64_t n_eos, int64_t stop_tok, int64_t stop_n) {
  int64_t *slot = st + R_SLOT * A, *tok = st + R_TOK * A, *pos = st + R_POS * A, *plen = st + R_PLEN * A,
          *n_gen = st + R_NGEN * A, *limit = st + R_LIMIT * A, *done = st + R_DONE * A,
          *stopped = st + R_STOPPED * A, *capped = st + R_CAPPED * A, *marks = st + R_MARKS * A, *lens = st + R_LENS * A;
  int64_t n_done = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t live = !done[r], gen = live && pos[r] + 1 >= plen[r], t = nxt[r];
    if (gen) {
      const int64_t at = slot[r] * out_w + (n_gen[r] < out_w - 1 ? n_gen[r] : out_w - 1);
      out[at] = t;
      out_logp[at] = logp[r];
      n_gen[r] += 1;
      int64_t ended = 0;
      for (int64_t e = 0; e < n_eos; ++e) ended |= t == eos[e];
      stopped[r] |= ended;
      done[r] |= ended | (n_gen[r] >= limit[r]);
      if (stop_tok >= 0 && t == stop_tok) {
        marks[r] += 1;
        if (!ended && marks[r] >= stop_n) {
          capped[r] = 1;
          done[r] = 1;
        }
      }
    }
    pos[r] += live;
    const int64_t p = pos[r] < prompt_w - 1 ? pos[r] : prompt_w - 1;
    tok[r] = gen ? t : prompt[slot[r] * prompt_w + p];
    lens[r] = done[r] ? 0 : pos[r] + 1;
    n_done += done[r] != 0;
  }
  return n_done;
}
int64_t advance_rows(const int64_t *restrict nxt, const float *restrict logp, int64_t *restrict st, int64_t A,
                     int64_t *restrict out, float *restrict out_logp, int64_t out_w, const int64_t *restrict prompt,
                     int64_t prompt_w, const int64_t *restrict eos, int64_t n_eos, int64_t stop_tok, int64_t stop_n) {
  return advance_range(nxt, logp, st, A, 0, A, out, out_logp, out_w, prompt, prompt_w, eos, n_eos, stop_tok, stop_n);
}

/* The decoding step's own matrix product (dsh.llm.kernels.panel_product): out [A, O] = x [A, I] @ w [O, I]^T, or that
   plus out (beta 1), from w packed into panels of PANEL outputs (panel_pack: panel j0's inputs in order, PANEL weights
   each). Each output is one chain of fused multiply-adds over its inputs in order, cut into chunks of kc inputs (kc <=
   0: one chunk): each chunk's chain starts from zero and the chunks' sums are added in order, the first to out where
   beta is 1. That is MKL's order at the step's shapes where dsh.llm.products.panels_agree finds the same bits as
   torch's product; a row's result depends on its own row alone. The rows are dealt to the threads in blocks of
   PANEL_ROWS, the rows left over one block of their count (one thread inside a parallel region: the step's parts).
   AVX-512 only (has_panel_product). */
#if defined(__AVX512F__)
#define PANEL 32
#define PANEL_ROWS 8
int has_panel_product(void) { return 1; }
void panel_pack(const float *restrict w, float *restrict p, int64_t O, int64_t I) {
  for (int64_t j0 = 0; j0 < O; j0 += PANEL)
    for (int64_t k = 0; k < I; ++k)
      for (int64_t j = 0; j < PANEL; ++j) p[j0 * I + k * PANEL + j] = j0 + j < O ? w[(j0 + j) * I + k] : 0.f;
}
/* a + b rounded once, kept apart from -ffast-math's reassociation (the order of the chunks' sums is the point) */
static inline __m512 add_exact(__m512 a, __m512 b) {
  return _mm512_add_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* R rows from row 0 of x and out, the PANEL outputs of panel pp (its last columns masked off by m0, m1) */
static inline __attribute__((always_inline)) void panel_block(const float *restrict x, const float *restrict pp,
                                                              float *restrict out, const int R, int64_t I, int64_t O,
                                                              int add, int64_t kc, __mmask16 m0, __mmask16 m1) {
  __m512 t0[PANEL_ROWS] = {0}, t1[PANEL_ROWS] = {0};
  for (int64_t k0 = 0; k0 < I; k0 += kc) {
    const int64_t k1 = k0 + kc < I ? k0 + kc : I;
    __m512 c0[PANEL_ROWS], c1[PANEL_ROWS];
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
      const __m512 b0 = _mm512_loadu_ps(pp + k * PANEL), b1 = _mm512_loadu_ps(pp + k * PANEL + 16);
      for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_set1_ps(x[r * I + k]);
        c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      if (k0 > 0) {
        t0[r] = add_exact(t0[r], c0[r]);
        t1[r] = add_exact(t1[r], c1[r]);
      } else if (add) {
        t0[r] = add_exact(c0[r], _mm512_maskz_loadu_ps(m0, out + r * O));
        t1[r] = add_exact(c1[r], _mm512_maskz_loadu_ps(m1, out + r * O + 16));
      } else {
        t0[r] = c0[r];
        t1[r] = c1[r];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(out + r * O, m0, t0[r]);
    _mm512_mask_storeu_ps(out + r * O + 16, m1, t1[r]);
  }
}
/* rows r0 .. r1 - 1 of panel_product, on this thread */
static void panel_rows(const float *restrict x, const float *restrict p, float *restrict out, int64_t r0, int64_t r1,
                       int64_t I, int64_t O, int add, int64_t kc) {
  for (int64_t j0 = 0; j0 < O; j0 += PANEL) {
    const int64_t cols = O - j0 < PANEL ? O - j0 : PANEL;
    const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1u);
    const __mmask16 m1 = cols <= 16 ? 0 : cols >= 32 ? 0xFFFF : (__mmask16)((1u << (cols - 16)) - 1u);
    const float *pp = p + j0 * I;
    int64_t r = r0;
    for (; r + PANEL_ROWS <= r1; r += PANEL_ROWS)
      panel_block(x + r * I, pp, out + r * O + j0, PANEL_ROWS, I, O, add, kc, m0, m1);
    /* the rows left after the whole blocks, as one block of their count: a row alone is two chains of fused
       multiply-adds, too few to hide their latency (one thread, 135 rows: 106-107 GFLOP/s a row at a time, 111-113
       as one block; 128 rows: 110-113) */
    switch (r1 - r) {
#define TAIL(R) \
  case R: \
    panel_block(x + r * I, pp, out + r * O + j0, R, I, O, add, kc, m0, m1); \
    break;
      TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7)
#undef TAIL
      _Static_assert(PANEL_ROWS == 8, "the cases above are the counts 1 .. PANEL_ROWS - 1");
    default: break;
    }
  }
}
void panel_product(const float *restrict x, const float *restrict p, float *restrict out, int64_t A, int64_t I,
                   int64_t O, float beta, int64_t kc) {
  const int add = beta != 0.f;
  if (kc <= 0 || kc > I) kc = I;
#ifdef _OPENMP
  if (!omp_in_parallel()) {
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), T = omp_get_num_threads(), blocks = (A + PANEL_ROWS - 1) / PANEL_ROWS;
      const int64_t r0 = blocks * t / T * PANEL_ROWS, r1 = blocks * (t + 1) / T * PANEL_ROWS;
      panel_rows(x, p, out, r0, r1 < A ? r1 : A, I, O, add, kc);
    }
    return;
  }
#endif
  panel_rows(x, p, out, 0, A, I, O, add, kc); /* inside a parallel region (the step's parts): this thread alone */
}
#else
int has_panel_product(void) { return 0; }
void panel_pack(const float *w, float *p, int64_t O, int64_t I) { (void)w, (void)p, (void)O, (void)I; }
void panel_product(const float *x, const float *p, float *out, int64_t A, int64_t I, int64_t O, float beta,
                   int64_t kc) {
  (void)x, (void)p, (void)out, (void)A, (void)I, (void)O, (void)beta, (void)kc;
}
#endif

/* A whole decoding step in one call (dsh.llm.kernel_engine.KernelDecoder, its C step): the operations of its torch
   step in the same order, each the same arithmetic, so the same bits. The matrix products call the BLAS sgemm_ that
   torch's float32 products call (dsh.llm.blas; set by set_sgemm), with torch's arguments for x @ w.T (and beta = 1
   into the residual, as addmm_); the caller sends a row count here only where each product at that count is that
   one call (no split, no oneDNN) and sgemm_ gives torch's result bit for bit there. */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *, const int *);
static sgemm_fn step_sgemm = 0;
/* MKL's cblas_sgemm_compute: the same product from a weight packed ahead (dsh.llm.blas.pack) */
typedef void (*compute_fn)(int, int, int, int, int, int, const float *, int, const float *, int, float, float *, int);
static compute_fn step_compute = 0;
/* MKL's MKL_Set_Num_Threads_Local: the products of a part of the step's rows on the calling thread alone */
typedef int (*local_threads_fn)(int);
static local_threads_fn step_local_threads = 0;
void set_sgemm(void *f, void *compute, void *local_threads) {
  step_sgemm = (sgemm_fn)f;
  step_compute = (compute_fn)compute;
  step_local_threads = (local_threads_fn)local_threads;
}

/* out [A, O] = beta * out + x [A, I] @ w [O, I]^T, as `way` says: 0: through sgemm_ (column-major: out^T = w^T^T x^T);
   1: from packed (w packed by MKL); k >= 2: panel_product from panels (w packed by panel_pack), its inputs in chunks of
   k; with t, its seconds added to *t. */
static void step_product(const float *x, const float *w, const float *packed, const float *panels, int64_t way,
                         float *out, int64_t A, int64_t I, int64_t O, float beta, double *t) {
  const char ta = 'T', tb = 'N';
  const int m = (int)O, n = (int)A, k = (int)I;
  const float one = 1.f;
  const double t0 = t ? omp_get_wtime() : 0.0;
  if (way >= 2)
    panel_product(x, panels, out, A, I, O, beta, way);
  else if (way == 1)
    step_compute(102 /* column-major */, 151 /* packed */, 111 /* not transposed */, m, n, k, packed, k, x, k, beta,
                 out, m);
  else
    step_sgemm(&ta, &tb, &m, &n, &k, &one, w, &k, x, &k, &beta, out, &m);
  if (t) *t += omp_get_wtime() - t0;
}

/* The model and the step's buffers (dsh.llm.kernel_engine.StepModel mirrors it, field for field): L layers of
   hidden size N, MLP size F, H query and KV key/value heads of size D, M cache positions, V tokens; layer l's
   addresses at layers[8 l ..]: input norm weight [N], q/k/v weight [(H + 2 KV) D, N], output weight [N, H D], post
   norm weight [N], gate/up weight [2 F, N], down weight [N, F], key tiles and values of its cache (attend()'s
   layout; half: float16); eps [2 l], [2 l + 1] its norms' epsilons. Buffers of at least `slots` rows. */
typedef struct {
  int64_t L, N, F, H, KV, D, M, V, half;
  float scale, final_eps;
  const float *embed, *final_norm, *head, *cos, *sin, *eps;
  const int64_t *layers, *packed; /* packed: each product's weight packed by MKL (4 a layer, then the head's), or 0 */
  const int64_t *panels;          /* each product's weight packed by panel_pack, or 0 */
  float *x, *normed, *qkv, *att, *gu, *act, *logits, *new_logp;
  int64_t *new_tok;
  double *row_cost; /* decode_step's parts: a row's cost in attended positions (updated), or 0: equal row counts */
} step_model;

/* The step of decode_step() on the rows r0 .. r1 - 1 of the A active rows (each row's results depend on its own row
   only; a product's rows are the same bits in any part of the rows where the caller checked that they are); how many
   of them are done. times (or NULL): each product's seconds added, then the attention's (all layers). */
static int64_t step_rows(const step_model *m, int64_t *restrict st, int64_t A, int64_t r0, int64_t r1, float inv_temp,
                         int greedy, int64_t *restrict out, float *restrict out_logp, int64_t out_w,
                         const int64_t *restrict prompt, int64_t prompt_w, const int64_t *restrict eos, int64_t n_eos,
                         int64_t stop_tok, int64_t stop_n, const int64_t *way, double *times) {
#define WAY(p) (const float *)m->packed[p], (const float *)m->panels[p], (way ? way[p] : 0)
  const int64_t N = m->N, F = m->F, HD = m->H * m->D, QKV = (m->H + 2 * m->KV) * m->D, n = r1 - r0;
  const int64_t *tok = st + R_TOK * A + r0, *pos = st + R_POS * A + r0, *lens = st + R_LENS * A + r0,
                *slot = st + R_SLOT * A + r0;
  float *x = m->x + r0 * N, *normed = m->normed + r0 * N, *qkv = m->qkv + r0 * QKV, *att = m->att + r0 * HD,
        *gu = m->gu + r0 * 2 * F, *act = m->act + r0 * F, *logits = m->logits + r0 * m->V;
  for (int64_t b = 0; b < n; ++b) __builtin_memcpy(x + b * N, m->embed + tok[b] * N, N * sizeof(float));
  for (int64_t l = 0; l < m->L; ++l) {
    const int64_t *w = m->layers + 8 * l;
    double *t = times ? times + 4 * l : 0;
    rms_norm(x, (const float *)w[0], m->eps[2 * l], normed, n, N);
    step_product(normed, (const float *)w[1], WAY(4 * l), qkv, n, N, QKV, 0.f, t);
    const double ta = times ? omp_get_wtime() : 0.0;
#ifdef __FLT16_MAX__
    if (m->half)
      attend_f16(qkv, m->cos, m->sin, pos, lens, slot, (_Float16 *)w[6], (_Float16 *)w[7], att, n, m->H, m->KV, m->D,
                 m->M, m->scale);
    else
#endif
      attend(qkv, m->cos, m->sin, pos, lens, slot, (float *)w[6], (float *)w[7], att, n, m->H, m->KV, m->D, m->M,
             m->scale);
    if (times) times[4 * m->L + 1] += omp_get_wtime() - ta;
    step_product(att, (const float *)w[2], WAY(4 * l + 1), x, n, HD, N, 1.f, t ? t + 1 : 0);
    rms_norm(x, (const float *)w[3], m->eps[2 * l + 1], normed, n, N);
    step_product(normed, (const float *)w[4], WAY(4 * l + 2), gu, n, N, 2 * F, 0.f, t ? t + 2 : 0);
    silu_mul(gu, act, n, F);
    step_product(act, (const float *)w[5], WAY(4 * l + 3), x, n, F, N, 1.f, t ? t + 3 : 0);
  }
  rms_norm(x, m->final_norm, m->final_eps, normed, n, N);
  step_product(normed, m->head, WAY(4 * m->L), logits, n, N, m->V, 0.f, times ? times + 4 * m->L : 0);
  sample_tokens(logits, st + R_KEY * A + r0, st + R_NGEN * A + r0, inv_temp, greedy, m->new_tok + r0,
                m->new_logp + r0, n, m->V);
  return advance_range(m->new_tok, m->new_logp, st, A, r0, r1, out, out_logp, out_w, prompt, prompt_w, eos, n_eos,
                       stop_tok, stop_n);
#undef WAY
}

/* The first row of each of the `parts` parts of the A rows (cut[parts] = A): equal row counts; or, where every product is
   the panel product (its rows independent of their neighbours, so any cut gives the same bits) and m->row_cost is set,
   equal costs, a row costing *row_cost + its attended positions (a row's products against its attention); whether it
   cut by costs. */
static int cut_rows(const step_model *m, const int64_t *restrict st, int64_t A, int64_t parts, const int64_t *way,
                    int64_t *cut) {
  int balanced = m->row_cost != 0 && way != 0;
  for (int64_t p = 0; balanced && p < 4 * m->L + 1; ++p) balanced = way[p] >= 2;
  const double r = balanced ? *m->row_cost : 0.0;
  for (int64_t k = 0; k <= parts; ++k)
    cut[k] = balanced ? equal_cost_start(st + R_LENS * A, A, r, r, k, parts) : A * k / parts;
  return balanced;
}

/* After a step in balanced parts that took took[k] seconds each: the row cost moved 5 % toward balance (the slowest
   part's rows attend more positions each than the fastest's: positions weigh more, the row cost falls; else it rises). */
static void rebalance(const step_model *m, const int64_t *restrict st, int64_t A, int64_t parts, const int64_t *cut,
                      const double *took) {
  const int64_t *lens = st + R_LENS * A;
  int64_t slow = 0, fast = 0;
  for (int64_t k = 1; k < parts; ++k) {
    if (took[k] > took[slow]) slow = k;
    if (took[k] < took[fast]) fast = k;
  }
  if (slow == fast || cut[slow + 1] == cut[slow] || cut[fast + 1] == cut[fast]) return;
  double ds = 0.0, df = 0.0;
  for (int64_t b = cut[slow]; b < cut[slow + 1]; ++b) ds += (double)lens[b];
  for (int64_t b = cut[fast]; b < cut[fast + 1]; ++b) df += (double)lens[b];
  ds /= (double)(cut[slow + 1] - cut[slow]);
  df /= (double)(cut[fast + 1] - cut[fast]);
  double r = *m->row_cost * (ds > df ? 0.95 : 1.05);
  *m->row_cost = r < 1.0 ? 1.0 : r > 65536.0 ? 65536.0 : r;
}

/* Feed each of the A active rows its token (rows st [ROW_FIELDS, A], advance_rows()'s layout), sample the next
   (sample_tokens(), the streams of (key, n_gen)) and move the rows on (advance_rows()); returns how many rows are
   done. way (or NULL: all 0): per product, in the step's order (4 a layer, then the head's), how it is taken at this
   row count (step_product's way: sgemm_, MKL's packed weight, or the panel product and its chunk); times (or NULL):
   each product's seconds added, in the same order, then the attention's (every layer's, one sum; 4 L + 2 in all).
   parts <= 1: the step over all rows, each product one library call on the library's threads. parts > 1: the rows
   cut into `parts` parts (cut_rows: equal row counts, or equal costs where every product is the panel product), each
   part's whole step on one thread, the parts side by side in one parallel region (no wait between the step's
   operations; each product on one thread, whose rows stay in its core's cache); times then add each product's (and
   the attention's) seconds averaged over the threads. The caller asks for parts only where each product's parts give
   its product over all rows bit for bit (dsh.llm.products.parts_agree; the panel product's rows depend on their own
   row alone), so both give the same results. */
int64_t decode_step(const step_model *m, int64_t *restrict st, int64_t A, float inv_temp, int greedy,
                    int64_t *restrict out, float *restrict out_logp, int64_t out_w, const int64_t *restrict prompt,
                    int64_t prompt_w, const int64_t *restrict eos, int64_t n_eos, int64_t stop_tok, int64_t stop_n,
                    const int64_t *way, double *times, int64_t parts) {
  if (parts <= 1)
    return step_rows(m, st, A, 0, A, inv_temp, greedy, out, out_logp, out_w, prompt, prompt_w, eos, n_eos, stop_tok,
                     stop_n, way, times);
  const int64_t P = 4 * m->L + 2; /* the products, then the attention */
  int64_t n_done = 0, cut[parts + 1];
  double took[parts];
  const int balanced = cut_rows(m, st, A, parts, way, cut);
#pragma omp parallel reduction(+ : n_done)
  {
    int64_t k = 0, T = 1;
#ifdef _OPENMP
    k = omp_get_thread_num();
    T = omp_get_num_threads();
#endif
    double own[P];
    for (int64_t p = 0; p < P; ++p) own[p] = 0.0;
    /* each product on this thread alone (as the parts were checked), whatever MKL's nesting settings */
    const int was = step_local_threads ? step_local_threads(1) : 0;
    for (int64_t part = k; part < parts; part += T) { /* every part once, whatever the threads */
      const double t0 = omp_get_wtime();
      n_done += step_rows(m, st, A, cut[part], cut[part + 1], inv_temp, greedy, out, out_logp, out_w, prompt, prompt_w,
                          eos, n_eos, stop_tok, stop_n, way, times ? own : 0);
      took[part] = omp_get_wtime() - t0;
    }
    if (step_local_threads) step_local_threads(was); /* 0: back to the global setting */
    if (times)
#pragma omp critical
      for (int64_t p = 0; p < P; ++p) times[p] += own[p] / (double)T;
  }
  if (balanced) rebalance(m, st, A, parts, cut, took); /* by the lengths after the step: each 1 more, 0 if done */
  return n_done;
}

/* decode_run's rows, queue and results (dsh.llm.step_loop.RunState mirrors it, field for field): the rows in flight
   st [ROW_FIELDS, A] (advance_rows()'s layout, room for `slots` rows) with the prompt each holds in owner [slots]; the
   prompts still to start, order[waiting - 1] first, each padded to `width` tokens in padded [n, width] with its
   length plen [n] and stream key keys [n]; the free cache slots, free_slots[n_free - 1] taken first; the decoding
   step's token and log-probability rows out / out_logp [slots, out_w] and prompt rows prompt [slots, width]; the
   k-th prompt to finish (k = 0, 1, ..., counted by n_finished) at result row q = k % res_rows (res_rows >= slots: the
   host takes every finished row at each return): its index finished[q], its tokens and log-probabilities res_tok /
   res_logp [res_rows, out_w] and (tokens, stopped, capped) res_meta [res_rows, 3]; per row count A, ways [A (1 + P)
   ..]: the step's parts (-1: not decided yet, 0: not in C) and its P products' ways (decode_step's). */
typedef struct {
  int64_t slots, A, n_done, waiting, n_free, width, limit, out_w, n_finished, started, greedy, stop_tok, stop_n, n_eos,
      res_rows;
  float inv_temp;
  double seconds; /* decode_run returns at the first step's end after this long */
  int64_t *st, *owner, *free_slots, *out, *prompt, *res_tok, *res_meta, *finished, *scratch;
  float *out_logp, *res_logp;
  const int64_t *order, *padded, *plen, *keys, *ways, *eos;
} run_state;

#define ROW_FIELDS (R_LENS + 1)
/* The done rows handed on (their tokens, log-probabilities and ends copied to the results, their slots freed, in row
   order) and dropped, then the waiting prompts started in the free slots (appended as rows at position 0 of their
   prompt, attending one position); the rows kept in their order (dsh.llm.kernel_engine.KernelDecoder's _retire and
   _admit, the same rows in the same order). */
static void retire_admit(run_state *r) {
  const int64_t A = r->A, W = r->out_w;
  int64_t *st = r->st, *nx = r->scratch, kept = 0;
  int64_t keep[A > 0 ? A : 1];
  for (int64_t i = 0; i < A; ++i) {
    if (!r->n_done || !st[R_DONE * A + i]) {
      keep[kept++] = i;
      continue;
    }
    const int64_t q = r->n_finished++ % r->res_rows, s = st[R_SLOT * A + i], n = st[R_NGEN * A + i];
    __builtin_memcpy(r->res_tok + q * W, r->out + s * W, n * sizeof(int64_t));
    __builtin_memcpy(r->res_logp + q * W, r->out_logp + s * W, n * sizeof(float));
    r->res_meta[3 * q] = n;
    r->res_meta[3 * q + 1] = st[R_STOPPED * A + i];
    r->res_meta[3 * q + 2] = st[R_CAPPED * A + i];
    r->finished[q] = r->owner[i];
    r->free_slots[r->n_free++] = s;
  }
  const int64_t take = r->waiting < r->n_free ? r->waiting : r->n_free, B = kept + take;
  for (int64_t k = 0; k < kept; ++k) {
    for (int64_t f = 0; f < ROW_FIELDS; ++f) nx[f * B + k] = st[f * A + keep[k]];
    r->owner[k] = r->owner[keep[k]];
  }
  for (int64_t k = kept; k < B; ++k) {
    const int64_t j = r->order[--r->waiting], s = r->free_slots[--r->n_free];
    __builtin_memcpy(r->prompt + s * r->width, r->padded + j * r->width, r->width * sizeof(int64_t));
    for (int64_t f = 0; f < ROW_FIELDS; ++f) nx[f * B + k] = 0;
    nx[R_SLOT * B + k] = s;
    nx[R_TOK * B + k] = r->padded[j * r->width];
    nx[R_PLEN * B + k] = r->plen[j];
    nx[R_LIMIT * B + k] = r->limit;
    nx[R_KEY * B + k] = r->keys[j];
    nx[R_LENS * B + k] = 1;
    r->owner[k] = j;
  }
  __builtin_memcpy(st, nx, ROW_FIELDS * B * sizeof(int64_t));
  r->A = B;
  r->started += take;
  r->n_done = 0;
}

/* KernelDecoder.generate's loop in C: retire the done rows and start waiting prompts (retire_admit), then a decoding
   step of the A rows (decode_step(), as ways[A] says), until every prompt is done (returns 0); or, at a step's end,
   once r->seconds have passed or when the next step's done rows might not fit the result rows the host has not taken
   (1: the host hands on the finished rows, then calls again); or where the next step's
   row count is not decided or not in C (2: the host decides it, or takes that step itself and sets n_done, then calls
   again). The same steps on the same rows in the same order as the host's loop. */
int64_t decode_run(const step_model *m, run_state *r) {
  const int64_t P = 4 * m->L + 1;
  const double t0 = omp_get_wtime();
  const int64_t taken = r->n_finished; /* the host took every row finished before this call */
  for (int64_t steps = 0;; ++steps) {
    if (r->n_done || (r->waiting && r->n_free)) retire_admit(r);
    if (r->A == 0) return 0;
    if (steps > 0 && (omp_get_wtime() - t0 >= r->seconds || r->n_finished - taken + r->A > r->res_rows)) return 1;
    const int64_t *way = r->ways + r->A * (1 + P);
    if (way[0] <= 0) return 2;
    r->n_done = decode_step(m, r->st, r->A, r->inv_temp, (int)r->greedy, r->out, r->out_logp, r->out_w, r->prompt,
                            r->width, r->eos, r->n_eos, r->stop_tok, r->stop_n, way + 1, 0, way[0]);
  }
}

/* The FMA issue rate: FLOP/s of n rounds of 10 independent multiply-add chains of 16 floats on every thread (the
   compiler vectorises each chain to one register where it can); the hardware's fp32 peak that no library exceeds. */
double fma_rate(int64_t n) {
  double t0 = omp_get_wtime(), lanes = 0;
  float total = 0.f;
#pragma omp parallel reduction(+ : total, lanes)
  {
    float a[10][16] __attribute__((aligned(64)));
    for (int c = 0; c < 10; ++c)
      for (int i = 0; i < 16; ++i) a[c][i] = (float)(c + i) * 1e-3f;
    const float m = 0.999999f, k = 1e-7f;
    for (int64_t r = 0; r < n; ++r)
      for (int c = 0; c < 10; ++c)
#pragma omp simd
        for (int i = 0; i < 16; ++i) a[c][i] = a[c][i] * m + k;
    for (int c = 0; c < 10; ++c)
      for (int i = 0; i < 16; ++i) total += a[c][i];
    lanes += 10.0 * 16.0;
  }
  const double t = omp_get_wtime() - t0;
  return total != 12345.f ? 2.0 * lanes * (double)n / t : 0.0; /* the sum keeps the chains live */
}

/* Causal attention over packed sequences, for training and scoring (dsh.llm.packing). q, k, v [H, T, D]: the heads
   of T tokens that are S sequences one after another, sequence s at rows cu[s] .. cu[s + 1] - 1; each query attends
   to the keys of its own sequence up to its own position. One task per (sequence, head), on one thread, so the sums
   never depend on the thread count. Keys (and, in the backward pass, values) are transposed within tiles of TILE
   positions (TILE scores are one vector product over D); QB queries are processed together, their sums interleaved
   so that their dependency chains overlap, and their weighted sums of a tile's values (forward) or keys (the
   backward pass's dq) advance together, key by key, each row's sum in the order of its own loop (at D = 32 in 16
   vector registers). Scores are scale * q . k. The forward pass scores a block of queries against all the keys it
   sees at once and takes each row's softmax in two passes (its maximum, then the exponentials and their sum), whole
   vectors at a time: 1.15x the running-maximum form per tile at 32 sequences of ~300 tokens and 1.42x at 8 of ~1000
   (head size 32, 4 heads, 2 threads, an Intel Xeon with AVX-512). The exponentials' loop holds no condition on the
   key (the keys a row does not see are set to its maximum before it and to 0 after it): with one, the compiler split
   the loop where the condition turns and took the last partial vector's exponentials one call at a time. That loop
   and the tile buffers on 64-byte boundaries (floats64): the forward 1.17x (1.05-1.27x) and 1.22x (1.15-1.25x) at 32
   sequences of 306 tokens (head size 32, 4 heads, the 2-core AMD Zen 4, two runs of 12 alternations in one
   process), the loop alone 1.10x (1.07-1.21x); outputs within 5e-7 of before (the sums' order moved; the backward's
   arithmetic is as before, the same bits from the same log-sum-exp). A GRPO round's update (the laptop preset, its
   fast paths, bfloat16 products) does not move with it: 1.005x (0.93-1.07x, 6 alternations), the attention's forward
   being a small part of it. The backward pass uses the forward's log-sum-exp;
   at head size 32 its keys' and values' gradient sums hold the block's rows in registers (rank_update32): 1.15-1.2x
   there, the gradients as close to a float64 computation as before (largest relative error 8e-7 against 1e-6).
   The bodies are inlined for head sizes 32 and 64 (the loops over D then run in registers) and for any other D. */
#define QB 8
#define INLINE static inline __attribute__((always_inline))
static void tiles_of(const float *restrict x, int64_t n, int64_t D, float *restrict t) {
  const int64_t nt = (n + TILE - 1) / TILE;
  for (int64_t b = 0; b < nt; ++b)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < TILE; ++j) {
        const int64_t p = b * TILE + j;
        t[(b * D + d) * TILE + j] = p < n ? x[p * D + d] : 0.f;
      }
}

/* xs[r] = scale * x_r for the QB rows x (row stride D; rows from nq on 0): the rows of tile_products, scaled once
   for all the tiles they meet. */
INLINE void scaled_rows(const float *restrict x, int64_t nq, const int64_t D, float scale, float xs[QB][D]) {
  for (int64_t r = 0; r < QB; ++r)
    for (int64_t d = 0; d < D; ++d) xs[r][d] = r < nq ? x[r * D + d] * scale : 0.f;
}

/* sc[r][j] = xs_r . t_j for the QB rows xs (scaled_rows) against one tile t ([D][TILE]). */
INLINE void tile_products(const int64_t D, const float xs[QB][D], const float *restrict t, float sc[QB][TILE]) {
  for (int64_t r = 0; r < QB; ++r)
    for (int64_t j = 0; j < TILE; ++j) sc[r][j] = 0.f;
  for (int64_t d = 0; d < D; ++d)
    for (int64_t r = 0; r < QB; ++r) {
      const float x = xs[r][d];
#pragma omp simd
      for (int64_t j = 0; j < TILE; ++j) sc[r][j] += x * t[d * TILE + j];
    }
}

/* n floats on a 64-byte boundary (a cache line, one AVX-512 vector): the tile buffers' vectors then never straddle
   two lines, as they can at malloc's 16-byte boundary. */
static float *floats64(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); }

/* The longest of the S sequences at offsets cu (at least 1): the size of each thread's tile buffers. */
static int64_t longest_of(const int64_t *cu, int64_t S) {
  int64_t longest = 1;
  for (int64_t s = 0; s < S; ++s) longest = cu[s + 1] - cu[s] > longest ? cu[s + 1] - cu[s] : longest;
  return longest;
}

/* How many keys of tile b query i0 + r may see (0 .. TILE; 0 for rows from nq on). */
INLINE void visible(int64_t i0, int64_t nq, int64_t b, int64_t valid[QB]) {
  for (int64_t r = 0; r < QB; ++r) {
    const int64_t c = i0 + r - b * TILE + 1;
    valid[r] = r < nq ? (c < 0 ? 0 : (c > TILE ? TILE : c)) : 0;
  }
}

/* dst[r * stride + j] = xs_r . t_j for the QB rows xs (scaled_rows) against one tile t ([D][TILE]). */
INLINE void tile_scores(const int64_t D, const float xs[QB][D], const float *restrict t, float *restrict dst,
                        int64_t stride) {
  float sc[QB][TILE];
  tile_products(D, xs, t, sc);
  for (int64_t r = 0; r < QB; ++r)
    for (int64_t j = 0; j < TILE; ++j) dst[r * stride + j] = sc[r][j];
}

/* acc[r] += sum_j p[r * stride + j] * rows[j] over the first nk rows, every row's sum in the order of j (a row's
   weights are 0 beyond its own keys: adding 0 * row leaves its sum as it is). */
INLINE void add_weighted(const float *restrict p, int64_t stride, const float *restrict rows, int64_t nk,
                         const int64_t D, float acc[QB][D]) {
  if (D == 32 && QB == 8) { /* the 8 x 32 sums held as 16 vectors (a loop over acc's rows keeps them in memory) */
#define LOAD(R) v16f l##R = load16_float(acc[R]), h##R = load16_float(acc[R] + 16);
    LOAD(0) LOAD(1) LOAD(2) LOAD(3) LOAD(4) LOAD(5) LOAD(6) LOAD(7)
#undef LOAD
    for (int64_t j = 0; j < nk; ++j) {
      const v16f a = load16_float(rows + j * 32), b = load16_float(rows + j * 32 + 16);
      const float *w = p + j;
#define WEIGH(R) { const float wj = w[R * stride]; l##R += wj * a, h##R += wj * b; }
      WEIGH(0) WEIGH(1) WEIGH(2) WEIGH(3) WEIGH(4) WEIGH(5) WEIGH(6) WEIGH(7)
#undef WEIGH
    }
#define KEEP(R) { __builtin_memcpy(acc[R], &l##R, 64); __builtin_memcpy(acc[R] + 16, &h##R, 64); }
    KEEP(0) KEEP(1) KEEP(2) KEEP(3) KEEP(4) KEEP(5) KEEP(6) KEEP(7)
#undef KEEP
    return;
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float *row = rows + j * D;
#pragma GCC unroll 8
    for (int64_t r = 0; r < QB; ++r) {
      const float wj = p[r * stride + j];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[r][d] += wj * row[d];
    }
  }
}

/* One (sequence, head): each block of QB queries scored against every key up to the block's last position (sc
   [QB][stride], stride >= those keys rounded up to a tile), then each row's softmax over its own keys in two passes
   (the maximum, then the exponentials and their sum, a vector of lanes at a time) and its weighted sum of the
   values. */
INLINE void forward_task(const float *restrict Q, const float *restrict K, const float *restrict V, int64_t n,
                         const int64_t D, float scale, float *restrict kt, float *restrict sc, float *restrict out,
                         int64_t ostride, float *restrict lse) {
  kt = __builtin_assume_aligned(kt, 64), sc = __builtin_assume_aligned(sc, 64); /* floats64 */
  tiles_of(K, n, D, kt);
  for (int64_t i0 = 0; i0 < n; i0 += QB) {
    const int64_t nq = n - i0 < QB ? n - i0 : QB, nt = (i0 + nq - 1) / TILE + 1, stride = nt * TILE;
    float qs[QB][D], acc[QB][D], m[QB], l[QB];
    scaled_rows(Q + i0 * D, nq, D, scale, qs);
    for (int64_t b = 0; b < nt; ++b) tile_scores(D, qs, kt + b * D * TILE, sc + b * TILE, stride);
    for (int64_t r = 0; r < QB; ++r) {
      float *s = __builtin_assume_aligned(sc + r * stride, 64), mx = -FLT_MAX, sum = 0.f; /* stride: whole tiles */
      const int64_t seen = r < nq ? i0 + r + 1 : 0;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < stride; ++j) mx = j < seen && s[j] > mx ? s[j] : mx;
      /* whole vectors, no condition inside the exponentials' loop (a loop with one is split where the condition
         turns, its last partial vector then taking expf one value at a time): a key not seen is exp(0) first (a
         finite argument, which libmvec's vector expf takes on its fast path), then 0 */
      for (int64_t j = seen; j < stride; ++j) s[j] = mx;
#pragma omp simd
      for (int64_t j = 0; j < stride; ++j) s[j] = expf(s[j] - mx);
      for (int64_t j = seen; j < stride; ++j) s[j] = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < stride; ++j) sum += s[j];
      m[r] = mx, l[r] = sum;
    }
    for (int64_t r = 0; r < QB; ++r)
      for (int64_t d = 0; d < D; ++d) acc[r][d] = 0.f;
    add_weighted(sc, stride, V, i0 + nq, D, acc);
    for (int64_t r = 0; r < nq; ++r) {
      const float inv = 1.f / l[r];
      for (int64_t d = 0; d < D; ++d) out[(i0 + r) * ostride + d] = acc[r][d] * inv;
      lse[i0 + r] = m[r] + logf(l[r]);
    }
  }
}

/* out [T, H, D]; lse [H, T]: the log-sum-exp of each query's scores (kept for the backward pass). */
void varlen_attention(const float *restrict q, const float *restrict k, const float *restrict v,
                      const int64_t *restrict cu, int64_t S, int64_t H, int64_t T, int64_t D, float scale,
                      float *restrict out, float *restrict lse) {
  const int64_t longest = longest_of(cu, S);
#pragma omp parallel
  {
    const int64_t padded = ((longest + TILE - 1) / TILE) * TILE;
    float *kt = floats64((size_t)(padded * D)), *sc = floats64((size_t)(QB * padded));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t a = cu[s], n = cu[s + 1] - cu[s], at = (h * T + a) * D;
        if (n <= 0) continue;
        float *o = out + (a * H + h) * D, *ls = lse + h * T + a;
        if (D == 32)
          forward_task(q + at, k + at, v + at, n, 32, scale, kt, sc, o, H * D, ls);
        else if (D == 64)
          forward_task(q + at, k + at, v + at, n, 64, scale, kt, sc, o, H * D, ls);
        else
          forward_task(q + at, k + at, v + at, n, D, scale, kt, sc, o, H * D, ls);
      }
    free(kt);
    free(sc);
  }
}

/* acc_j += sum_r w[r][j] * rows_r (r = 0 .. QB - 1 in order; rows from nq on taken as 0) for the first nk (a multiple
   of 4) of TILE keys, at head size 32: the QB rows in 16 vector registers, four keys' sums at a time. */
INLINE void rank_update32(const float *restrict w, const float *restrict rows, int64_t nq, float *restrict acc,
                          int64_t nk) {
  v16f lo[QB], hi[QB];
  for (int64_t r = 0; r < QB; ++r) {
    lo[r] = r < nq ? load16_float(rows + r * 32) : (v16f){0};
    hi[r] = r < nq ? load16_float(rows + r * 32 + 16) : (v16f){0};
  }
  for (int64_t j = 0; j < nk; j += 4) {
    float *a = acc + j * 32;
    v16f a0 = load16_float(a), b0 = load16_float(a + 16), a1 = load16_float(a + 32), b1 = load16_float(a + 48);
    v16f a2 = load16_float(a + 64), b2 = load16_float(a + 80), a3 = load16_float(a + 96), b3 = load16_float(a + 112);
#pragma GCC unroll 8
    for (int64_t r = 0; r < QB; ++r) {
      const float *wr = w + r * TILE + j;
      const float w0 = wr[0], w1 = wr[1], w2 = wr[2], w3 = wr[3];
      a0 += w0 * lo[r], b0 += w0 * hi[r], a1 += w1 * lo[r], b1 += w1 * hi[r];
      a2 += w2 * lo[r], b2 += w2 * hi[r], a3 += w3 * lo[r], b3 += w3 * hi[r];
    }
    __builtin_memcpy(a, &a0, 64), __builtin_memcpy(a + 16, &b0, 64), __builtin_memcpy(a + 32, &a1, 64);
    __builtin_memcpy(a + 48, &b1, 64), __builtin_memcpy(a + 64, &a2, 64), __builtin_memcpy(a + 80, &b2, 64);
    __builtin_memcpy(a + 96, &a3, 64), __builtin_memcpy(a + 112, &b3, 64);
  }
}

INLINE void backward_task(const float *restrict Q, const float *restrict K, const float *restrict V, int64_t n,
                          const int64_t D, float scale, const float *restrict dout, int64_t ostride,
                          const float *restrict lse, const float *restrict delta, float *restrict kt,
                          float *restrict vt, float *restrict dQ, float *restrict dK, float *restrict dV) {
  kt = __builtin_assume_aligned(kt, 64), vt = __builtin_assume_aligned(vt, 64); /* floats64 */
  for (int64_t x = 0; x < n * D; ++x) dK[x] = 0.f, dV[x] = 0.f;
  tiles_of(K, n, D, kt);
  tiles_of(V, n, D, vt);
  for (int64_t i0 = 0; i0 < n; i0 += QB) {
    const int64_t nq = n - i0 < QB ? n - i0 : QB;
    float sc[QB][TILE], dp[QB][TILE], p[QB][TILE], ds[QB][TILE], g[QB][D], gq[QB][D], qs[QB][D];
    int64_t valid[QB];
    for (int64_t r = 0; r < QB; ++r)
      for (int64_t d = 0; d < D; ++d) {
        g[r][d] = r < nq ? dout[(i0 + r) * ostride + d] : 0.f;
        gq[r][d] = 0.f;
      }
    scaled_rows(Q + i0 * D, nq, D, scale, qs);
    const int64_t last = (i0 + nq - 1) / TILE;
    for (int64_t b = 0; b <= last; ++b) {
      tile_products(D, qs, kt + b * D * TILE, sc);
      tile_products(D, g, vt + b * D * TILE, dp); /* g: dout's rows as they are (x * 1 = x), 0 from nq on */
      visible(i0, nq, b, valid);
      for (int64_t r = 0; r < QB; ++r) {
        const float L = r < nq ? lse[i0 + r] : 0.f, dl = r < nq ? delta[i0 + r] : 0.f;
#pragma omp simd
        for (int64_t j = 0; j < TILE; ++j) {
          const float e = expf((j < valid[r] ? sc[r][j] : L) - L);
          p[r][j] = j < valid[r] ? e : 0.f;
          ds[r][j] = p[r][j] * (dp[r][j] - dl) * scale;
        }
      }
      int64_t seen = 0;
      for (int64_t r = 0; r < QB; ++r) seen = valid[r] > seen ? valid[r] : seen;
      add_weighted(&ds[0][0], TILE, K + b * TILE * D, seen, D, gq); /* dq_r += sum_j ds_rj k_j (ds 0 beyond a row's limit) */
      const int64_t nk = n - b * TILE < TILE ? n - b * TILE : TILE;
      int64_t j0 = 0;
      if (D == 32 && QB == 8) { /* the block's rows in registers, 4 keys' sums at a time (the same order) */
        j0 = nk / 4 * 4;
        rank_update32(&ds[0][0], Q + i0 * D, nq, dK + b * TILE * D, j0);
        rank_update32(&p[0][0], &g[0][0], nq, dV + b * TILE * D, j0);
      }
      for (int64_t j = j0; j < nk; ++j) { /* dk_j += sum_r ds_rj q_r; dv_j += sum_r p_rj dout_r */
        float *dk = dK + (b * TILE + j) * D, *dv = dV + (b * TILE + j) * D, ak[D], av[D];
        for (int64_t d = 0; d < D; ++d) ak[d] = dk[d], av[d] = dv[d];
        for (int64_t r = 0; r < nq; ++r)
          for (int64_t d = 0; d < D; ++d) {
            ak[d] += ds[r][j] * Q[(i0 + r) * D + d];
            av[d] += p[r][j] * g[r][d];
          }
        for (int64_t d = 0; d < D; ++d) dk[d] = ak[d], dv[d] = av[d];
      }
    }
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t d = 0; d < D; ++d) dQ[(i0 + r) * D + d] = gq[r][d];
  }
}

/* The gradients of varlen_attention: dout [T, H, D] of out, delta [H, T] = dout . out of each query; dq, dk, dv
   [H, T, D] (written whole). With p = exp(score - lse): dv_j = sum_i p_ij dout_i, ds_ij = p_ij (dout_i . v_j -
   delta_i), dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i. */
void varlen_attention_backward(const float *restrict q, const float *restrict k, const float *restrict v,
                               const int64_t *restrict cu, int64_t S, int64_t H, int64_t T, int64_t D, float scale,
                               const float *restrict dout, const float *restrict lse, const float *restrict delta,
                               float *restrict dq, float *restrict dk, float *restrict dv) {
  const int64_t longest = longest_of(cu, S);
#pragma omp parallel
  {
    const size_t tiles = (size_t)(((longest + TILE - 1) / TILE) * TILE * D);
    float *kt = floats64(tiles), *vt = floats64(tiles);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t a = cu[s], n = cu[s + 1] - cu[s], at = (h * T + a) * D;
        if (n <= 0) continue;
        const float *g = dout + (a * H + h) * D, *ls = lse + h * T + a, *dl = delta + h * T + a;
        if (D == 32)
          backward_task(q + at, k + at, v + at, n, 32, scale, g, H * D, ls, dl, kt, vt, dq + at, dk + at, dv + at);
        else if (D == 64)
          backward_task(q + at, k + at, v + at, n, 64, scale, g, H * D, ls, dl, kt, vt, dq + at, dk + at, dv + at);
        else
          backward_task(q + at, k + at, v + at, n, D, scale, g, H * D, ls, dl, kt, vt, dq + at, dk + at, dv + at);
      }
    free(kt);
    free(vt);
  }
}

/* The packed attention with its products in bfloat16 dot products (AVX512_BF16's vdpbf16ps: pairs of bfloat16
   multiplied, summed in float32), at head size 32: GRPO's update with update_precision="bfloat16", whose linear
   layers already take bfloat16 products (dsh.llm.fused_layers). Both passes read q, k, v, dout, the probabilities
   and the score gradients rounded to bfloat16 (to the nearest, as torch rounds); the softmax is float32; the
   backward pass recomputes the forward's scores bit for bit (tile_scores_bf16); every sum in a fixed order, the same
   bits whatever the thread count. Blocks of RB = 16 queries (the float32 passes: 8), the block's rows held in
   registers as bfloat16 pairs. At 32 sequences of 306 tokens (4 heads, the 2-core AMD Zen 4): the backward 1.40x the
   float32 pass (9.9 against 13.8 ms), the forward 1.7-1.9x (4.1 against 7.2 ms); output and gradients as far from
   float64's as torch's own bfloat16 attention (tests/test_packed_attention.py). */
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
int has_attention_bf16(void) { return 1; }

/* (x_i, y_i) as bfloat16 pairs, x_i in the low half of lane i (the pair order vdpbf16ps multiplies in) */
static inline __m512i bf16_pairs(__m512 x, __m512 y) {
  static const uint16_t at[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(at), (__m512i)_mm512_cvtne2ps_pbh(y, x));
}
/* acc + a . (w, w, ...): vdpbf16ps with the pair w broadcast from memory inside the instruction ({1to16}; the
   compiler does not fold _mm512_set1_epi32 into it) */
static inline __m512 dot_bcast(__m512 acc, __m512i a, const uint32_t *w) {
  __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*w));
  return acc;
}
/* exp(x) for x <= 0: x = n ln 2 + r, |r| <= ln 2 / 2, exp(r) by Cephes' expf polynomial, times 2^n, inline (no call
   per vector). Within 1.26 ulp of exp on every float in [-87, 0] (all 1.1e9 enumerated against double precision);
   below -87 it gives exp(-87), ~1.6e-38. */
static inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}
static inline uint32_t bf16_pair(float x, float y) { return (uint32_t)float_bf16(x) | (uint32_t)float_bf16(y) << 16; }
/* the first k lanes of a tile's vector (k clamped to 0 .. TILE): the keys a row sees there */
static inline __mmask16 first_lanes(int64_t k) { return k <= 0 ? 0 : k >= TILE ? 0xFFFF : (__mmask16)((1u << k) - 1u); }

/* x's n rows [n][32] in bfloat16 pairs for vdpbf16ps, rows from n on 0, whole tiles of TILE rows:
   over the head's dimensions, dims[b][e][j] = (x_j[2e], x_j[2e + 1]) (j in tile b: sums over d, lanes over rows);
   over rows, rows[e][d] = (x_2e[d], x_2e+1[d]) (sums over rows, lanes over d). */
static void pairs_over_dims(const float *restrict x, int64_t n, uint32_t *restrict dims) {
  for (int64_t b = 0; b < (n + TILE - 1) / TILE; ++b)
    for (int64_t j = 0; j < TILE; ++j) {
      const int64_t p = b * TILE + j;
      for (int64_t e = 0; e < 16; ++e)
        dims[(b * 16 + e) * TILE + j] = p < n ? bf16_pair(x[p * 32 + 2 * e], x[p * 32 + 2 * e + 1]) : 0u;
    }
}
static void pairs_over_rows(const float *restrict x, int64_t n, uint32_t *restrict rows) {
  for (int64_t e = 0; e < (n + TILE - 1) / TILE * TILE / 2; ++e)
    for (int64_t d = 0; d < 32; ++d)
      rows[e * 32 + d] = bf16_pair(2 * e < n ? x[2 * e * 32 + d] : 0.f, 2 * e + 1 < n ? x[(2 * e + 1) * 32 + d] : 0.f);
}

#define RB 16 /* query rows per block of the bfloat16 passes */

/* sc[r] = scale (q_r . k_j) over the 16 keys j of one tile for the RB rows q (qb: each row's bfloat16 pairs), from
   the tile's key pairs kd (pairs_over_dims): the scores of both bfloat16 passes, in one order (the same bits). */
static inline __attribute__((always_inline)) void tile_scores_bf16(const uint32_t qb[RB][16],
                                                                   const uint32_t *restrict kd, float scale,
                                                                   __m512 sc[RB]) {
  for (int64_t r = 0; r < RB; ++r) sc[r] = _mm512_setzero_ps();
  for (int64_t e = 0; e < 16; ++e) {
    const __m512i kk = _mm512_loadu_si512(kd + e * TILE);
    for (int64_t r = 0; r < RB; ++r) sc[r] = dot_bcast(sc[r], kk, &qb[r][e]);
  }
  for (int64_t r = 0; r < RB; ++r) sc[r] = _mm512_mul_ps(sc[r], _mm512_set1_ps(scale));
}

/* qb[r] = the bfloat16 pairs of row r of the block's RB rows (x, stride D = 32; rows from nq on 0) */
static inline void row_pairs(const float *restrict x, int64_t stride, int64_t nq, uint32_t qb[RB][16]) {
  for (int64_t r = 0; r < RB; ++r)
    for (int h = 0; h < 2; ++h) {
      const __m512 row = r < nq ? _mm512_loadu_ps(x + r * stride + 16 * h) : _mm512_setzero_ps();
      _mm256_storeu_si256((__m256i *)qb[r] + h, (__m256i)_mm512_cvtneps_pbh(row));
    }
}

/* out_r += sum over key pairs e < ne of (w_r,2e, w_r,2e+1) . rows[e] for 8 rows r (w: each row's weights as bfloat16
   pairs, row stride ws; rows: pairs_over_rows), the 8 x 32 sums in 16 registers */
static inline __attribute__((always_inline)) void weighted_rows8(const uint32_t *restrict w, int64_t ws,
                                                                 const uint32_t *restrict rows, int64_t ne,
                                                                 __m512 a[8][2]) {
  for (int64_t e = 0; e < ne; ++e) {
    const __m512i lo = _mm512_loadu_si512(rows + e * 32), hi = _mm512_loadu_si512(rows + e * 32 + 16);
    for (int64_t r = 0; r < 8; ++r) a[r][0] = dot_bcast(a[r][0], lo, w + r * ws + e), a[r][1] = dot_bcast(a[r][1], hi, w + r * ws + e);
  }
}

/* The forward pass with bfloat16 products, one (sequence, head) at head size 32: per block of RB queries, the scores
   against every key up to the block's last (sc [RB][stride]), each row's softmax in float32 (its maximum, then
   exp(score - max) and their sum), the probabilities rounded to bfloat16 pairs (pb) for the weighted sum of the
   values. */
static void forward_task_bf16(const float *restrict Q, const float *restrict K, const float *restrict V, int64_t n,
                              float scale, uint32_t *restrict kd, uint32_t *restrict vr, float *restrict sc,
                              uint32_t *restrict pb, float *restrict out, int64_t ostride, float *restrict lse) {
  pairs_over_dims(K, n, kd);
  pairs_over_rows(V, n, vr);
  for (int64_t i0 = 0; i0 < n; i0 += RB) {
    const int64_t nq = n - i0 < RB ? n - i0 : RB, nt = (i0 + nq - 1) / TILE + 1, stride = nt * TILE;
    uint32_t qb[RB][16];
    float m[RB], l[RB];
    row_pairs(Q + i0 * 32, 32, nq, qb);
    for (int64_t b = 0; b < nt; ++b) {
      __m512 t[RB];
      tile_scores_bf16(qb, kd + b * 16 * TILE, scale, t);
      for (int64_t r = 0; r < RB; ++r) _mm512_storeu_ps(sc + r * stride + b * TILE, t[r]);
    }
    for (int64_t r = 0; r < RB; ++r) {
      const float *row = sc + r * stride;
      const int64_t seen = r < nq ? i0 + r + 1 : 0;
      __m512 mx = _mm512_set1_ps(-FLT_MAX), sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < stride; j += TILE)
        mx = _mm512_mask_max_ps(mx, first_lanes(seen - j), mx, _mm512_loadu_ps(row + j));
      const float mr = _mm512_reduce_max_ps(mx);
      for (int64_t j = 0; j < stride; j += TILE) {
        const __mmask16 on = first_lanes(seen - j);
        const __m512 e = _mm512_maskz_mov_ps(on, exp_nonpositive(_mm512_maskz_sub_ps(on, _mm512_loadu_ps(row + j),
                                                                                        _mm512_set1_ps(mr))));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256((__m256i *)(pb + r * (stride / 2) + j / 2), (__m256i)_mm512_cvtneps_pbh(e));
      }
      m[r] = mr, l[r] = _mm512_reduce_add_ps(sum);
    }
    for (int64_t r0 = 0; r0 < RB && r0 < nq; r0 += 8) {
      __m512 a[8][2];
      for (int64_t r = 0; r < 8; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
      weighted_rows8(pb + r0 * (stride / 2), stride / 2, vr, stride / 2, a);
      for (int64_t r = r0; r < r0 + 8 && r < nq; ++r) {
        const __m512 inv = _mm512_set1_ps(1.f / l[r]);
        _mm512_storeu_ps(out + (i0 + r) * ostride, _mm512_mul_ps(a[r - r0][0], inv));
        _mm512_storeu_ps(out + (i0 + r) * ostride + 16, _mm512_mul_ps(a[r - r0][1], inv));
        lse[i0 + r] = m[r] + logf(l[r]);
      }
    }
  }
}

/* varlen_attention with bfloat16 products (above); head size 32 only. */
void varlen_attention_bf16(const float *restrict q, const float *restrict k, const float *restrict v,
                           const int64_t *restrict cu, int64_t S, int64_t H, int64_t T, int64_t D, float scale,
                           float *restrict out, float *restrict lse) {
  if (D != 32) return;
  const int64_t longest = longest_of(cu, S);
#pragma omp parallel
  {
    const size_t padded = (size_t)(((longest + TILE - 1) / TILE) * TILE);
    uint32_t *kd = (uint32_t *)floats64(padded * 16), *vr = (uint32_t *)floats64(padded * 16);
    uint32_t *pb = (uint32_t *)floats64(RB * padded / 2);
    float *sc = floats64(RB * padded);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t a = cu[s], n = cu[s + 1] - cu[s], at = (h * T + a) * D;
        if (n <= 0) continue;
        forward_task_bf16(q + at, k + at, v + at, n, scale, kd, vr, sc, pb, out + (a * H + h) * D, H * D,
                          lse + h * T + a);
      }
    free(kd), free(vr), free(pb), free(sc);
  }
}

/* acc_j += sum over row pairs e of w[e][j] . rows[e] for the TILE keys j of a tile (acc [TILE][32]), four keys at a
   time: the block's RB rows as RB / 2 pairs in 16 registers. */
static inline __attribute__((always_inline)) void pair_update32(const uint32_t w[RB / 2][TILE],
                                                                const __m512i rows[RB / 2][2], float *restrict acc) {
  for (int64_t j = 0; j < TILE; j += 4) {
    float *a = acc + j * 32;
    __m512 s[4][2];
    for (int t = 0; t < 4; ++t) s[t][0] = _mm512_loadu_ps(a + t * 32), s[t][1] = _mm512_loadu_ps(a + t * 32 + 16);
    for (int e = 0; e < RB / 2; ++e)
      for (int t = 0; t < 4; ++t) {
        s[t][0] = dot_bcast(s[t][0], rows[e][0], &w[e][j + t]);
        s[t][1] = dot_bcast(s[t][1], rows[e][1], &w[e][j + t]);
      }
    for (int t = 0; t < 4; ++t) _mm512_storeu_ps(a + t * 32, s[t][0]), _mm512_storeu_ps(a + t * 32 + 16, s[t][1]);
  }
}

/* The backward pass with bfloat16 products, one (sequence, head) at head size 32, blocks of RB queries against the
   key tiles up to the block's last query: per tile the scores (tile_scores_bf16, the forward's bits), dout . v, the
   probabilities exp(score - lse) and score gradients, dk's and dv's sums (dks, dvs: float32, padded to whole
   tiles); dq's sums over the block's score gradients of every tile (dsb, pairs of keys) once its tiles are done. */
static void backward_task_bf16(const float *restrict Q, const float *restrict K, const float *restrict V, int64_t n,
                               float scale, const float *restrict dout, int64_t ostride, const float *restrict lse,
                               const float *restrict delta, uint32_t *restrict kd, uint32_t *restrict vd,
                               uint32_t *restrict kr, uint32_t *restrict dsb, float *restrict dks,
                               float *restrict dvs, float *restrict dQ, float *restrict dK, float *restrict dV) {
  enum { D = 32 };
  const int64_t nt = (n + TILE - 1) / TILE, half = nt * TILE / 2;
  for (int64_t x = 0; x < nt * TILE * D; ++x) dks[x] = 0.f, dvs[x] = 0.f;
  pairs_over_dims(K, n, kd);
  pairs_over_dims(V, n, vd);
  pairs_over_rows(K, n, kr);
  for (int64_t i0 = 0; i0 < n; i0 += RB) {
    const int64_t nq = n - i0 < RB ? n - i0 : RB, last = (i0 + nq - 1) / TILE;
    float dp[RB][TILE], p[RB][TILE], ds[RB][TILE], g[RB][D], qr[RB][D];
    __m512 sc[RB];
    uint32_t qb[RB][D / 2], gb[RB][D / 2], dsp[RB / 2][TILE], pp[RB / 2][TILE];
    __m512i qpair[RB / 2][2], gpair[RB / 2][2];
    for (int64_t r = 0; r < RB; ++r)
      for (int64_t d = 0; d < D; ++d) {
        g[r][d] = r < nq ? dout[(i0 + r) * ostride + d] : 0.f;
        qr[r][d] = r < nq ? Q[(i0 + r) * D + d] : 0.f;
      }
    row_pairs(&qr[0][0], D, RB, qb);
    row_pairs(&g[0][0], D, RB, gb);
    for (int64_t e = 0; e < RB / 2; ++e)
      for (int h = 0; h < 2; ++h) {
        qpair[e][h] = bf16_pairs(_mm512_loadu_ps(qr[2 * e] + 16 * h), _mm512_loadu_ps(qr[2 * e + 1] + 16 * h));
        gpair[e][h] = bf16_pairs(_mm512_loadu_ps(g[2 * e] + 16 * h), _mm512_loadu_ps(g[2 * e + 1] + 16 * h));
      }
    for (int64_t b = 0; b <= last; ++b) {
      tile_scores_bf16(qb, kd + b * 16 * TILE, scale, sc);
      { /* dp[r][j] = dout_r . v_j over the head's 16 pairs */
        __m512 a[RB];
        for (int64_t r = 0; r < RB; ++r) a[r] = _mm512_setzero_ps();
        for (int64_t e = 0; e < D / 2; ++e) {
          const __m512i vv = _mm512_loadu_si512(vd + (b * 16 + e) * TILE);
          for (int64_t r = 0; r < RB; ++r) a[r] = dot_bcast(a[r], vv, &gb[r][e]);
        }
        for (int64_t r = 0; r < RB; ++r) _mm512_storeu_ps(dp[r], a[r]);
      }
      for (int64_t r = 0; r < RB; ++r) { /* p = exp(score - lse) on a row's visible keys, 0 beyond; ds */
        const float L = r < nq ? lse[i0 + r] : 0.f, dl = r < nq ? delta[i0 + r] : 0.f;
        const __mmask16 on = r < nq ? first_lanes(i0 + r - b * TILE + 1) : 0;
        const __m512 pr = _mm512_maskz_mov_ps(on, exp_nonpositive(_mm512_maskz_sub_ps(on, sc[r], _mm512_set1_ps(L))));
        const __m512 dr = _mm512_mul_ps(_mm512_mul_ps(pr, _mm512_sub_ps(_mm512_loadu_ps(dp[r]), _mm512_set1_ps(dl))),
                                        _mm512_set1_ps(scale));
        _mm512_storeu_ps(p[r], pr), _mm512_storeu_ps(ds[r], dr);
        _mm256_storeu_si256((__m256i *)(dsb + r * half + b * TILE / 2), (__m256i)_mm512_cvtneps_pbh(dr));
      }
      for (int64_t e = 0; e < RB / 2; ++e) {
        _mm512_storeu_si512(dsp[e], bf16_pairs(_mm512_loadu_ps(ds[2 * e]), _mm512_loadu_ps(ds[2 * e + 1])));
        _mm512_storeu_si512(pp[e], bf16_pairs(_mm512_loadu_ps(p[2 * e]), _mm512_loadu_ps(p[2 * e + 1])));
      }
      pair_update32(dsp, qpair, dks + b * TILE * D); /* dk_j += sum_r ds_rj q_r */
      pair_update32(pp, gpair, dvs + b * TILE * D);  /* dv_j += sum_r p_rj dout_r */
    }
    for (int64_t r0 = 0; r0 < RB && r0 < nq; r0 += 8) { /* dq_r = sum_j ds_rj k_j over the block's tiles */
      __m512 a[8][2];
      for (int64_t r = 0; r < 8; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
      weighted_rows8(dsb + r0 * half, half, kr, (last + 1) * TILE / 2, a);
      for (int64_t r = r0; r < r0 + 8 && r < nq; ++r)
        _mm512_storeu_ps(dQ + (i0 + r) * D, a[r - r0][0]), _mm512_storeu_ps(dQ + (i0 + r) * D + 16, a[r - r0][1]);
    }
  }
  for (int64_t x = 0; x < n * D; ++x) dK[x] = dks[x], dV[x] = dvs[x];
}

/* varlen_attention_backward's gradients of varlen_attention_bf16, the products in bfloat16 (above); head size 32
   only. */
void varlen_attention_backward_bf16(const float *restrict q, const float *restrict k, const float *restrict v,
                                    const int64_t *restrict cu, int64_t S, int64_t H, int64_t T, int64_t D, float scale,
                                    const float *restrict dout, const float *restrict lse, const float *restrict delta,
                                    float *restrict dq, float *restrict dk, float *restrict dv) {
  if (D != 32) return;
  const int64_t longest = longest_of(cu, S);
#pragma omp parallel
  {
    const size_t padded = (size_t)(((longest + TILE - 1) / TILE) * TILE);
    float *dks = floats64(padded * 32), *dvs = floats64(padded * 32);
    uint32_t *kd = (uint32_t *)floats64(padded * 16), *vd = (uint32_t *)floats64(padded * 16);
    uint32_t *kr = (uint32_t *)floats64(padded * 16), *dsb = (uint32_t *)floats64(RB * padded / 2);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t a = cu[s], n = cu[s + 1] - cu[s], at = (h * T + a) * D;
        if (n <= 0) continue;
        backward_task_bf16(q + at, k + at, v + at, n, scale, dout + (a * H + h) * D, H * D, lse + h * T + a,
                           delta + h * T + a, kd, vd, kr, dsb, dks, dvs, dq + at, dk + at, dv + at);
      }
    free(dks), free(dvs), free(kd), free(vd), free(kr), free(dsb);
  }
}
#else
int has_attention_bf16(void) { return 0; }
void varlen_attention_bf16(const float *q, const float *k, const float *v, const int64_t *cu, int64_t S, int64_t H,
                           int64_t T, int64_t D, float scale, float *out, float *lse) {
  (void)q, (void)k, (void)v, (void)cu, (void)S, (void)H, (void)T, (void)D, (void)scale, (void)out, (void)lse;
}
void varlen_attention_backward_bf16(const float *q, const float *k, const float *v, const int64_t *cu, int64_t S,
                                    int64_t H, int64_t T, int64_t D, float scale, const float *dout, const float *lse,
                                    const float *delta, float *dq, float *dk, float *dv) {
  (void)q, (void)k, (void)v, (void)cu, (void)S, (void)H, (void)T, (void)D, (void)scale, (void)dout, (void)lse;
  (void)delta, (void)dq, (void)dk, (void)dv;
}
#endif

/* Training's element-wise layers, forward and backward (dsh.llm.fused_layers): one pass over the rows each, rows in
   parallel, every sum in one order whatever the thread count. */

/* The gradients of y = w * x * r (rms_norm_rstd) from dy [B, N]: dx = r (g - x r^2 mean(g x)) with g = w dy, and the
   weight's gradient summed over blocks of NB rows, dwp [ceil(B / NB), N] (the caller sums the blocks in order). */
void rms_norm_backward(const float *restrict x, const float *restrict w, const float *restrict rstd,
                       const float *restrict dy, float *restrict dx, float *restrict dwp, int64_t B, int64_t N,
                       int64_t NB) {
  const int64_t blocks = (B + NB - 1) / NB;
#pragma omp parallel for schedule(static) if (B * N > 32768)
  for (int64_t k = 0; k < blocks; ++k) {
    float *acc = dwp + k * N;
    for (int64_t i = 0; i < N; ++i) acc[i] = 0.f;
    const int64_t end = (k + 1) * NB < B ? (k + 1) * NB : B;
    for (int64_t b = k * NB; b < end; ++b) {
      const float *xr = x + b * N, *gr = dy + b * N, r = rstd[b];
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < N; ++i) s += gr[i] * w[i] * xr[i];
      const float c = s / (float)N * r * r;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) {
        dx[b * N + i] = r * (gr[i] * w[i] - xr[i] * c);
        acc[i] += gr[i] * (xr[i] * r);
      }
    }
  }
}

/* Row t of rope_split: its heads of row ([(H + 2 KV) D]) rotated or copied into q, k, v. */
static inline void rope_split_row(const float *restrict row, const float *restrict c, const float *restrict s,
                                  float *restrict q, float *restrict k, float *restrict v, int64_t t, int64_t T,
                                  int64_t H, int64_t KV, int64_t D) {
  for (int64_t h = 0; h < H; ++h) rope(row + h * D, c, s, q + (h * T + t) * D, D);
  for (int64_t h = 0; h < KV; ++h) {
    rope(row + (H + h) * D, c, s, k + (h * T + t) * D, D);
    for (int64_t d = 0; d < D; ++d) v[(h * T + t) * D + d] = row[(H + KV + h) * D + d];
  }
}

/* The fused projection's rows qkv [T, (H + 2 KV) D] to the packed attention's layout: q [H, T, D] and k [KV, T, D]
   rotated (rope, with each token's own tables cos, sin [T, D]), v [KV, T, D]. */
void rope_split(const float *restrict qkv, const float *restrict cos, const float *restrict sin, float *restrict q,
                float *restrict k, float *restrict v, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t W = (H + 2 * KV) * D;
#pragma omp parallel for schedule(static) if (T * W > 32768)
  for (int64_t t = 0; t < T; ++t) rope_split_row(qkv + t * W, cos + t * D, sin + t * D, q, k, v, t, T, H, KV, D);
}

/* The transpose of rope (the rotation by -angle) of one head's gradient g[D] into out. */
static inline void rope_back(const float *g, const float *cos, const float *sin, float *out, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    out[i] = g[i] * cos[i] + g[i + h] * sin[i + h];
    out[i + h] = g[i + h] * cos[i + h] - g[i] * sin[i];
  }
}

/* Row t of rope_split_backward into row ([(H + 2 KV) D]). */
static inline void rope_back_row(const float *restrict dq, const float *restrict dk, const float *restrict dv,
                                 const float *restrict c, const float *restrict s, float *restrict row, int64_t t,
                                 int64_t T, int64_t H, int64_t KV, int64_t D) {
  for (int64_t h = 0; h < H; ++h) rope_back(dq + (h * T + t) * D, c, s, row + h * D, D);
  for (int64_t h = 0; h < KV; ++h) {
    rope_back(dk + (h * T + t) * D, c, s, row + (H + h) * D, D);
    for (int64_t d = 0; d < D; ++d) row[(H + KV + h) * D + d] = dv[(h * T + t) * D + d];
  }
}

/* The gradient of rope_split: dq [H, T, D], dk, dv [KV, T, D] -> dqkv [T, (H + 2 KV) D]. */
void rope_split_backward(const float *restrict dq, const float *restrict dk, const float *restrict dv,
                         const float *restrict cos, const float *restrict sin, float *restrict dqkv, int64_t T,
                         int64_t H, int64_t KV, int64_t D) {
  const int64_t W = (H + 2 * KV) * D;
#pragma omp parallel for schedule(static) if (T * W > 32768)
  for (int64_t t = 0; t < T; ++t) rope_back_row(dq, dk, dv, cos + t * D, sin + t * D, dqkv + t * W, t, T, H, KV, D);
}

/* rope_split of bfloat16 rows (the q/k/v product of GRPO's update in bfloat16): each row widened, then as
   rope_split; its gradient as rope_split_backward, each row rounded to bfloat16. The same bits as the float32 calls
   with a conversion each side. */
void rope_split_bf16(const uint16_t *restrict qkv, const float *restrict cos, const float *restrict sin,
                     float *restrict q, float *restrict k, float *restrict v, int64_t T, int64_t H, int64_t KV,
                     int64_t D) {
  const int64_t W = (H + 2 * KV) * D;
#pragma omp parallel for schedule(static) if (T * W > 32768)
  for (int64_t t = 0; t < T; ++t) {
    float row[W];
    for (int64_t i = 0; i < W; ++i) row[i] = bf16_float(qkv[t * W + i]);
    rope_split_row(row, cos + t * D, sin + t * D, q, k, v, t, T, H, KV, D);
  }
}

void rope_split_bf16_backward(const float *restrict dq, const float *restrict dk, const float *restrict dv,
                              const float *restrict cos, const float *restrict sin, uint16_t *restrict dqkv,
                              int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t W = (H + 2 * KV) * D;
#pragma omp parallel for schedule(static) if (T * W > 32768)
  for (int64_t t = 0; t < T; ++t) {
    float row[W];
    rope_back_row(dq, dk, dv, cos + t * D, sin + t * D, row, t, T, H, KV, D);
    for (int64_t i = 0; i < W; ++i) dqkv[t * W + i] = float_bf16(row[i]);
  }
}

/* The gradient of silu_mul: da [B, F] of out -> dgu [B, 2F]: d gate = da u s (1 + g (1 - s)), d up = da g s, with
   s = sigmoid(g); of silu_mul_bf16 on bfloat16 rows, the same arithmetic on the widened values, each result rounded
   to bfloat16. */
#define DEFINE_SILU_MUL_BACKWARD(NAME, T, LOAD, STORE) \
  void NAME(const T *restrict gu, const T *restrict da, T *restrict dgu, int64_t B, int64_t F) { \
    _Pragma("omp parallel for schedule(static) if (B * F > 32768)") \
    for (int64_t b = 0; b < B; ++b) { \
      const T *g = gu + b * 2 * F, *u = g + F, *a = da + b * F; \
      T *dg = dgu + b * 2 * F, *du = dg + F; \
      _Pragma("omp simd") \
      for (int64_t i = 0; i < F; ++i) { \
        const float x = LOAD(g[i]), y = LOAD(u[i]), ai = LOAD(a[i]); \
        const float s = 1.f / (1.f + expf(-x)); \
        du[i] = STORE(ai * x * s); \
        dg[i] = STORE(ai * y * s * (1.f + x * (1.f - s))); \
      } \
    } \
  }
DEFINE_SILU_MUL_BACKWARD(silu_mul_backward, float, same_float, same_float)
DEFINE_SILU_MUL_BACKWARD(silu_mul_bf16_backward, uint16_t, bf16_float, float_bf16)
