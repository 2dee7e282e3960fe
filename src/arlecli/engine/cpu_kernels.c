/* arle's CPU kernels for x86-64 with AVX2 and FMA, built and loaded by engine/cpu_gemm.py: the fp32
   linear (engine/cpu_gemm.py runs it) and, at the end, the small per-layer ops around it (RMSNorm with
   its residual add, rotary embedding: engine/cpu_ops.py).

   The linear: y = x . W^T + bias, with W packed once into panels of 16 output columns
   (p[n / 16][k][16]).
   Why: a decode step is linears of 1-64 rows that stream every weight from memory, and on one core
   oneDNN's kernel leaves the FMA units idle while the weights arrive (perf/README.md). This one keeps
   twelve 8-wide sums in registers: up to 3 rows x 2 panels from 4 rows on, and for 1-3 rows 6, 3 or
   2 panels at once, so that a lone row still has independent chains and several streams from memory.
   Each panel comes from memory once per call (later row blocks find it in cache), and a lone panel
   asks for the next one while it computes.

   Its numbers: each output is one fused multiply-add chain over k in order, restarted every
   `kblock` k's, the restarted chains' sums added left to right, then the bias: the order of oneDNN's
   kernels (kblock 1024 on AVX2; 512 or 1024 by shape on AVX-512), so the results are oneDNN's bit
   for bit. cpu_gemm.py finds the kblock for each shape by checking against oneDNN before using it
   and keeps oneDNN where none agrees. A row's result never depends on the other rows or the thread
   count: rows, panels and threads only choose which chain runs when. */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/mman.h>

/* Ask for 2 MB pages over [p, p + bytes) (p 2 MB-aligned, nothing there touched yet): fewer TLB
   misses while a panel streams. Only advice: the kernel may say no, which changes nothing else. */
void arle_advise_huge(void *p, long bytes) {
#ifdef MADV_HUGEPAGE
  madvise(p, (size_t)bytes & ~(size_t)((1 << 21) - 1), MADV_HUGEPAGE);
#else
  (void)p; (void)bytes;
#endif
}

/* w[n][k] (row-major, n a multiple of 16) into p[n / 16][k][16]. */
void arle_pack(const float *w, float *p, long n, long k) {
  for (long n0 = 0; n0 < n; n0 += 16)
    for (long kk = 0; kk < k; kk++)
      for (long j = 0; j < 16; j++)
        p[n0 * k + kk * 16 + j] = w[(n0 + j) * k + kk];
}

/* R rows (1-6) x P panels (R * P <= 6: twelve accumulators) over k0..k1; `first`: the chain starts
   this call's sum, `bias`: this is the last chain (add it), `ahead`: a panel to ask the memory for
   meanwhile. Few rows take several panels at once: one panel's chains alone would leave the FMA units
   waiting on each other and the memory on one stream. */
static inline __attribute__((always_inline)) void block(const int R, const int P, const float *x, long ldx,
    long k0, long k1, const float *panel, long stride, float *y, long ldy, int first, const float *bias,
    const float *ahead) {
  __m256 c[6][6][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; r++)
#pragma GCC unroll 6
    for (int q = 0; q < P; q++) c[r][q][0] = c[r][q][1] = _mm256_setzero_ps();
  for (long kk = k0; kk < k1; kk++) {
    if (ahead) _mm_prefetch((const char *)(ahead + kk * 16), _MM_HINT_T1); /* one line a k: the whole next panel */
#pragma GCC unroll 6
    for (int q = 0; q < P; q++) {
      __m256 w0 = _mm256_load_ps(panel + q * stride + kk * 16), w1 = _mm256_load_ps(panel + q * stride + kk * 16 + 8);
#pragma GCC unroll 6
      for (int r = 0; r < R; r++) {
        __m256 b = _mm256_broadcast_ss(x + r * ldx + kk);
        c[r][q][0] = _mm256_fmadd_ps(b, w0, c[r][q][0]);
        c[r][q][1] = _mm256_fmadd_ps(b, w1, c[r][q][1]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; r++)
#pragma GCC unroll 6
    for (int q = 0; q < P; q++)
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        float *o = y + r * ldy + q * 16 + h * 8;
        __m256 v = c[r][q][h];
        if (!first) v = _mm256_add_ps(_mm256_loadu_ps(o), v);
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + q * 16 + h * 8));
        _mm256_storeu_ps(o, v);
      }
}

#define SHAPE(R, P) static void block_##R##x##P(const float *x, long ldx, long k0, long k1, const float *panel, \
    long stride, float *y, long ldy, int first, const float *bias, const float *ahead) { \
  block(R, P, x, ldx, k0, k1, panel, stride, y, ldy, first, bias, ahead); }
SHAPE(1, 6) SHAPE(2, 3) SHAPE(3, 2) SHAPE(1, 2) SHAPE(2, 2)
SHAPE(1, 1) SHAPE(2, 1) SHAPE(3, 1) SHAPE(4, 1) SHAPE(5, 1) SHAPE(6, 1)

/* The same chains on a CPU with AVX-512 (the caller says so: `wide`), a panel one 16-wide register:
   up to 24 sums in its 32 registers, 6 rows x 4 panels from 4 rows on, 2 x 6 and 3 x 4 for 2 and 3
   rows. Each output's chain is the one above, so the bits are too. Why: on a Zen 4 EPYC these are
   1.1-1.6x the 8-wide blocks (and oneDNN's) at 2-64 rows; one row streams faster 8-wide. */
#define WIDE __attribute__((target("avx512f")))
static inline __attribute__((always_inline)) WIDE void wide_block(const int R, const int P, const float *x, long ldx,
    long k0, long k1, const float *panel, long stride, float *y, long ldy, int first, const float *bias,
    const float *ahead) {
  __m512 c[8][6];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 6
    for (int q = 0; q < P; q++) c[r][q] = _mm512_setzero_ps();
  for (long kk = k0; kk < k1; kk++) {
    if (ahead) _mm_prefetch((const char *)(ahead + kk * 16), _MM_HINT_T1);
    __m512 w[6];
#pragma GCC unroll 6
    for (int q = 0; q < P; q++) w[q] = _mm512_load_ps(panel + q * stride + kk * 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m512 b = _mm512_set1_ps(x[r * ldx + kk]);
#pragma GCC unroll 6
      for (int q = 0; q < P; q++) c[r][q] = _mm512_fmadd_ps(b, w[q], c[r][q]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 6
    for (int q = 0; q < P; q++) {
      float *o = y + r * ldy + q * 16;
      __m512 v = c[r][q];
      if (!first) v = _mm512_add_ps(_mm512_loadu_ps(o), v);
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + q * 16));
      _mm512_storeu_ps(o, v);
    }
}

#define WIDE_SHAPE(R, P) static WIDE void wide_##R##x##P(const float *x, long ldx, long k0, long k1, \
    const float *panel, long stride, float *y, long ldy, int first, const float *bias, const float *ahead) { \
  wide_block(R, P, x, ldx, k0, k1, panel, stride, y, ldy, first, bias, ahead); }
WIDE_SHAPE(2, 6) WIDE_SHAPE(3, 4) WIDE_SHAPE(1, 4) WIDE_SHAPE(2, 4) WIDE_SHAPE(4, 4) WIDE_SHAPE(5, 4) WIDE_SHAPE(6, 4)
WIDE_SHAPE(1, 1) WIDE_SHAPE(2, 1) WIDE_SHAPE(3, 1) WIDE_SHAPE(4, 1) WIDE_SHAPE(5, 1) WIDE_SHAPE(6, 1)
WIDE_SHAPE(7, 1) WIDE_SHAPE(8, 1)

typedef void (*block_fn)(const float *, long, long, long, const float *, long, float *, long, int, const float *,
                         const float *);
/* One register width's blocks: for a lone panel (1 to `lone_most` rows), for a call of 1-3 rows (all
   its rows over `few_width[m]` panels), and for a call of 4+ (up to `most` rows over `width` panels). */
typedef struct {
  block_fn one_panel[9], few_rows[4], many_rows[7];
  long few_width[4], width, most, lone_most;
} blocks_t;
static const blocks_t narrow = {
    {0, block_1x1, block_2x1, block_3x1, block_4x1, block_5x1, block_6x1},
    {0, block_1x6, block_2x3, block_3x2},
    {0, block_1x2, block_2x2, block_3x2},
    {0, 6, 3, 2}, 2, 3, 6};
static const blocks_t wide = {
    {0, wide_1x1, wide_2x1, wide_3x1, wide_4x1, wide_5x1, wide_6x1, wide_7x1, wide_8x1},
    {0, 0, wide_2x6, wide_3x4},
    {0, wide_1x4, wide_2x4, wide_3x4, wide_4x4, wide_5x4, wide_6x4},
    {0, 0, 6, 4}, 4, 6, 8};

typedef struct {
  const float *x, *p, *bias;
  float *y;
  long m, n, k, kblock, panel0, panel1;
  const blocks_t *blocks;
} job_t;

static void run(const job_t *j) {
  long k = j->k, n = j->n, stride = 16 * k;
  const blocks_t *set = j->blocks;
  /* Rows in groups whose slice of x stays in the core's L2 (~256 KB) while the panels pass. */
  long group = (65536 / (k > 0 ? k : 1)) / 6 * 6;
  if (group < 6) group = 6;
  /* Panels at once: for 1-3 rows all the rows in one block over few_width[m] panels; from 4 rows,
     blocks of up to `most` rows over `width` panels (8-wide: 3 x 2 beat 6 x 1 at every row count
     measured, by up to 20% at 4-15 rows); a panel left over alone takes blocks of up to lone_most. */
  long width = j->m <= 3 ? set->few_width[j->m] : set->width;
  for (long m0 = 0; m0 < j->m; m0 += group) {
    long m1 = m0 + group < j->m ? m0 + group : j->m;
    long w;
    for (long pn = j->panel0; pn < j->panel1; pn += w) {
      w = pn + width <= j->panel1 ? width : 1;
      const float *panel = j->p + pn * stride;
      /* (several panels at once stream well on the CPU's own prefetchers: asking for the next
         ones too was 5-15% slower there) */
      const float *ahead = w == 1 && pn + w < j->panel1 ? panel + w * stride : 0;
      const float *bias = j->bias ? j->bias + pn * 16 : 0;
      const block_fn *kernels = w == 1 ? set->one_panel : j->m <= 3 ? set->few_rows : set->many_rows;
      long most = w == 1 ? set->lone_most : j->m <= 3 ? 3 : set->most;
      for (long k0 = 0; k0 < k; k0 += j->kblock) {
        long k1 = k0 + j->kblock < k ? k0 + j->kblock : k;
        /* As few row blocks as hold the rows, as even as can be: a pass over the panels costs
           about as much for a block a row short of full (the chains' latency), so 16 rows on one
           panel go 6+5+5, not 6+6+4, and 13 go 5+4+4, not 6+6+1. */
        long blocks = (m1 - m0 + most - 1) / most, r0 = m0;
        for (long b = 0; b < blocks; b++) {
          long rows = (m1 - m0) / blocks + (b < (m1 - m0) % blocks);
          kernels[rows](j->x + r0 * k, k, k0, k1, panel, stride, j->y + r0 * n + pn * 16, n, k0 == 0,
                        k1 == k ? bias : 0, b == 0 ? ahead : 0);
          r0 += rows;
        }
      }
    }
  }
}

static void *run_thread(void *arg) { run((const job_t *)arg); return 0; }

/* y[m, n] = x[m, k] . W^T + bias (bias may be NULL); n a multiple of 16, p from arle_pack; `wide`:
   the CPU has AVX-512F (its blocks from 2 rows on). Splits the column panels over `threads` threads
   (the caller is one of them). */
void arle_linear(const float *x, const float *p, const float *bias, float *y, long m, long n, long k, long kblock,
                int threads, int wide_ok) {
  long panels = n / 16;
  if (kblock <= 0) kblock = k;
  if (threads > 16) threads = 16;
  if (threads > panels) threads = (int)panels;
  if (threads < 1 || m * n * k < (1L << 21)) threads = 1; /* a thread's start costs more than such a call */
  const blocks_t *set = wide_ok && m > 1 ? &wide : &narrow;
  job_t jobs[16];
  pthread_t tids[16];
  int started[16] = {0};
  for (int t = 0; t < threads; t++)
    jobs[t] = (job_t){x, p, bias, y, m, n, k, kblock, panels * t / threads, panels * (t + 1) / threads, set};
  for (int t = 1; t < threads; t++) started[t] = pthread_create(&tids[t], 0, run_thread, &jobs[t]) == 0;
  run(&jobs[0]);
  for (int t = 1; t < threads; t++) {
    if (started[t]) pthread_join(tids[t], 0);
    else run(&jobs[t]); /* no thread to be had: the caller does its share */
  }
}

/* ---- The small per-layer ops of a decode step, in torch's order (engine/cpu_ops.py checks the bits
   against torch's before using them). Why: at one row each is a few microseconds of work behind
   ~20 us of torch's op dispatch, ~60 of them a step (perf/README.md). ---- */

/* The sum of squares of x[0..n) as torch's CPU float `x.pow(2).sum(-1)` adds it (SumKernel.cpp:
   cascade_sum's vectorized inner sum, 8-wide on AVX-512 CPUs too: torch runs its AVX2 build there,
   the same bits under ATEN_CPU_CAPABILITY avx2, avx512 and default): 8-wide vectors taken four at a
   time into four accumulators, which cascade up four levels every 2^power steps; then the leftover
   vectors, the four accumulators left to right, the leftover scalars and the eight lanes left to
   right. Needs n >= 8. */
static float sum_of_squares(const float *x, long n) {
  long vectors = n / 8, quads = vectors / 4;
  int power = 0;
  while ((1L << power) < quads) power++;
  power = power / 4 > 4 ? power / 4 : 4;
  const long step = 1L << power, mask = step - 1;
  __m256 acc[4][4];
  for (int l = 0; l < 4; l++)
    for (int q = 0; q < 4; q++) acc[l][q] = _mm256_setzero_ps();
  long i = 0;
  while (i + step <= quads) {
    for (long j = 0; j < step; j++, i++)
      for (int q = 0; q < 4; q++) {
        __m256 v = _mm256_loadu_ps(x + (i * 4 + q) * 8);
        acc[0][q] = _mm256_add_ps(acc[0][q], _mm256_mul_ps(v, v));
      }
    for (int l = 1; l < 4; l++) {
      for (int q = 0; q < 4; q++) {
        acc[l][q] = _mm256_add_ps(acc[l][q], acc[l - 1][q]);
        acc[l - 1][q] = _mm256_setzero_ps();
      }
      if (i & (mask << (l * power))) break;
    }
  }
  for (; i < quads; i++)
    for (int q = 0; q < 4; q++) {
      __m256 v = _mm256_loadu_ps(x + (i * 4 + q) * 8);
      acc[0][q] = _mm256_add_ps(acc[0][q], _mm256_mul_ps(v, v));
    }
  for (int l = 1; l < 4; l++)
    for (int q = 0; q < 4; q++) acc[0][q] = _mm256_add_ps(acc[0][q], acc[l][q]);
  for (long r = quads * 4; r < vectors; r++) {
    __m256 v = _mm256_loadu_ps(x + r * 8);
    acc[0][0] = _mm256_add_ps(acc[0][0], _mm256_mul_ps(v, v));
  }
  for (int q = 1; q < 4; q++) acc[0][0] = _mm256_add_ps(acc[0][0], acc[0][q]);
  float lanes[8], sum = 0.f;
  _mm256_storeu_ps(lanes, acc[0][0]);
  for (long r = vectors * 8; r < n; r++) sum += x[r] * x[r];
  for (int l = 0; l < 8; l++) sum += lanes[l];
  return sum;
}

/* Per row of x[rows][n]: (if delta) x += delta, written to `sum` (the residual stream); then
   y = w * (x * (1 / sqrt(mean(x^2) + eps))), each step rounded as transformers' RMSNorm rounds it
   (mean: the sum divided by n; an fp32 weight, or none). */
void arle_rms_norm(const float *x, const float *delta, float *sum, const float *w, float eps, float *y, long rows,
                   long n) {
  for (long r = 0; r < rows; r++) {
    const float *row = x + r * n;
    if (delta) {
      float *out = sum + r * n;
      const float *d = delta + r * n;
      for (long c = 0; c < n; c++) out[c] = row[c] + d[c];
      row = out;
    }
    float root = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(sum_of_squares(row, n) / (float)n + eps)));
    float inverse = 1.f / root;
    float *yr = y + r * n;
    if (w)
      for (long c = 0; c < n; c++) yr[c] = w[c] * (row[c] * inverse);
    else
      for (long c = 0; c < n; c++) yr[c] = row[c] * inverse;
  }
}

/* Rotary embedding of the q and k heads of qkv[batch][width][heads + 2 kv][d] (one packed q, k, v
   projection): q[b][h][t][:] = x * cos + rotate_half(x) * sin with cos, sin [batch][width][d], into
   q[batch][heads][width][d] and k[batch][kv][width][d], each product and the sum rounded on its own
   as transformers' `apply_rotary_pos_emb` rounds them. */
void arle_rotary(const float *qkv, const float *cos, const float *sin, float *q, float *k, long batch, long width,
                 long heads, long kv, long d) {
  const long half = d / 2, all = heads + 2 * kv;
  for (long b = 0; b < batch; b++)
    for (long t = 0; t < width; t++) {
      const float *c = cos + (b * width + t) * d, *s = sin + (b * width + t) * d;
      for (long h = 0; h < heads + kv; h++) {
        const float *x = qkv + ((b * width + t) * all + h) * d;
        float *o = h < heads ? q + ((b * heads + h) * width + t) * d : k + ((b * kv + h - heads) * width + t) * d;
        for (long j = 0; j < half; j++) o[j] = x[j] * c[j] + -x[j + half] * s[j];
        for (long j = half; j < d; j++) o[j] = x[j] * c[j] + x[j - half] * s[j];
      }
    }
}
