/* arle's fp32 linear for x86-64 CPUs with AVX2 and FMA: y = x . W^T + bias, with W packed once
   into panels of 16 output columns (p[n / 16][k][16]). engine/cpu_gemm.py builds and loads it.

   Why: a decode step is linears of 1-64 rows that stream every weight from memory, and on one core
   oneDNN's kernel leaves the FMA units idle while the weights arrive (perf/README.md). This one keeps
   twelve 8-wide sums in registers: up to 3 rows x 2 panels from 4 rows on, and for 1-3 rows 6, 3 or
   2 panels at once, so that a lone row still has independent chains and several streams from memory.
   Each panel comes from memory once per call (later row blocks find it in cache), and a lone panel
   asks for the next one while it computes.

   Its numbers: each output is one fused multiply-add chain over k in order, restarted every
   `kblock` k's, the restarted chains' sums added left to right, then the bias: the order of oneDNN's
   AVX2 kernel (kblock 1024), so the results are oneDNN's bit for bit. cpu_gemm.py checks that on
   each shape before using it and keeps oneDNN where they differ. A row's result never depends on
   the other rows or the thread count: rows, panels and threads only choose which chain runs when. */
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
typedef void (*block_fn)(const float *, long, long, long, const float *, long, float *, long, int, const float *,
                         const float *);
static const block_fn one_panel[7] = {0, block_1x1, block_2x1, block_3x1, block_4x1, block_5x1, block_6x1};
static const block_fn few_rows[4] = {0, block_1x6, block_2x3, block_3x2};  /* a call of 1-3 rows */
static const block_fn two_panels[4] = {0, block_1x2, block_2x2, block_3x2};  /* a block of a call of 4+ */

typedef struct {
  const float *x, *p, *bias;
  float *y;
  long m, n, k, kblock, panel0, panel1;
} job_t;

static void run(const job_t *j) {
  long k = j->k, n = j->n, stride = 16 * k;
  /* Rows in groups whose slice of x stays in the core's L2 (~256 KB) while the panels pass. */
  long group = (65536 / (k > 0 ? k : 1)) / 6 * 6;
  if (group < 6) group = 6;
  /* Panels at once: for 1-3 rows all the rows in one block over 6/m panels; from 4 rows, blocks of
     up to 3 rows over 2 panels (3 x 2 beat 6 x 1 at every row count measured, by up to 20% at 4-15
     rows); a panel left over alone takes blocks of up to 6 rows. */
  long width = j->m <= 3 ? 6 / j->m : 2;
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
      const block_fn *kernels = w == 1 ? one_panel : j->m <= 3 ? few_rows : two_panels;
      long most = w == 1 ? 6 : 3;
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

/* y[m, n] = x[m, k] . W^T + bias (bias may be NULL); n a multiple of 16, p from arle_pack. Splits
   the column panels over `threads` threads (the caller is one of them). */
void arle_linear(const float *x, const float *p, const float *bias, float *y, long m, long n, long k, long kblock,
                int threads) {
  long panels = n / 16;
  if (kblock <= 0) kblock = k;
  if (threads > 16) threads = 16;
  if (threads > panels) threads = (int)panels;
  if (threads < 1 || m * n * k < (1L << 21)) threads = 1; /* a thread's start costs more than such a call */
  job_t jobs[16];
  pthread_t tids[16];
  int started[16] = {0};
  for (int t = 0; t < threads; t++)
    jobs[t] = (job_t){x, p, bias, y, m, n, k, kblock, panels * t / threads, panels * (t + 1) / threads};
  for (int t = 1; t < threads; t++) started[t] = pthread_create(&tids[t], 0, run_thread, &jobs[t]) == 0;
  run(&jobs[0]);
  for (int t = 1; t < threads; t++) {
    if (started[t]) pthread_join(tids[t], 0);
    else run(&jobs[t]); /* no thread to be had: the caller does its share */
  }
}
